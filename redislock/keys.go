package redislock

import (
	"strconv"
	"strings"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/keylock"
)

// The key layout. A Locker (or Semaphore) with prefix P keeps, for a lock
// key k, six kinds of Redis keys, all with the hash tag {E(P)/E(k)} so
// that they share one hash slot (one script may touch them all, on a
// Redis Cluster too) while different lock keys spread over the slots:
//
//	{E(P)/E(k)}q       the queue: a sorted set, one entry per call but Waits (scripts.go)
//	{E(P)/E(k)}w       the Waits: a sorted set, one entry per Wait, scored as the queue
//	{E(P)/E(k)}n       the fencing counter: the last token handed out for k
//	{E(P)/E(k)}s:<sid> the marker of session sid on k, with the TTL; its value is the Locker's process
//	{E(P)/E(k)}l       the labels: a hash, entry → its call's label, for labelled calls only
//	{E(P)/E(k)}f       the change log: a stream of the holders after each change, while k is followed (feed.go)
//
// E percent-encodes '%', '/', '{' and '}' and nothing else, so the tag is
// the whole {…} (Redis hashes what lies between the first '{' and the
// next '}'), and no two (P, k) pairs share a tag: "a" and "a/b" are
// {P/a} and {P/a%2Fb}. Grants are announced on the channel {E(P)}grants,
// one per prefix.
//
// Every one of them goes once the key is idle, so that the server's
// memory follows the keys in use, not every key ever locked. The queue
// comes and goes with the calls (Redis deletes an empty sorted set). A
// label goes with its entry, whichever script removes it, and the hash
// with its last label. The set of Waits goes with its last Wait: a Wait
// is removed by the script that announces its turn (scripts.go), or by
// its Locker when it is cancelled. A marker is set with the TTL by its session's enqueue, renewed
// while the session has calls on the key, and deleted by the script that
// leaves the queue and the Waits empty; the marker of a session whose last call left while
// others were queued expires with its TTL. The counter is set by each
// enqueue with an expiry of ten TTLs (the enqueuing Locker's), so it
// expires once no call has queued on the key for that long. Tokens do not
// need it to keep growing: the enqueue takes every token at or above the
// server's clock in microseconds (scripts.go), so after a counter
// expired, or a restore or a failover took it back to an older value,
// tokens go on above every token handed out before as long as the
// server's clock (the new primary's, after a failover) reads later than
// it did when those were handed out: a clock that steps back by less
// than the time since is harmless, and an expired counter's key has been
// idle for ten TTLs at least. The change log exists only while someone
// follows the key: a Follow creates it and renews its expiry (twice the
// follower's TTL) every third of the TTL, so it expires once nobody has
// followed the key for that long.

// escape percent-encodes '%', '/', '{' and '}'.
func escape(s string) string { return backend.Escape(s, "/{}") }

// QueueKey returns the Redis key of the queue of key under prefix: a
// sorted set with one member per call holding or queued, in arrival
// order (ZRANGE shows it; ZCARD counts the calls), but Waits, which are
// kept in a sorted set of their own beside it (the same name with a last
// letter "w" for "q"). It is for tools, tests and demos that look at the
// queues directly; the members' format is described in the package's
// scripts and may change.
func QueueKey(prefix, key string) string {
	return "{" + escape(prefix) + "/" + escape(key) + "}q"
}

// names are the Redis keys of one lock key.
type names struct {
	queue, waits, counter, markers string // markers: the prefix of the session markers
}

// namesOf returns the Redis keys of key under a prefix P, given
// esc = escape(P) (core.esc).
func namesOf(esc, key string) names {
	tag := "{" + esc + "/" + escape(key) + "}"
	return names{queue: tag + "q", waits: tag + "w", counter: tag + "n", markers: tag + "s:"}
}

// procValue is the value of a Locker's markers: its process.
func procValue(p keylock.Process) string {
	return p.Host + ":" + strconv.Itoa(p.PID) + " " + strconv.Quote(p.Locker)
}

// parseProc reads a marker's value (procValue); what it cannot read
// stays empty.
func parseProc(v string) keylock.Process {
	var p keylock.Process
	hp, name, _ := strings.Cut(v, " ")
	if i := strings.LastIndexByte(hp, ':'); i >= 0 {
		p.Host = hp[:i]
		p.PID, _ = strconv.Atoi(hp[i+1:])
	}
	p.Locker, _ = strconv.Unquote(name)
	return p
}
