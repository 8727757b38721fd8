package backend

import (
	"context"
	"errors"
	"time"

	"github.com/fairlock/fairlock/ctxerr"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
)

// A call's life, from the local checks (begin) through the engine's
// write and the wait for the grant to the end of the call (finish). The
// grant's release is Unlock, in unlock.go.

// errRequeue is run's internal signal that a queued call's entry is gone
// (its session expired, or someone removed it) and it must queue again.
var errRequeue = errors.New("backend: queue again")

// Acquire runs one call that asks for key: op names it in errors ("Lock",
// "RLock", "Wait", "Acquire", their Try forms), mode is what it asks for
// and w its units (1 outside a Semaphore; Acquire checks 1 ≤ w ≤ Size),
// try makes it a Try form. It returns the granted Call, which is the
// grant (nil for a Turn, which holds nothing), or a *fairlock.LockError
// naming op, the key and the owner of ctx (owner.Of) and wrapping:
//   - the context's error if ctx is done before the grant, even when the
//     key is free; the call's entry is then removed on a detached context
//     bounded by CleanupTimeout (if the engine does not answer within
//     it, the janitor goes on);
//   - fairlock.ErrReentrant at once if the owner holds key in any mode
//     through this Locker (checked in this process, without a round
//     trip; another Locker or process is another owner);
//   - fairlock.ErrClosed if the Locker is closed, or closes while the
//     call waits;
//   - fairlock.ErrWouldBlock for a Try form that would wait;
//   - fairlock.ErrInvalidWeight for w out of range or a semaphore of
//     another size (SizeError);
//   - the engine's error if its write fails.
//
// If the call's entry is lost while it waits (its session expired, or
// someone removed it), it queues again, at the back, at once. The
// Observer hears of every call but a Turn.
func (k *Core) Acquire(ctx context.Context, op string, key string, mode Mode, w int64, try bool) (*Call, error) {
	if ctx == nil {
		panic(k.pkg + ": " + op + " with a nil context")
	}
	id := owner.Of(ctx)
	if mode == Units && (w < 1 || w > k.size) {
		err := invalidWeight(w, k.size)
		k.report(err, 0, true)
		return nil, lockError(op, key, id, err)
	}
	c, err := k.begin(ctx, key, id, mode, w, try)
	if err == nil {
		err = k.run(ctx, c)
	}
	if c != nil {
		k.finish(c, err)
	}
	var waited time.Duration
	if c != nil && !try {
		waited = time.Since(c.since)
	}
	k.report(err, waited, mode != Turn)
	if err != nil {
		return nil, lockError(op, key, id, err)
	}
	if mode == Turn {
		return nil, nil
	}
	return c, nil
}

// begin checks a call against local state and records it: a done ctx, a
// closed Locker and a reentrant owner fail at once.
func (k *Core) begin(ctx context.Context, key string, id owner.ID, mode Mode, w int64, try bool) (*Call, error) {
	if ctx.Err() != nil {
		return nil, ctxerr.Of(ctx)
	}
	label := owner.LabelOf(ctx) // ctx.Value: the caller's code, so before k.mu
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closing.Err() != nil {
		return nil, errClosed
	}
	for _, o := range k.keys[key] {
		if o.owner == id && o.state == held {
			k.reentry++
			return nil, fairlock.ErrReentrant
		}
	}
	c := &Call{
		core: k, key: key, owner: id, label: label, mode: mode, w: w, try: try, since: time.Now(),
		lost: make(chan struct{}), sem: make(chan struct{}, 1), wake: make(chan struct{}, 1),
	}
	k.keys[key] = append(k.keys[key], c)
	k.calls++
	return c, nil
}

// finish ends a call: a failed call, or a Turn, is forgotten; a Turn
// that queued and got its turn has its entry removed in the background
// (the janitor), so that it returns at once (those behind it were
// granted with it).
func (k *Core) finish(c *Call, err error) {
	if err == nil && c.turnDone.Load() {
		return // GrantTurnsLocked or EndTurnLocked ended it
	}
	k.mu.Lock()
	k.calls--
	var e Entry
	remove := false
	if err == nil && c.mode == Turn && c.state == held {
		e, remove = c.entry(), true
		k.retireLocked(c)
		c.state = released
		k.grants--
	}
	if err != nil || c.mode == Turn {
		k.forgetLocked(c)
	}
	k.signalIdle()
	k.mu.Unlock()
	if remove {
		// Those behind the Turn were granted with it; its entry goes in
		// the janitor's next sweep, with the other finished Turns' of its
		// key in one round trip where the engine can (BatchRemover).
		k.Cleanup(e, false)
	}
}

// run queues the call in the engine and waits for its turn: it returns
// nil once c holds the key (a Turn on a free key returns nil with nothing
// written), or the error the call fails with, having removed its entry.
func (k *Core) run(ctx context.Context, c *Call) error {
	for {
		r, err := k.enqueue(ctx, c)
		if err != nil {
			k.mu.Lock()
			if c.id != "" && k.ids[c.id] == c {
				delete(k.ids, c.id)
			}
			k.mu.Unlock()
			return err
		}
		k.mu.Lock()
		if r.Free {
			if k.ids[c.id] == c {
				delete(k.ids, c.id)
			}
			k.mu.Unlock()
			return nil
		}
		if s := r.Session; s == nil || s.ended || (r.Renewed && time.Since(r.Sent) >= k.ttl-margin(k.ttl)) {
			// The reply came later than the session's deadline (or its
			// session ended meanwhile): the entry may have been purged,
			// so neither the reply's grant nor a notice of it can be
			// trusted. Queue again.
			e := c.entry()
			e.Token = r.Token
			if k.ids[c.id] == c {
				delete(k.ids, c.id)
			}
			k.mu.Unlock()
			k.Cleanup(e, false)
			continue
		}
		c.token = r.Token
		c.session = r.Session
		c.confirmed = true
		c.counted = true
		r.Session.calls++
		if r.Renewed {
			r.Session.extend(r.Sent, 0)
		}
		// A Turn is granted by the reply, by a notice naming its entry,
		// or by a bound (GrantTurnsLocked) that came before the reply.
		c.granted = c.granted || r.Granted || (c.mode == Turn && r.Token < c.turnBound)
		var gate <-chan struct{}
		if k.watcher != nil {
			if gate = k.watcher.WatchLocked(c); gate != nil {
				c.refresh = true
			}
		}
		k.mu.Unlock()
		err = k.wait(ctx, c, gate)
		if err != errRequeue {
			return err
		}
	}
}

// wait waits until c holds the key. It returns nil with c held,
// errRequeue if c's entry was lost, or the call's error once c's entry is
// removed. gate, if not nil, is closed when the engine can be asked to
// Refresh c.
func (k *Core) wait(ctx context.Context, c *Call, gate <-chan struct{}) error {
	retry := NewBackoff()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	var pause <-chan time.Time // the backoff before a Refresh is tried again
	for {
		if c.turnDone.Load() {
			return nil // a Turn that GrantTurnsLocked or EndTurnLocked ended
		}
		k.mu.Lock()
		if c.turnDone.Load() {
			// GrantTurnsLocked or EndTurnLocked ended it after the check
			// above (its books are closed: a grant taken here would never
			// be released).
			k.mu.Unlock()
			return nil
		}
		if s := c.session; c.granted && !c.gone && s != nil && !s.deadline.IsZero() && !time.Now().Before(s.deadline) {
			// Past its session's deadline the entry may have been purged:
			// the grant is not handed out (the session is about to end).
			c.gone = true
		}
		switch {
		case c.gone:
			k.mu.Unlock()
			return k.requeue(c)
		case c.granted:
			c.state = held
			c.grantedAt = time.Now()
			k.grants++
			k.mu.Unlock()
			return nil
		}
		refresh := gate == nil && pause == nil && c.refresh
		if refresh {
			c.refresh = false
		}
		k.mu.Unlock()
		if refresh {
			g, err := k.watcher.Refresh(ctx, c)
			switch {
			case err == nil:
				retry.Reset()
				if gate = g; gate != nil {
					k.mu.Lock()
					c.refresh = true
					k.mu.Unlock()
				}
				continue
			case errors.Is(err, ErrGone):
				return k.requeue(c)
			case ctx.Err() != nil:
				return k.cancel(c, ctxerr.Of(ctx))
			case k.closing.Err() != nil:
				return k.cancel(c, errClosed)
			case isFinal(err):
				return k.cancel(c, errors.Unwrap(err))
			}
			k.logger.Warn(k.pkg+": reading a queue failed; retrying", "locker", k.name, "key", LogKey(c.key), "error", err)
			k.mu.Lock()
			c.refresh = true
			k.mu.Unlock()
			if timer == nil {
				timer = time.NewTimer(retry.Next())
			} else {
				timer.Reset(retry.Next())
			}
			pause = timer.C
		}
		select {
		case <-c.wake:
		case <-gate:
			gate = nil
		case <-pause:
			pause = nil
		case <-ctx.Done():
			return k.cancel(c, ctxerr.Of(ctx))
		case <-k.closing.Done():
			return k.cancel(c, errClosed)
		}
	}
}

// requeue retires c's lost entry before the call queues again; the
// janitor removes it if it is still there.
func (k *Core) requeue(c *Call) error {
	k.mu.Lock()
	if c.turnDone.Load() {
		k.mu.Unlock()
		return nil // its turn came meanwhile (GrantTurnsLocked, EndTurnLocked)
	}
	e := c.entry()
	k.retireLocked(c)
	c.gone, c.granted, c.refresh = false, false, false
	k.mu.Unlock()
	k.Cleanup(e, false)
	return errRequeue
}

// cancel takes c out of the queue: it removes c's entry on a detached
// context and returns err. If c's turn came meanwhile, the removal hands
// the key to the next call: the grant is never lost.
func (k *Core) cancel(c *Call, err error) error {
	k.mu.Lock()
	if c.turnDone.Load() {
		// Its turn came first (GrantTurnsLocked or EndTurnLocked ended
		// it): a Wait that returns nil.
		k.mu.Unlock()
		return nil
	}
	e := c.entry()
	k.retireLocked(c)
	c.state = released
	k.mu.Unlock()
	// The entry goes before the call returns (the engine holds nothing of
	// the Locker once every call has returned and every grant is
	// released), on a context of its own bounded by CleanupTimeout: with
	// the engine down a cancelled call returns after that bound, not at
	// its ctx's end.
	k.remove(e)
	return err
}
