package fairlock

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/ctxerr"
	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/waitqueue"
)

// This file drives the per-key protocol (entry.go) for one call, in the
// order of a Lock and its Unlock:
//
//	acquire      the fast step: a claim of an idle shard (shard.go)
//	acquireSlow  under the shard mutex: admit, or enqueue and wait
//	wait         blocks until decided; cancel if ctx ends first
//	Unlock       the fast step: the CAS back to idle (shard.go)
//	release      under the shard mutex: release
//	settle       books what a transition decided, in the one place that
//	             does: the shard's counts, the deadlock detector, debug's
//	             live-shard bit and the drain of a closed table

// ask is how a call asks for a key.
type ask uint8

const (
	askBlock ask = iota // Lock, RLock, Acquire: waits for its turn
	askTry              // TryLock, TryRLock, TryAcquire: never waits
	askTurn             // Wait: a turn in the queue that holds nothing (0 units)
)

// acquire is every call that asks for units of key (Lock, RLock, Acquire,
// Wait and their Try forms) on key's shard s, where the key's tag is tag.
// It checks ctx and key once, then takes the fast step on an idle shard
// (see the fast path in shard.go): a claim, or for a Wait its turn at
// once; anything else is acquireSlow. A Wait returns the zero Guard.
func (t *table[K]) acquire(ctx context.Context, op string, s *shard[K], key K, tag uint64, units int64, how ask) (Guard[K], error) {
	if ctx == nil || ctx.Err() != nil || key != key { // a NaN: for a string, a length and pointer comparison
		return t.refuse(ctx, op, key, how)
	}
	if how == askTurn && idle(s.state.Load()) {
		return Guard[K]{}, nil // nothing is held or awaited on the shard: the turn is now
	}
	id := owner.Of(ctx) // before the claim: ctx.Value is the caller's code
	if how != askTurn {
		if token, ok := s.claim(key, tag, id, units); ok {
			return Guard[K]{s: s, token: token, key: key}, nil
		}
	}
	return t.acquireSlow(ctx, op, s, key, tag, id, units, how)
}

// refuse fails a call before it looks at its shard: a nil ctx panics; a
// done ctx fails with its error, a key not equal to itself with
// ErrInvalidKey.
func (t *table[K]) refuse(ctx context.Context, op string, key K, how ask) (Guard[K], error) {
	mustContext(ctx, op)
	err := ctxerr.Of(ctx)
	if err == nil {
		err = ErrInvalidKey
	}
	return t.fail(ctx, op, key, 0, err, 0, how != askTurn)
}

// mustContext panics if ctx is nil: every call that asks for a key
// needs one (Close takes nil as context.Background).
func mustContext(ctx context.Context, op string) {
	if ctx == nil {
		panic("fairlock: " + op + " with a nil context")
	}
}

// fail builds the error for a call that did not get the key, counts it
// and, if report, tells the observer.
func (t *table[K]) fail(ctx context.Context, op string, key K, id owner.ID, err error, waited time.Duration, report bool) (Guard[K], error) {
	if id == 0 {
		id = owner.Of(ctx)
	}
	if err == ErrReentrant {
		t.reentrant.Add(1)
	}
	if report && t.obs != nil {
		t.obs.Acquire(ResultOf(err), waited)
	}
	return Guard[K]{}, &LockError{Op: op, Key: key, Owner: id, Err: err, render: t.renderAny}
}

// refuseDeadlock logs and returns the error for a refused cycle, and
// tells the observer if report is set (not for a Wait). The log record
// carries the caller's ctx (a handler may read a trace from it), and the
// cycle is rendered only when the logger takes warnings.
func (t *table[K]) refuseDeadlock(ctx context.Context, op string, key K, id owner.ID, derr *DeadlockError, report bool) (Guard[K], error) {
	derr.render = t.renderAny
	if t.logger.Enabled(ctx, slog.LevelWarn) {
		args := ownerAttrs([]any{"locker", t.name, "key", registry.JSONKey(t.keyText(key))}, "owner", id, owner.LabelOf(ctx))
		t.logger.WarnContext(ctx, "fairlock: deadlock refused", append(args, "cycle", derr.Error())...)
	}
	return t.fail(ctx, op, key, id, derr, 0, report)
}

// acquireSlow is acquire under the shard mutex, outlined so that the fast
// step stays small: it admits the request of owner id, or queues it and
// waits. ctx is neither nil nor done at the start.
func (t *table[K]) acquireSlow(ctx context.Context, op string, s *shard[K], key K, tag uint64, id owner.ID, units int64, how ask) (Guard[K], error) {
	r := request{owner: id, units: units, turn: how == askTurn, now: t.now()}
	if t.stacks {
		r.stack = captureStack()
	}
	if t.dbg != nil {
		r.label = owner.LabelOf(ctx) // ctx.Value: the caller's code, so before s.mu
	}
	done := ctx.Done()
	s.lock()
	var err error
	e := s.find(key, tag)
	switch {
	case s.closed:
		err = ErrClosed
	case isDone(done):
		// ctx ended while this call waited for the shard mutex: fail, as
		// x/sync/semaphore's Acquire does, rather than grant a caller
		// that has given up. The error is built once s.mu is released:
		// ctx's Err and Value methods are the caller's code.
		err = errContextDone
	case e == nil && r.turn:
		s.unlock() // a free key: the turn is now
		return Guard[K]{}, nil
	case e == nil:
		e = s.newEntry(key)
		if s.insert(e, tag) && t.dbg != nil {
			t.dbg.markLive(s.idx, true)
		}
		token, _ := e.admit(&r, &s.books, nil)
		if s.follows != nil {
			s.followed(e)
		}
		s.unlock()
		return t.granted(s, key, token, 0, true), nil
	case e.holds(r.owner, s.indexOwners(e)):
		err = ErrReentrant
	default:
		if token, ok := e.admit(&r, &s.books, s.ownerCounts(e)); ok {
			if s.follows != nil {
				s.followed(e)
			}
			s.unlock()
			return t.granted(s, key, token, 0, !r.turn), nil
		}
		if how == askTry {
			err = ErrWouldBlock
			break
		}
		if t.detector != nil {
			if refused := t.detector.wait(key, e.holders, r.owner, !e.tracked); refused != nil {
				s.unlock()
				return t.refuseDeadlock(ctx, op, key, r.owner, refused, !r.turn)
			}
			e.tracked = true
		}
		return t.wait(ctx, op, s, e, key, r, done)
	}
	s.unlock()
	if err == errContextDone {
		err = ctxerr.Of(ctx)
	}
	return t.fail(ctx, op, key, r.owner, err, 0, !r.turn)
}

// captureStack records the caller of Lock (or RLock, Acquire, Wait and
// their Try forms) and up to 31 frames above it. It is called from
// acquireSlow: skip Callers, captureStack, acquireSlow, acquire and the
// face's method (runtime.Callers counts inlined frames too).
func captureStack() []uintptr {
	pcs := make([]uintptr, 32)
	return pcs[:runtime.Callers(5, pcs)]
}

// errContextDone stands in, under a shard mutex, for the error of a
// context found done there.
var errContextDone = errors.New("fairlock: context done")

// granted builds the Guard of a grant with token (none for a Wait's turn,
// token 0) and reports it to the observer if report is set.
func (t *table[K]) granted(s *shard[K], key K, token uint64, waited time.Duration, report bool) Guard[K] {
	if report && t.obs != nil {
		t.obs.Acquire(Acquired, waited)
	}
	if token == 0 {
		return Guard[K]{}
	}
	return Guard[K]{s: s, token: token, key: key}
}

// wait queues r on e and blocks until a grant pass decides it or done
// (ctx.Done, read once by acquireSlow) is closed. s.mu is held on entry
// and released before it blocks.
func (t *table[K]) wait(ctx context.Context, op string, s *shard[K], e *entry[K], key K, r request, done <-chan struct{}) (Guard[K], error) {
	w := waiterPool.Get().(*waiter)
	w.Value = waitState{request: r}
	e.enqueue(w)
	s.waiting++
	s.parks++
	refresh := s.parks%procsRefreshEvery == 0
	s.unlock()
	if refresh {
		refreshProcs() // off the hand-off path: this caller is about to wait
	}

	if done == nil {
		<-w.Ready() // ctx never ends: a plain receive costs less than a select
	} else {
		select {
		case <-w.Ready():
		case <-done:
			s.lock()
			if w.Value.outcome == waiting {
				// Still queued: leave, and re-run the grant pass for the
				// waiters this one may have blocked.
				decided := e.cancel(w, &s.books, t.now(), s.ownerCounts(e))
				decided = t.settle(s, e, change{decided: decided, left: r.owner})
				s.unlock()
				signal(decided)
				releaseWaiter(w)
				return t.fail(ctx, op, key, r.owner, ctxerr.Of(ctx), elapsed(r.now), !r.turn)
			}
			// Decided in the same instant. The decider signals after
			// releasing s.mu; take its signal so w can be reused.
			s.unlock()
			<-w.Ready()
		}
	}

	out, token := w.Value.outcome, w.Value.token
	releaseWaiter(w)
	if out == closedOut {
		return t.fail(ctx, op, key, r.owner, ErrClosed, elapsed(r.now), !r.turn)
	}
	if r.turn {
		return Guard[K]{}, nil // the turn came; there is nothing to give back
	}
	g := Guard[K]{s: s, token: token, key: key}
	// Granted. If ctx ended meanwhile, give the grant back through the
	// internal release, so the next waiter runs, and report the context's
	// error: the caller holds nothing (as x/sync/semaphore does).
	if isDone(done) {
		g.release(false)
		return t.fail(ctx, op, key, r.owner, ctxerr.Of(ctx), elapsed(r.now), true)
	}
	return t.granted(s, key, token, elapsed(r.now), true), nil
}

// Unlock ends the grant and, if waiters queued on the key now fit, hands
// the key to them in arrival order. It never blocks beyond the shard
// mutex: a grant that took the lock-free fast path and was never looked at
// since is released with one compare-and-swap; any other takes the shard
// mutex. With GOMAXPROCS=1, one hand-off in 64 per shard yields the
// processor (runtime.Gosched) before waking the new holder, so that a hot
// key's chain of wake-ups cannot keep other runnable goroutines off it.
//
// Unlock is idempotent: a second Unlock of the same Guard, or of a copy,
// does nothing, even if the key has since been granted to someone else
// (each grant has its own token, and a Guard releases only its own). Such
// stale Unlocks are counted in debug output. The zero Guard's Unlock is a
// no-op. Any goroutine may call Unlock, also after Close.
func (g Guard[K]) Unlock() {
	if g.s == nil {
		return
	}
	if g.s.unlockFast(g.token) {
		return // a fast grant, still in fast mode: nobody waits
	}
	if !g.release(true) {
		g.s.t.doubleUnlocks.Add(1)
	}
}

// release ends grant g if it is still current and runs the grant pass for
// the waiters it was blocking. It reports whether g was current. report
// says whether the observer hears of the release (not for a grant given
// back unused).
//
// Fairness policy. A release never leaves a key free while a waiter that
// fits is queued: ownership passes under the shard mutex to the head of
// the key's queue (and those directly behind it that fit beside it), and
// only then are they woken. A call that arrives in the instant between
// this hand-off and the woken waiter running finds the key held and queues
// behind it. This is strict FIFO: sync.Mutex's starvation mode made
// permanent (golang.org/issue/13086 describes that mode). Its cost against
// barging is throughput on a hot key: every hand-off waits for a goroutine
// wake-up, during which the key is held but idle, where a barging mutex
// would let an already-running goroutine take it. In exchange no waiter is
// ever overtaken, so the wait of the n'th waiter is bounded by n hold
// times plus n wake-ups.
func (g Guard[K]) release(report bool) bool {
	s := g.s
	t := s.t
	tag := t.tagOf(g.key) // see Guard: it does not carry the tag
	s.lock()
	// Read under the mutex: now stamps the grants this release hands on,
	// and must not precede the arrival of a waiter that queued while this
	// call waited for the mutex.
	now := t.now()
	e := s.find(g.key, tag)
	if e == nil {
		s.unlock()
		return false
	}
	from, grantedAt, decided, ok := e.release(g.token, &s.books, now, s.ownerCounts(e))
	if !ok {
		s.unlock()
		return false
	}
	// On a closed shard this release may be the last: it keeps the table
	// from counting as drained until the observer has heard it, so that
	// Unregister comes after it. The shard still counts (e is live), so
	// the count is above zero here.
	holdDrain := s.closed && report && t.obs != nil
	if holdDrain {
		t.draining.Add(1)
	}
	decided = t.settle(s, e, change{decided: decided, released: from})
	yield := decided != nil && s.handOffs%yieldEvery == 0
	s.unlock()
	if decided != nil {
		if yield && procs.Load() == 1 {
			runtime.Gosched()
		}
		signal(decided)
	}
	if report && t.obs != nil {
		t.obs.Release(now.Sub(grantedAt))
	}
	if holdDrain {
		t.shardDrained()
	}
	return true
}

// yieldEvery is how often, in grant passes of a shard that woke a waiter,
// a release yields its processor before it wakes the new holder, when the
// program runs on one processor.
//
// A woken goroutine goes to its waker's runnext slot, which the scheduler
// runs next, on the waker's time slice (runqput in runtime/proc.go). On a
// hot key each release wakes the next holder, which releases and wakes the
// next: a chain of wake-ups that keeps the processor, while goroutines that
// are runnable but not yet queued on the key (one preempted after its
// Unlock) wait in the run queue until the chain breaks. Yielding before
// the wake-up leaves runnext empty, so the run queue is served; the key
// is already handed over, so grants stay in order. With more processors
// idle ones take from the run queue, and a yield would only add a thread
// wake-up, so it is not done there. The same reasoning is behind the
// runtime's own yield in semrelease1 (runtime/sema.go, handoff).
const yieldEvery = 64

// procs caches runtime.GOMAXPROCS(0), which takes the scheduler's global
// lock and so stays off the release path. It is refreshed when a table is
// made and every procsRefreshEvery waits queued on a shard, by the waiter,
// after it queued and before it waits.
var procs atomic.Int32

const procsRefreshEvery = 64

func refreshProcs() { procs.Store(int32(runtime.GOMAXPROCS(0))) }

// change is what one transition of an entry did, for settle to book.
type change struct {
	decided  *waiter  // the waiters it decided, linked through next
	released owner.ID // release: the owner of the holder it dropped
	left     owner.ID // cancel: the owner of the waiter that left
}

// settle books what a transition of e did, in the one place that does:
// the shard's waiter and hand-off counts and owner index, the deadlock
// detector (if it tracks the key), the Feeds of a followed key
// (follow.go), and, once e is vacant, its removal, with
// debug's live-shard bit and Close's count of shards to drain. It returns
// c.decided, for the caller to signal once s.mu is released. s.mu is
// held.
func (t *table[K]) settle(s *shard[K], e *entry[K], c change) *waiter {
	n := 0
	for w := c.decided; w != nil; w = w.Value.next {
		n++
	}
	if c.left != 0 {
		s.waiting--
	}
	if n > 0 {
		s.waiting -= n
		s.handOffs++
	}
	if c.released != 0 {
		s.dropIndexIfFew(e)
	}
	if e.tracked {
		e.tracked = e.waiters.Len() > 0
		t.detector.settle(e.key, c.released, c.left, c.decided, e.tracked)
	}
	if s.follows != nil {
		s.followed(e) // before remove, which resets e
	}
	if e.vacant() && s.remove(e) {
		if t.dbg != nil {
			t.dbg.markLive(s.idx, false)
		}
		if s.closed {
			t.shardDrained()
		}
	}
	return c.decided
}

// followed reports e's holders to the Feeds of its key (follow.go) if
// they changed since the last report: a grant or a release. The
// transitions that can change holders call it only while s.follows is
// not nil. s.mu is held.
func (s *shard[K]) followed(e *entry[K]) {
	kf := s.follows[e.key]
	if kf == nil || sameHolders(e, kf.tokens) {
		return
	}
	kf.tokens = holderTokens(e, kf.tokens[:0])
	c := feedChange{holders: heldCalls(e), at: time.Now()}
	for i, b := range kf.bufs {
		if i > 0 {
			c.holders = slices.Clone(c.holders) // each reader its own
		}
		b.push(c)
	}
}

// waiterPool recycles waiters and their ready channels across all tables.
var waiterPool = sync.Pool{New: func() any { return waitqueue.NewWaiter[waitState]() }}

func releaseWaiter(w *waiter) {
	w.Value = waitState{}
	waiterPool.Put(w)
}

// isDone reports whether done (a ctx.Done channel, maybe nil) is closed.
func isDone(done <-chan struct{}) bool {
	if done == nil {
		return false
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// elapsed returns the time elapsed from t, or 0 for the zero time (clock off).
func elapsed(t time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return time.Since(t)
}
