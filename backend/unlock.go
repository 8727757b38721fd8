package backend

import (
	"context"
	"time"

	"github.com/fairlock/fairlock/ctxerr"
	"github.com/fairlock/fairlock/owner"
)

// A grant's methods: what its holder reads (Token, Lost, Deadline), the
// hand-off of the grant to another flow, and Unlock, which releases it.
// A backend's Guard forwards its keylock.Lease methods here.

// Token returns the grant's fencing token: larger than every earlier
// grant's of its key (Engine.Enqueue). A nil Call's token is 0.
func (c *Call) Token() uint64 {
	if c == nil {
		return 0
	}
	return c.token
}

// Lost returns a channel that is closed when the grant is lost while it
// is held: its session ended (expired on the server, or not renewed for
// its TTL: its deadline passed), its entry was removed by someone else,
// or Close ended it. Unlock does not close it. A nil Call's is nil.
func (c *Call) Lost() <-chan struct{} {
	if c == nil {
		return nil
	}
	return c.lost
}

// Deadline returns the instant, on this process's monotonic clock, before
// which no other call can be granted the key even if this process stops
// now: the deadline of the grant's session (see Session). It only moves
// forward while the grant is held; the Locker closes Lost when it passes.
// After Unlock began, or once the grant was lost, it is the instant that
// happened: in the past. A nil Call's is the zero Time.
func (c *Call) Deadline() time.Time {
	if c == nil || c.core == nil {
		return time.Time{}
	}
	k := c.core
	k.mu.Lock()
	defer k.mu.Unlock()
	if !c.ended.IsZero() {
		return c.ended
	}
	if c.session == nil {
		return time.Time{}
	}
	return c.session.deadline
}

// HandOff makes the grant to's from now on, as fairlock.Guard.HandOff
// does in process: the old owner's next call on the key waits for the
// grant's release instead of failing with ErrReentrant, to's returns
// ErrReentrant, and debug output shows to. It returns false, changing
// nothing, for a grant released or lost, for owner 0, and for an owner
// with a call queued on the key in this Locker (it would wait for
// itself). It takes the Core's mutex and allocates nothing.
func (c *Call) HandOff(to owner.ID) bool {
	if c == nil || c.core == nil || to == 0 {
		return false
	}
	k := c.core
	k.mu.Lock()
	defer k.mu.Unlock()
	if c.state != held || c.releasing || c.lostClosed || c.mode == Turn {
		return false
	}
	for _, o := range k.keys[c.key] {
		if o.owner == to && o.state == queued {
			return false
		}
	}
	c.owner = to
	c.label = to.Label() // to's flow, while the caller has its context
	return true
}

// Unlock releases the grant: the engine's Release removes its entry (and
// only it, even if retried late) and grants the calls it was blocking. It
// is one round trip, made with ctx; a nil ctx means context.Background.
// Unlock returns when ctx ends even if the round trip goes on; the
// janitor then makes sure the entry goes.
//
// Unlock is idempotent: a second Unlock does nothing and returns nil,
// whoever holds the key by then. It returns a *fairlock.LockError with Op
// "Unlock" wrapping fairlock.ErrLost if the grant was lost before Unlock
// removed its entry (Lost is then closed). If the release fails (ctx
// ends, the engine is unreachable) it returns an error wrapping that
// failure, and the Locker keeps removing the entry in the background
// until it succeeds (Close makes a last try); if the grant had been lost
// before Unlock began, or its session ended while Unlock ran, the error
// wraps both ErrLost and the failure. Either way the grant is released.
func (c *Call) Unlock(ctx context.Context) error {
	if c == nil || c.core == nil {
		return nil
	}
	if ctx == nil {
		ctx = context.Background()
	}
	// Take the turn without a look at ctx first: a select with a done ctx
	// picks a ready case at random, and an Unlock with a done ctx must
	// still release (its round trip then fails and goes to the janitor).
	// Only an Unlock racing another Unlock of the grant waits here.
	select {
	case c.sem <- struct{}{}:
	default:
		select {
		case c.sem <- struct{}{}:
		case <-ctx.Done():
			return lockError("Unlock", c.key, c.ownerOf(), ctxerr.Of(ctx))
		}
	}
	defer func() { <-c.sem }()
	k := c.core
	k.mu.Lock()
	if c.state != held {
		k.doubles++
		k.mu.Unlock()
		return nil
	}
	lostBefore := c.lostClosed
	c.releasing = true
	if c.ended.IsZero() {
		c.ended = time.Now()
	}
	id := c.owner
	k.mu.Unlock()

	var err error
	gone := false
	select {
	case <-k.closed:
		gone = true // Close ended the session and lost the grant
	default:
		var removed bool
		var rerr error // removed, rerr: written by the goroutine, read only once it returned
		if k.within(ctx, func() { removed, rerr = k.engine.Release(ctx, c) }) {
			err = rerr
		} else {
			err = ctxerr.Of(ctx) // the round trip may still run: the janitor makes sure
		}
		if err != nil {
			k.mu.Lock()
			e := c.entry()
			k.mu.Unlock()
			k.Cleanup(e, false)
		} else {
			gone = !removed
		}
	}
	now := time.Now()
	k.mu.Lock()
	// A failed release says nothing about the entry; the grant was lost if
	// Lost was closed before Unlock began or its session ended since. (A
	// release that succeeded found the entry current.)
	lostToo := err != nil && (lostBefore || (c.session != nil && c.session.ended))
	if lostToo {
		gone = true
	}
	k.retireLocked(c)
	k.forgetLocked(c)
	c.state = released
	k.grants--
	if gone {
		k.closeLostLocked(c, now)
	}
	hold := now.Sub(c.grantedAt)
	k.signalIdle()
	k.mu.Unlock()
	k.reportLost()
	if k.obs != nil {
		k.obsMu.RLock()
		if !k.obsGone {
			k.obs.Release(hold)
		}
		k.obsMu.RUnlock()
	}
	switch {
	case lostToo:
		return lockError("Unlock", c.key, id, lostError(callError(ctx, err)))
	case err != nil:
		return lockError("Unlock", c.key, id, callError(ctx, err))
	case lostBefore || gone:
		return lockError("Unlock", c.key, id, errLost)
	}
	return nil
}

// ownerOf reads c's owner under the Core's mutex.
func (c *Call) ownerOf() owner.ID {
	c.core.mu.Lock()
	defer c.core.mu.Unlock()
	return c.owner
}
