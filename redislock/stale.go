package redislock

import (
	"strconv"
	"strings"
)

// Entries that came back. A restore (an RDB snapshot, an append-only
// file that lost its last writes) or a failover to a replica that had
// not received the latest scripts can bring back an entry its Locker
// released or gave up on, with the session's marker, which the Locker
// renews while it has other calls on the key. The session renewal
// (session.go, renewScript in scripts.go) removes such an entry from the
// head of the queue: it sends the entries the Locker knows and a cutoff,
// computed here, below which every entry of this Locker's that it does
// not send is one no call waits for.

// staleCutoff is the highest entry number (the seq field of an entry,
// newMember) that a renewal of a key may remove when it does not list it:
// c.seq now, unless an enqueue on the key is still in flight, then below
// the first of those. An entry is numbered and named in one hold of the
// Core's mutex (Enqueue, engine.go), so every entry numbered at or below
// c.seq is either named or no longer waited for by its call (released,
// lost, cancelled, abandoned to the janitor). The renewal lists the
// entries whose enqueue returned; those whose enqueue is still in flight
// it cannot list (they may be on the server before the renewal runs, or
// after), so the cutoff stays below them. Renew computes it under the
// Core's mutex, in the pass that lists the members: start from
// e.seq.Load() and lower it with inFlight for every named, unconfirmed
// call on the key.
func inFlight(cut uint64, member string) uint64 {
	if n, ok := entrySeq(member); ok && n <= cut {
		return n - 1
	}
	return cut
}

// entrySeq returns the seq field of an entry "sid|seq|mode|w|n".
func entrySeq(member string) (uint64, bool) {
	_, rest, _ := strings.Cut(member, "|")
	seq, _, _ := strings.Cut(rest, "|")
	n, err := strconv.ParseUint(seq, 36, 64)
	return n, err == nil
}
