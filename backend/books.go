package backend

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
)

// The Core's bookkeeping under its mutex (a call's place in its key's
// list, its session's count, a loss and its report to the Observer), its
// accessors for engines, and the goroutines it runs round trips on
// (bounded, within, Go).

// report tells the Observer, if there is one, how a call that asks for a
// key ended and how long it waited.
func (k *Core) report(err error, waited time.Duration, acquires bool) {
	if k.obs == nil || !acquires {
		return
	}
	k.obsMu.RLock()
	if !k.obsGone {
		k.obs.Acquire(fairlock.ResultOf(err), waited)
	}
	k.obsMu.RUnlock()
}

// Go runs fn on a goroutine of its own that Close waits for; fn must
// return once Background ends.
func (k *Core) Go(fn func()) {
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		fn()
	}()
}

// Mu returns the Core's mutex, which guards the kit's state and which
// the engine may use for its own (the Locked methods run under it).
func (k *Core) Mu() *sync.Mutex { return &k.mu }

// Background returns the context of the Locker's background work: it
// ends once Close has let every call end.
func (k *Core) Background() context.Context { return k.bg }

// Closing returns a context that ends when Close begins.
func (k *Core) Closing() context.Context { return k.closing }

// Name returns the Locker's name.
func (k *Core) Name() string { return k.name }

// Process returns where this Locker's calls come from (its host, process
// id and name): what an engine records with each entry it writes, so
// that a listing in any process names it (Lister).
func (k *Core) Process() keylock.Process { return k.process }

// Size returns a Semaphore's units per key; 0 for a Locker.
func (k *Core) Size() int64 { return k.size }

// TTL returns the session TTL the Locker was configured with.
func (k *Core) TTL() time.Duration { return k.ttl }

// Logger returns where the Locker logs.
func (k *Core) Logger() *slog.Logger { return k.logger }

// signalIdle wakes a waiting Close. k.mu is held.
func (k *Core) signalIdle() {
	select {
	case k.idle <- struct{}{}:
	default:
	}
}

// forgetLocked removes c from the local view of its key. k.mu is held.
func (k *Core) forgetLocked(c *Call) {
	cs := k.keys[c.key]
	if i := slices.Index(cs, c); i >= 0 {
		cs = slices.Delete(cs, i, i+1)
	}
	if len(cs) == 0 {
		delete(k.keys, c.key)
	} else {
		k.keys[c.key] = cs
	}
}

// retireLocked takes c's current entry out of the kit's books: its id, its
// session's count, the engine's watch. k.mu is held.
func (k *Core) retireLocked(c *Call) {
	if k.watcher != nil {
		k.watcher.UnwatchLocked(c)
	}
	if c.id != "" && k.ids[c.id] == c {
		delete(k.ids, c.id)
	}
	k.uncountLocked(c)
	c.confirmed = false
	c.session = nil
}

// uncountLocked takes c out of its session's count of calls, which keeps
// the session renewed; a session that is not persistent goes with its
// last call. k.mu is held.
func (k *Core) uncountLocked(c *Call) {
	if s := c.session; s != nil && c.counted {
		c.counted = false
		s.calls--
		if s.calls == 0 && !s.persistent && k.sessions[s.id] == s {
			delete(k.sessions, s.id)
		}
	}
}

// loseLocked marks c's entry gone; a held grant is lost: its Lost channel
// closes. k.mu is held.
func (k *Core) loseLocked(c *Call, now time.Time) {
	c.gone = true
	k.uncountLocked(c)
	if c.state == held && !c.releasing {
		k.closeLostLocked(c, now)
	}
	c.signal()
}

// closeLostLocked closes c's Lost channel, once, and counts the loss for
// the Observer: the renewal loop, woken here, reports it once the mutex
// is released (an Observer's methods run outside the Locker's mutexes).
// k.mu is held.
func (k *Core) closeLostLocked(c *Call, now time.Time) {
	if c.lostClosed {
		return
	}
	c.closeLost(now)
	if k.obs != nil {
		k.lostN++
		k.kickRenewal()
	}
}

// reportLost reports the grants lost since the last call to the Observer:
// one acquisition result fairlock.Lost each. It takes the Core's mutex.
func (k *Core) reportLost() {
	if k.obs == nil {
		return
	}
	k.mu.Lock()
	n := k.lostN
	k.lostN = 0
	k.mu.Unlock()
	for range n {
		k.report(errLost, 0, true)
	}
}

var errClosed = fairlock.ErrClosed

// bounded runs fn, which makes round trips with ctx, on a goroutine of its
// own and waits for it until ctx is done; it reports whether fn returned.
// The goroutine counts as pending, so Close waits for it.
func (k *Core) bounded(ctx context.Context, fn func()) bool {
	k.mu.Lock()
	k.pending++
	k.mu.Unlock()
	return k.within(ctx, func() {
		fn()
		k.mu.Lock()
		k.pending--
		k.signalIdle()
		k.mu.Unlock()
	})
}

// within runs fn on a goroutine of its own and waits for it until ctx is
// done; it reports whether fn returned. Close does not wait for it: it is
// an Unlock's round trip, whose grant Close counts, and gives up on, as
// a grant.
func (k *Core) within(ctx context.Context, fn func()) bool {
	if ctx.Done() == nil {
		fn() // nothing to return early for
		return true
	}
	done := make(chan struct{})
	k.spawn(func() {
		fn()
		close(done)
	})
	select {
	case <-done:
		return true
	case <-ctx.Done():
		select {
		case <-done:
			return true
		default:
			return false
		}
	}
}

// Workers. A round trip that a call must be able to give up on (its
// context ends while the engine has not answered) runs apart from the
// call's goroutine. A fresh goroutine per round trip would grow its stack
// through the client's call depth every time (runtime.copystack), which
// costs more CPU than the round trip itself; so the goroutine that ran
// one stays, idle, for idleFor, and runs the next. At most maxIdle wait;
// they end when the Locker's background context does.

// idleFor is how long a worker waits for another round trip.
const idleFor = time.Second

// maxIdle bounds the workers waiting.
const maxIdle = 16

// spawn runs fn on an idle worker, or a new one.
func (k *Core) spawn(fn func()) {
	k.wmu.Lock()
	if n := len(k.idleW); n > 0 {
		w := k.idleW[n-1]
		k.idleW = k.idleW[:n-1]
		k.wmu.Unlock()
		w.job <- fn
		return
	}
	k.wmu.Unlock()
	w := &worker{job: make(chan func(), 1)}
	go k.work(w, fn)
}

// work runs fn, then waits among the idle workers for the next job, until
// idleFor passes, the pool is full or the background context ends.
func (k *Core) work(w *worker, fn func()) {
	timer := time.NewTimer(idleFor)
	defer timer.Stop()
	for {
		fn()
		k.wmu.Lock()
		if len(k.idleW) >= maxIdle || k.bg.Err() != nil {
			k.wmu.Unlock()
			return
		}
		k.idleW = append(k.idleW, w)
		k.wmu.Unlock()
		timer.Reset(idleFor)
		select {
		case fn = <-w.job:
			continue
		case <-timer.C:
		case <-k.bg.Done():
		}
		k.wmu.Lock()
		if i := slices.Index(k.idleW, w); i >= 0 {
			k.idleW = slices.Delete(k.idleW, i, i+1)
			k.wmu.Unlock()
			return
		}
		k.wmu.Unlock()
		fn = <-w.job // spawn took it before it could leave: its job is coming
	}
}

// Bounded runs fn, which makes round trips with ctx, on a goroutine of
// its own and waits for it until ctx is done; it reports whether fn
// returned (if not, fn's results must not be read: it is still running).
// Close waits for fn. It is how a backend bounds its own calls (Locked)
// where its client may not honour a context.
func (k *Core) Bounded(ctx context.Context, fn func()) bool { return k.bounded(ctx, fn) }

// kickRenewal wakes the renewal loop to recompute when it is next due.
func (k *Core) kickRenewal() {
	select {
	case k.renewKick <- struct{}{}:
	default:
	}
}
