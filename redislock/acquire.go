package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/redislock/internal/ctxerr"
)

// A call's life: the Locker's and Semaphore's calls on keys (Lock,
// TryLock, RLock, TryRLock, Wait, Acquire, TryAcquire), from the local
// checks (begin) through the enqueueing script and the wait for the
// grant to the end of the call (finish). The grant's release is Unlock,
// in guard.go.

// errRequeue is run's internal signal that a queued call's entry is gone
// (its session on the key expired, or someone removed it) and it must
// queue again.
var errRequeue = errors.New("redislock: queue again")

// Lock locks key for the owner of ctx (owner.Of) and returns the Guard
// that unlocks it. If the key is held or has queued calls, in this
// process or any other on the same prefix, Lock queues behind them and
// blocks until every call that queued before it has been granted and
// released, or has left the queue; it never overtakes.
//
// Lock returns a nil Lease and an error (a *fairlock.LockError naming the
// key and owner) wrapping:
//   - the context's error if ctx is done before the lock is granted, even
//     when the key is free; the caller then holds nothing and its entry
//     has been removed, on a detached context bounded by 5 s (if Redis
//     does not answer within it, the call returns and the entry is
//     removed in the background: see Guard.Unlock);
//   - fairlock.ErrReentrant at once if the owner already holds key through
//     this Locker (checked locally, without a round trip; another Locker or
//     process is another owner);
//   - fairlock.ErrClosed if the Locker is closed, or closes while Lock
//     waits;
//   - Redis's error if the enqueueing script fails.
//
// If the call's entry is lost while it waits (its session on the key
// expired, or someone removed it), Lock queues again, at the back. An
// uncontended Lock is one round trip; a queued one is granted by the
// notice of the release that made it the head, without another.
func (l *Locker) Lock(ctx context.Context, key string) (keylock.Lease, error) {
	return lease(l.c.acquire(ctx, "Lock", modeExclusive, 1, false, key))
}

// TryLock locks key if nothing holds it and nothing is queued on it, in
// any process: it never overtakes a queued call, even one whose holder
// has just released. Otherwise it returns an error wrapping
// fairlock.ErrWouldBlock and writes nothing. It fails like Lock on a done
// ctx, a reentrant owner, a closed Locker or a Redis error. It is one
// round trip.
func (l *Locker) TryLock(ctx context.Context, key string) (keylock.Lease, error) {
	return lease(l.c.acquire(ctx, "TryLock", modeExclusive, 1, true, key))
}

// RLock takes a shared hold of key: granted once every call ahead of it
// in key's queue is an RLock, whatever process made it (task-fair: a
// reader behind a queued Lock waits for it). It fails like Lock.
func (l *Locker) RLock(ctx context.Context, key string) (keylock.Lease, error) {
	return lease(l.c.acquire(ctx, "RLock", modeShared, 1, false, key))
}

// TryRLock takes a shared hold of key if it would be granted at once:
// every call in key's queue is a granted RLock. Otherwise it returns an
// error wrapping fairlock.ErrWouldBlock and writes nothing. It fails like
// TryLock.
func (l *Locker) TryRLock(ctx context.Context, key string) (keylock.Lease, error) {
	return lease(l.c.acquire(ctx, "TryRLock", modeShared, 1, true, key))
}

// Wait waits for its turn on key and returns holding nothing: it queues
// like a Lock (calls that come later queue behind it) and returns nil
// once every grant of the key that was held or queued before it has been
// released, removing its entry then so that those behind it go on. A key
// that is free returns at once, with one round trip and nothing written.
// It fails like Lock. Wait is not reported to the Observer.
func (l *Locker) Wait(ctx context.Context, key string) error {
	_, err := l.c.acquire(ctx, "Wait", modeWait, 1, false, key)
	return err
}

// Acquire takes w units of key, head-of-line FIFO: granted once the units
// of every call ahead of it in key's queue plus w fit in the semaphore's
// n; a large call at the head blocks smaller ones behind it. It returns
// an error wrapping fairlock.ErrInvalidWeight at once if w < 1 or w > n,
// or if key's queue holds a call of a semaphore of another size; else it
// fails like Locker.Lock (ErrReentrant if the owner holds units of key
// through this Semaphore).
func (s *Semaphore) Acquire(ctx context.Context, key string, w int64) (keylock.Lease, error) {
	return s.acquire(ctx, "Acquire", key, w, false)
}

// TryAcquire takes w units of key if they would be granted at once: every
// call in key's queue is granted and their units plus w fit. Otherwise it
// returns an error wrapping fairlock.ErrWouldBlock and writes nothing. It
// fails like Acquire.
func (s *Semaphore) TryAcquire(ctx context.Context, key string, w int64) (keylock.Lease, error) {
	return s.acquire(ctx, "TryAcquire", key, w, true)
}

func (s *Semaphore) acquire(ctx context.Context, op, key string, w int64, try bool) (keylock.Lease, error) {
	if ctx == nil {
		panic("redislock: " + op + " with a nil context")
	}
	if w < 1 || w > s.c.units {
		err := lockError(op, key, owner.Of(ctx), invalidWeight(w, s.c.units, 0))
		s.c.report(err, 0, true)
		return nil, err
	}
	return lease(s.c.acquire(ctx, op, modeUnits, w, try, key))
}

// lease turns a call's result into a keylock.Lease: a nil interface on
// failure, never a typed nil inside one.
func lease(g *Guard, err error) (keylock.Lease, error) {
	if err != nil || g == nil {
		return nil, err
	}
	return g, nil
}

// acquire runs one call.
func (c *core) acquire(ctx context.Context, op string, mode byte, w int64, try bool, key string) (*Guard, error) {
	if ctx == nil {
		panic("redislock: " + op + " with a nil context")
	}
	id := owner.Of(ctx)
	g, err := c.begin(ctx, key, id, mode, w)
	if err == nil {
		err = c.run(ctx, g, try)
	}
	if g != nil {
		c.finish(g, err)
	}
	var waited time.Duration
	if g != nil && !try {
		waited = time.Since(g.since)
	}
	c.report(err, waited, mode != modeWait)
	if err != nil {
		return nil, lockError(op, key, id, err)
	}
	if mode == modeWait {
		return nil, nil
	}
	return g, nil
}

// report tells the Observer a call's result.
func (c *core) report(err error, waited time.Duration, acquires bool) {
	if c.obs == nil || !acquires {
		return
	}
	c.obsMu.RLock()
	if !c.obsGone {
		c.obs.Acquire(resultOf(err), waited)
	}
	c.obsMu.RUnlock()
}

// begin checks a call against local state and records it: a done ctx, a
// closed Locker and a reentrant owner fail at once.
func (c *core) begin(ctx context.Context, key string, id owner.ID, mode byte, w int64) (*Guard, error) {
	if ctx.Err() != nil {
		return nil, ctxerr.Of(ctx)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.isClosed {
		return nil, errClosed
	}
	ks := c.keys[key]
	if ks != nil {
		for _, o := range ks.guards {
			if o.owner == id && o.state == held {
				c.reentry++
				return nil, fairlock.ErrReentrant
			}
		}
	} else {
		ks = &keyState{}
		c.keys[key] = ks
	}
	g := &Guard{
		c: c, key: key, owner: id, mode: mode, w: w, since: time.Now(),
		lost: make(chan struct{}), sem: make(chan struct{}, 1), wake: make(chan struct{}, 1),
	}
	ks.guards = append(ks.guards, g)
	c.calls++
	return g, nil
}

// finish ends a call: a failed call, or a Wait, forgets its Guard; a Wait
// that queued and got its turn removes its entry.
func (c *core) finish(g *Guard, err error) {
	c.mu.Lock()
	c.calls--
	remove := false
	if err == nil && g.mode == modeWait && g.state == held {
		delete(c.entries, g.member)
		g.state = released
		c.held--
		remove = true
	}
	if err != nil || g.mode == modeWait {
		c.forgetLocked(g)
	}
	c.signalIdle()
	c.mu.Unlock()
	if remove {
		c.remove(g.key, g.member)
	}
}

// newMember returns a fresh entry for a call of g: "sid|seq|mode|w|n".
func (c *core) newMember(g *Guard) string {
	b := make([]byte, 0, len(c.sid)+40)
	b = append(b, c.sid...)
	b = append(b, '|')
	b = strconv.AppendUint(b, c.seq.Add(1), 36)
	b = append(b, '|', g.mode, '|')
	b = strconv.AppendInt(b, g.w, 10)
	b = append(b, '|')
	b = strconv.AppendInt(b, c.units, 10)
	return string(b)
}

// run queues the call in Redis and waits for its turn: it returns nil
// once g holds the key (a Wait on a free key returns nil with nothing
// written), or the error the call fails with, having removed its entry.
func (c *core) run(ctx context.Context, g *Guard, try bool) error {
	kind := "l"
	switch {
	case try:
		kind = "t"
	case g.mode == modeWait:
		kind = "w"
	}
	for {
		c.mu.Lock()
		member := c.newMember(g) // numbered and recorded in one hold of c.mu (stale.go)
		g.member, g.confirmed, g.granted, g.gone = member, false, false, false
		c.entries[member] = g
		c.mu.Unlock()
		r, err := c.enqueue(ctx, g.key, member, kind)
		if err != nil || r.status != 1 {
			c.mu.Lock()
			delete(c.entries, member)
			c.mu.Unlock()
		}
		switch {
		case err != nil:
			return err
		case r.status == 0:
			return fairlock.ErrWouldBlock
		case r.status == 2:
			return nil
		case r.status == -1:
			return invalidWeight(g.w, c.units, r.other)
		}
		if time.Since(r.sent) >= c.ttl-c.ttl/10 {
			// The reply came later than the session's renewal deadline:
			// the marker the script set may have expired on the server
			// and the entry been purged, so neither the reply's grant nor
			// an announcement of it can be trusted. Queue again.
			c.mu.Lock()
			delete(c.entries, member)
			c.mu.Unlock()
			c.janitorAdd(g.key, member, false)
			continue
		}
		c.mu.Lock()
		g.token = r.token
		g.confirmed = true
		g.granted = g.granted || r.granted
		if ks := c.keys[g.key]; ks != nil {
			if d := r.sent.Add(c.ttl - c.ttl/10); d.After(ks.deadline) {
				ks.deadline = d
			}
		}
		c.mu.Unlock()
		err = c.wait(ctx, g)
		if err != errRequeue {
			return err
		}
	}
}

// wait waits until g holds the key. It returns nil with g held,
// errRequeue if g's entry was lost, or the call's error once g's entry is
// removed.
func (c *core) wait(ctx context.Context, g *Guard) error {
	for {
		c.mu.Lock()
		if ks := c.keys[g.key]; g.granted && !g.gone && ks != nil && !ks.deadline.IsZero() && !time.Now().Before(ks.deadline) {
			// Past the renewal deadline the session may have expired on
			// the server: the grant is not handed out (expire would lose
			// it at its next pass).
			g.gone = true
		}
		switch {
		case g.gone:
			delete(c.entries, g.member)
			c.mu.Unlock()
			c.janitorAdd(g.key, g.member, false)
			return errRequeue
		case g.granted:
			g.state = held
			g.grantedAt = time.Now()
			c.held++
			c.mu.Unlock()
			return nil
		}
		c.mu.Unlock()
		select {
		case <-g.wake:
		case <-ctx.Done():
			return c.cancel(g, ctxerr.Of(ctx))
		case <-c.closing:
			return c.cancel(g, errClosed)
		}
	}
}

// cancel takes g out of the queue: it removes g's entry on a detached
// context and returns err. If g's turn came meanwhile, the removal hands
// the key to the next call: the grant is never lost.
func (c *core) cancel(g *Guard, err error) error {
	c.mu.Lock()
	delete(c.entries, g.member)
	g.state = released
	c.mu.Unlock()
	c.remove(g.key, g.member)
	return err
}

// enqueued is the outcome of an enqueueing script.
type enqueued struct {
	status  int64 // 1 queued, 0 a Try that would wait, 2 a Wait on a free key, -1 another semaphore size
	token   uint64
	granted bool
	other   int64     // status -1: the other size
	sent    time.Time // when the script was sent: the session deadline's start
}

// scriptResult is what a background enqueue hands its call.
type scriptResult struct {
	r   enqueued
	err error
}

// enqueue runs the enqueueing script for member on a context that ctx's
// cancellation does not reach, so that its outcome is always known. If
// ctx ends (or the Locker closes) first, enqueue returns the context's
// error (or ErrClosed) at once and the script finishes in the background,
// given at most cleanupTimeout more; what it wrote is then removed. A
// script that fails leaves an unknown outcome: the janitor removes the
// entry if it shows up. Close waits for background scripts.
func (c *core) enqueue(ctx context.Context, key, member, kind string) (enqueued, error) {
	if err := ctx.Err(); err != nil {
		return enqueued{}, ctxerr.Of(ctx)
	}
	done := make(chan scriptResult, 1)
	abandoned := false // guarded by c.mu
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	c.mu.Lock()
	c.pending++
	c.mu.Unlock()
	go func() {
		r, err := c.runEnqueue(sctx, key, member, kind)
		cancel()
		c.mu.Lock()
		gone := abandoned
		if !gone {
			done <- scriptResult{r, err}
		}
		c.mu.Unlock()
		if gone {
			c.undo(key, member, r, err)
		}
		c.mu.Lock()
		c.pending--
		c.signalIdle()
		c.mu.Unlock()
	}()
	var res scriptResult
	var stop error
	select {
	case res = <-done:
	case <-ctx.Done():
		stop = ctxerr.Of(ctx)
	case <-c.closing:
		stop = errClosed
	}
	if stop != nil {
		c.mu.Lock()
		select {
		case res = <-done:
			c.mu.Unlock()
			c.undo(key, member, res.r, res.err)
		default:
			abandoned = true
			c.mu.Unlock()
		}
		return enqueued{}, stop
	}
	if res.err != nil {
		// Unknown outcome: the entry may have been written.
		c.janitorAdd(key, member, true)
		if ctx.Err() == nil && (errors.Is(res.err, context.DeadlineExceeded) || errors.Is(res.err, context.Canceled)) {
			// The script's own bound ended, not the call's context: say
			// so without wrapping a context error, which the caller (and
			// resultOf) would take for its own.
			res.err = fmt.Errorf("redislock: no reply to the enqueueing script within %v (%v)", cleanupTimeout, res.err)
		}
	}
	return res.r, res.err
}

// undo removes what an abandoned enqueue wrote.
func (c *core) undo(key, member string, r enqueued, err error) {
	switch {
	case err != nil:
		c.janitorAdd(key, member, true)
	case r.status == 1:
		c.remove(key, member)
	}
}

// runEnqueue sends the enqueueing script and parses its reply.
func (c *core) runEnqueue(ctx context.Context, key, member, kind string) (enqueued, error) {
	n := namesOf(c.esc, key)
	sent := time.Now()
	v, err := enqueueScript.Run(ctx, c.client,
		[]string{n.queue, n.counter, n.markers + c.sid},
		n.markers, c.channel, member, c.ttlMs, kind).Int64Slice()
	if err != nil {
		return enqueued{}, err
	}
	r := enqueued{status: v[0], sent: sent}
	switch {
	case r.status == 1 && len(v) == 3:
		r.token, r.granted = uint64(v[1]), v[2] == 1
	case r.status == -1 && len(v) == 2:
		r.other = v[1]
	case r.status == 0 || r.status == 2:
	default:
		return enqueued{}, fmt.Errorf("redislock: unexpected reply %v from the enqueue script", v)
	}
	return r, nil
}
