package elect

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
)

// Term is one candidate's leadership: from the grant that Campaign
// returned it for until Resign, the grant's loss, or its Deadline,
// whichever comes first. Its methods are safe for concurrent use.
//
// A term's states: leading, from Campaign's return until its context
// ends; ended, once it has (the cause says why: ErrResigned, a loss
// wrapping fairlock.ErrLost, or the end of Run's context); released, once
// the grant is known to be gone from the Locker (Resign returned nil, or
// the grant was lost). The context ends before the grant is released,
// never after: the leader's work is told to stop before the next
// candidate can be granted the key.
type Term struct {
	e      *Election
	lease  keylock.Lease
	value  string
	since  time.Time
	ctx    *termCtx
	cancel context.CancelCauseFunc

	mu       sync.Mutex // held by Resign: one release at a time
	tried    bool       // guarded by mu: Resign has called Unlock
	released bool       // guarded by mu: the grant is known to be gone
}

// Context returns the term's context: it ends when leadership ends, at
// Resign, when the grant's Lost closes, and at its Deadline at the latest
// (a timer); for a term of Run, also when Run's context ends. Its Err
// checks the Deadline against the clock itself (keylock.Valid): after a
// pause past the deadline, Err is not nil at the first check, even before
// the timer's goroutine has run. context.Cause of it says why it ended:
// ErrResigned, an error wrapping fairlock.ErrLost for a loss or a passed
// deadline, or the cause of Run's context. It carries the values of the
// Campaign's context, and the candidate's flow (owner.FromContext): a
// lock taken with it is the candidate's.
func (t *Term) Context() context.Context { return t.ctx }

// Done is Context().Done().
func (t *Term) Done() <-chan struct{} { return t.ctx.Done() }

// Valid reports whether the term still leads right now: its context has
// not ended, and keylock.Valid holds for its grant (Lost not closed,
// Deadline ahead on this process's clock). Call it right before an action
// that must not run without leadership, and fence the action with Token
// where the store can: a pause between Valid and the action is only
// caught by the store. It allocates nothing.
func (t *Term) Valid() bool { return t.ctx.Err() == nil }

// Token returns the term's fencing token: the grant's (Lease.Token),
// larger than every earlier term's of the election.
func (t *Term) Token() uint64 { return t.lease.Token() }

// Value returns the value the candidate campaigned with.
func (t *Term) Value() string { return t.value }

// Since returns when the term began: when Campaign saw the grant, on
// this process's clock.
func (t *Term) Since() time.Time { return t.since }

// Lease returns the grant the term is: for a backend's own fencing (a
// type assertion to etcdlock's *Guard gives IsOwner, to pglock's Fence).
// Unlock it only through Resign.
func (t *Term) Lease() keylock.Lease { return t.lease }

// Resign ends the term and hands the key to the next candidate: it ends
// the term's context first (cause ErrResigned), then releases the grant
// (Lease.Unlock with ctx: one round trip; a nil ctx means
// context.Background). It returns nil once the grant is gone, or if it
// had been lost before (someone else may lead already). If the release
// fails (ctx ends first, the engine is unreachable), it returns an error
// wrapping the failure; the Locker goes on releasing the grant in the
// background (etcdlock's and redislock's retry every second until it
// succeeds), and Resign may be called again: a retry reads the key's
// calls (keylock.Lister) and returns nil once the grant is no longer
// among them, or an error while it is (or the read's). Over a Locker that
// cannot list, a retry returns nil: the Locker's own retries are all
// there is. Once Resign has returned nil, it returns nil. Concurrent
// Resigns take turns.
func (t *Term) Resign(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	t.end(fmt.Errorf("elect: %q: %w", t.e.key, ErrResigned))
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.released {
		return nil
	}
	if !t.tried {
		t.tried = true
		err := t.lease.Unlock(ctx)
		if err == nil || errors.Is(err, fairlock.ErrLost) {
			t.released = true
			t.e.wake()
			return nil
		}
		return fmt.Errorf("elect: resigning on %q (value %q, token %d): %w; the Locker goes on releasing the grant, and Resign may be called again",
			t.e.key, t.value, t.Token(), err)
	}
	if t.e.ls == nil {
		t.released = true
		return nil
	}
	calls, err := t.e.ls.Calls(ctx, t.e.key)
	if err != nil {
		return fmt.Errorf("elect: resigning on %q: reading the key's calls: %w", t.e.key, err)
	}
	for _, c := range calls {
		if c.Held && c.Token == t.Token() {
			return fmt.Errorf("elect: resigning on %q (value %q, token %d): the grant is still held on the engine; the Locker goes on releasing it", t.e.key, t.value, t.Token())
		}
	}
	t.released = true
	t.e.wake()
	return nil
}

// end ends the term's context with cause (the first cause wins) and takes
// the term out of its Election's terms in progress.
func (t *Term) end(cause error) {
	t.cancel(cause)
	t.e.ended(t)
}

// lost is the cause of a term that ended by a loss of its grant.
func (t *Term) lost(why string) error {
	return fmt.Errorf("elect: %q: leadership ended: %s: %w", t.e.key, why, fairlock.ErrLost)
}

// watch ends the term when its grant's Lost closes or its Deadline
// passes, whichever is first, and returns when the term has ended. The
// timer is set to the Deadline and set again each time a renewal has
// moved it forward; a zero Deadline (an in-process grant) needs none.
func (t *Term) watch() {
	var timer *time.Timer
	var fire <-chan time.Time
	if d := t.lease.Deadline(); !d.IsZero() {
		timer = time.NewTimer(time.Until(d))
		defer timer.Stop()
		fire = timer.C
	}
	for {
		select {
		case <-t.lease.Lost():
			t.end(t.lost("its grant was lost"))
			return
		case <-fire:
			if d := t.lease.Deadline(); keylock.Valid(t.lease) {
				timer.Reset(time.Until(d))
				continue
			}
			t.end(t.lost("its grant's deadline passed"))
			return
		case <-t.ctx.Context.Done():
			t.e.ended(t)
			return
		}
	}
}

// termCtx is a term's context: its cancelable context, with an Err that
// checks the grant's deadline against the clock (so that a process
// resumed after a pause sees the term ended at its first check, before
// the timer in watch has had a chance to run). Done, Value and Deadline
// are the embedded context's; context.Cause finds the cause through it.
type termCtx struct {
	context.Context
	t *Term
}

// Err returns the embedded context's error, after ending the term if its
// grant is no longer certain (keylock.Valid).
func (c *termCtx) Err() error {
	if err := c.Context.Err(); err != nil {
		return err
	}
	if !keylock.Valid(c.t.lease) {
		c.t.end(c.t.lost("its grant's deadline passed or it was lost"))
		return c.Context.Err()
	}
	return nil
}

// String names the context for debugging, as package context's do.
func (c *termCtx) String() string {
	return fmt.Sprintf("elect.Term(%q, token %d)", c.t.e.key, c.t.Token())
}
