package redislock

import (
	"strings"

	"github.com/fairlock/fairlock/keylock"
)

// MarkerKey returns the Redis key of the marker of the session of the
// Locker or Semaphore that granted l on its key.
func MarkerKey(prefix string, l keylock.Lease) string {
	g := l.(*Guard)
	c := &core{esc: escape(prefix)}
	return c.namesOf(g.key).markers + g.c.sid
}

// Member returns the entry of the grant l in its key's queue.
func Member(l keylock.Lease) string { return l.(*Guard).member }

// MarkerOf returns the Redis key of the session marker of the entry
// member on key under prefix.
func MarkerOf(prefix, key, member string) string {
	c := &core{esc: escape(prefix)}
	sid, _, _ := strings.Cut(member, "|")
	return c.namesOf(key).markers + sid
}
