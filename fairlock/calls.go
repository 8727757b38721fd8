package fairlock

import (
	"time"

	"github.com/fairlock/fairlock/owner"
)

// A key's calls, one key at a time: what Locker.Calls and
// Semaphore.Calls report, and keylock's in-process listing reads.

// KeyCall is one call on a key as Locker.Calls and Semaphore.Calls
// report it: a holder, or a queued call.
type KeyCall struct {
	// Owner is the call's owner (owner.Of of its context; after a
	// HandOff, the new owner).
	Owner owner.ID
	// Label is the owner's label: as the call recorded it
	// (owner.LabelOf, with WithDebug), else owner.ID.Label, which is
	// empty once no context carrying the flow is reachable.
	Label string
	// Mode is what the call holds or asks for, in the debug registry's
	// names: "exclusive", "shared", "units" or "wait".
	Mode string
	// Units is a Semaphore call's units; 0 for a Locker.
	Units int64
	// Held: the call holds the key. Holders come first, in grant order.
	Held bool
	// Token is a holder's fencing token (Guard.Token); 0 for a waiter.
	Token uint64
	// Since is when a holder was granted, or a waiter queued, on this
	// process's clock; zero unless the Locker reads the clock (WithDebug
	// or WithObserver).
	Since time.Time
}

// calls returns key's holders in grant order, then its waiters in queue
// order. It takes key's shard mutex once and allocates the slice; owners'
// labels that the calls did not record are looked up after the mutex is
// released.
func (t *table[K]) calls(key K) []KeyCall {
	s, tag := t.shardOf(key)
	s.lock()
	e := s.find(key, tag)
	if e == nil {
		s.unlock()
		return nil
	}
	v := view[K]{e}
	out := make([]KeyCall, 0, v.holding()+v.waiting())
	for h := range v.holders() {
		c := KeyCall{Owner: h.owner, Mode: t.mode(h.units, false), Held: true, Token: h.token}
		if t.kind == semaphoreKind {
			c.Units = h.units
		}
		if h.info != nil {
			c.Label, c.Since = h.info.label, h.info.since
		}
		out = append(out, c)
	}
	for r := range v.waiters() {
		c := KeyCall{Owner: r.owner, Label: r.label, Mode: t.mode(r.units, r.turn), Since: r.now}
		if t.kind == semaphoreKind {
			c.Units = r.units
		}
		out = append(out, c)
	}
	s.unlock()
	for i := range out {
		if out[i].Label == "" {
			out[i].Label = out[i].Owner.Label()
		}
	}
	return out
}
