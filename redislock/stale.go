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

// staleCutoffLocked returns the highest entry number (the seq field of
// an entry, newMember) that a renewal of ks's key, whose list of entries
// is taken in the same hold of c.mu, may remove when it does not list
// it. An entry is numbered and recorded in c.entries in one hold of c.mu
// (run, acquire.go), so every entry numbered at or below c.seq now is
// either recorded or no longer waited for by its call (released, lost,
// cancelled, abandoned to the janitor). The renewal lists the entries
// whose enqueue returned; those whose enqueue is still in flight it cannot
// list (they may be on the server before the renewal runs, or after), so
// the cutoff stays below the first of them. c.mu is held.
func (c *core) staleCutoffLocked(ks *keyState) uint64 {
	cut := c.seq.Load()
	for _, g := range ks.guards {
		if g.confirmed || g.member == "" || c.entries[g.member] != g {
			continue
		}
		if n, ok := entrySeq(g.member); ok && n <= cut {
			cut = n - 1
		}
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

// renewArgs returns the renewal script's arguments (renewScript) for a
// key whose names are n: the cutoff, then the entries the Locker knows.
func (c *core) renewArgs(n names, cutoff uint64, members []string) []any {
	args := make([]any, 0, 4+len(members))
	args = append(args, n.markers, c.channel, c.ttlMs, strconv.FormatUint(cutoff, 10))
	for _, m := range members {
		args = append(args, m)
	}
	return args
}
