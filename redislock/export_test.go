package redislock

import (
	"strings"

	"github.com/fairlock/fairlock/keylock"
)

// MarkerKey returns the Redis key of the marker of the session of the
// Locker or Semaphore that granted l on its key.
func MarkerKey(prefix string, l keylock.Lease) string {
	g := l.(*Guard)
	return MarkerOf(prefix, g.Key(), Member(l))
}

// Member returns the entry of the grant l in its key's queue.
func Member(l keylock.Lease) string { return l.(*Guard).call().ID() }

// MarkerOf returns the Redis key of the session marker of the entry
// member on key under prefix.
func MarkerOf(prefix, key, member string) string {
	sid, _, _ := strings.Cut(member, "|")
	return namesOf(escape(prefix), key).markers + sid
}

// WaitsKey returns the Redis key of the Waits queued on key under
// prefix (keys.go): a sorted set beside the queue (QueueKey).
func WaitsKey(prefix, key string) string {
	return namesOf(escape(prefix), key).waits
}
