package fairlock

import (
	"cmp"
	"context"
	"errors"
	"iter"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/internal/ctxerr"
	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/waitqueue"
)

// This file is the per-key protocol, read top to bottom: the state
// machine of one live key (entry), one method per row of its transition
// table, then the calls that drive it, in the order of a Lock and its
// Unlock:
//
//	table.acquire      the fast step: a claim of an idle shard (shard.go)
//	table.acquireSlow  under the shard mutex: admit, or enqueue and wait
//	table.wait         blocks until decided; cancel if ctx ends first
//	Guard.Unlock       the fast step: the CAS back to idle (shard.go)
//	Guard.release      under the shard mutex: release
//	table.settle       books what a transition decided, in one place
//
// The shard (shard.go) finds the entry of a key and keeps the fast path;
// the table (table.go) holds the options, the detector, the observer and
// debug state that settle reports to.

// entry is the per-key state machine: the holders of one live key and its
// FIFO queue of waiters. Every mode is one rule over units, after
// golang.org/x/sync/semaphore: a key has size units (the Locker's or
// Semaphore's), each holder holds some, and a request fits when its units
// are free.
//
//	request            units      fits when
//	Lock               size       nothing is held
//	RLock              1          no writer holds (readers never fill size)
//	Semaphore.Acquire  w          w units are free
//	Wait               0          nothing is held; it passes, holding nothing
//
// Its transitions, one method each:
//
//	admit    (no entry, or nobody queued and the request fits)  → holder
//	enqueue  (queued behind the others)                         → waiter
//	grant    (after release, cancel): while the head fits, pop it; a
//	         holder for a Lock/RLock/Acquire, nothing for a Wait
//	release  (Unlock): drop the holder with the Guard's token, then grant
//	cancel   (a waiter's context ended): unqueue it, then grant, since
//	         it may have blocked the waiters behind it
//	close    (Close): every waiter decided closed; holders stay
//
// All run under the shard mutex and know nothing of the Locker, its
// detector, observer or debug state: what they need of the shard comes
// in its books, and the owner index in idx. grant, release, cancel and
// close return the waiters they decided, linked through waitState.next;
// table.settle books them, and the caller signals them once the mutex is
// released (waking a goroutine under the mutex would make the woken one
// block on it).
//
// The grant pass is task-fair FIFO: it grants the head and every waiter
// directly behind it that fits beside the holders, and stops at the first
// that does not, so nothing overtakes a waiter (a reader behind a queued
// writer waits even while readers hold the key). A waiter always queues
// behind a holder: after a grant pass an entry with waiters has holders,
// and an entry with neither is deleted (settle). An entry does not keep
// its key's tag (hash): the shard keeps it beside an inline entry
// (shard.tags), finds an overflow one by its key, and so an entry of a
// string key fits the 80-byte size class.
type entry[K comparable] struct {
	key     K
	slot    int8   // index in the shard's slots, or -1 in its overflow map
	tracked bool   // the deadlock detector tracks this key's holders: it is awaited
	indexed bool   // the shard keeps an owner index of the holders (many holders)
	dead    uint16 // released holders not yet compacted out of holders
	used    int64  // units held: the sum of live holders' units
	// holders are the grants, in grant order, so by increasing token. A
	// released one stays as a tombstone (owner 0) until tombstones are
	// half the slice, or no holder is left: a release costs a binary
	// search, not a copy of the slice, whatever the order of releases.
	holders []holder
	waiters waitqueue.Queue[waitState] // in arrival order
}

// holder is one grant of a key.
type holder struct {
	owner owner.ID
	token uint64    // the grant's token, the Guard's
	units int64     // units held
	info  *holdInfo // timed lockers only: for debug and an observer
}

// holdInfo is what debug and an observer know of a grant. Kept apart so
// that a Locker without them keeps a holder to 32 bytes.
type holdInfo struct {
	since  time.Time // when granted
	stack  []uintptr // WithStacks: the acquiring call's stack
	warned uint      // long-held warnings given for this grant
	// label is the owner's label (owner.LabelOf of the call's ctx, or of
	// the flow a HandOff gave the grant to), debug only: kept here since
	// the label behind owner.ID.Label goes once the flow's contexts are
	// unreachable, which a holder blocked without touching ctx makes them.
	label string
}

// outcome of a wait, decided under the shard mutex by whoever ends it.
type outcome uint8

const (
	waiting   outcome = iota
	granted           // a holder now (or, for a Wait, its turn came)
	closedOut         // the Locker closed
)

// request is one call that asks for a key, as worked out before the shard
// mutex is taken.
type request struct {
	owner owner.ID
	units int64     // 0 for a Wait
	turn  bool      // a Wait: fits only when nothing is held, holds nothing
	now   time.Time // zero unless the Locker is timed
	stack []uintptr // nil unless WithStacks
	label string    // WithDebug only: owner.LabelOf(ctx), read at the call (see holdInfo)
}

// waitState is a queued request; it lives in a waitqueue.Waiter.
type waitState struct {
	request
	outcome outcome // guarded by the shard mutex
	token   uint64  // guarded by the shard mutex: the grant's token
	warned  uint    // guarded by the shard mutex: long-wait warnings given
	next    *waiter // in a list of decided waiters, to be signalled
}

type waiter = waitqueue.Waiter[waitState]

// books is what the transitions of one shard's entries share, kept in
// the shard: the units of a key, the shard's token counter, and its
// recycled holdInfos. Guarded by the shard mutex.
type books struct {
	size  int64  // units per key: lockerUnits for a Locker, n for a Semaphore
	token uint64 // the last token handed out (in slow mode; see shard.go)
	// infos are the recycled holdInfos of a timed table (debug or an
	// observer: grants record a holdInfo), non-nil there even when empty,
	// and nil on any other: timed tells the two apart. A bool would cost
	// every shard eight bytes.
	infos infoFree
}

// timed reports whether grants record a holdInfo.
func (b *books) timed() bool { return b.infos != nil }

// fits reports whether r can be granted beside the current holders of a
// key of size units.
func (e *entry[K]) fits(r *request, size int64) bool {
	if r.turn {
		return e.used == 0
	}
	return r.units <= size-e.used
}

// holding returns the number of live holders.
func (e *entry[K]) holding() int { return len(e.holders) - int(e.dead) }

// idle reports whether e has neither holder nor waiter: its key is no
// longer live.
func (e *entry[K]) idle() bool { return e.holding() == 0 && e.waiters.Len() == 0 }

// holds reports whether o holds e in any mode. idx is the shard's owner
// index of e's holders, or nil if it keeps none (few holders).
func (e *entry[K]) holds(o owner.ID, idx map[owner.ID]int32) bool {
	if idx != nil {
		return idx[o] > 0
	}
	for i := range e.holders {
		if e.holders[i].owner == o {
			return true
		}
	}
	return false
}

// admit grants r at once if nobody is queued and r fits; it reports
// whether it did. A Wait admitted holds nothing and has token 0.
func (e *entry[K]) admit(r *request, b *books, idx map[owner.ID]int32) (token uint64, ok bool) {
	if e.waiters.Len() > 0 || !e.fits(r, b.size) {
		return 0, false
	}
	if r.turn {
		return 0, true
	}
	return e.addHolder(r, r.now, b, idx), true
}

// enqueue queues w behind the other waiters.
func (e *entry[K]) enqueue(w *waiter) { e.waiters.PushBack(w) }

// grant runs the grant pass at time now: while the head waiter fits, it
// is popped and made a holder (or, for a Wait, passed). It returns the
// decided waiters, linked through next, oldest first.
func (e *entry[K]) grant(b *books, now time.Time, idx map[owner.ID]int32) (decided *waiter) {
	var list decidedList
	for w := e.waiters.Front(); w != nil && e.fits(&w.Value.request, b.size); w = e.waiters.Front() {
		e.waiters.PopFront()
		w.Value.outcome = granted
		if !w.Value.turn {
			w.Value.token = e.addHolder(&w.Value.request, now, b, idx)
		}
		list.add(w)
	}
	return list.first
}

// release drops the holder with token, then runs the grant pass at time
// now for the waiters it was blocking. It returns the dropped holder's
// owner and grant time (zero on an untimed table) and the decided
// waiters; ok is false, and nothing changed, if no holder has the token
// (a stale Guard).
func (e *entry[K]) release(token uint64, b *books, now time.Time, idx map[owner.ID]int32) (from owner.ID, since time.Time, decided *waiter, ok bool) {
	i, ok := e.find(token)
	if !ok {
		return 0, time.Time{}, nil, false
	}
	h := e.holders[i]
	e.used -= h.units
	if idx != nil {
		if idx[h.owner]--; idx[h.owner] <= 0 {
			delete(idx, h.owner)
		}
	}
	e.holders[i] = holder{token: h.token} // a tombstone keeps the order searchable
	e.dead++
	switch {
	case e.holding() == 0 && cap(e.holders) > maxKeptHolders:
		e.holders, e.dead = nil, 0 // a crowd of readers gone: its slice too
	case e.holding() == 0:
		clear(e.holders)
		e.holders, e.dead = e.holders[:0], 0
	case int(e.dead) > len(e.holders)/2 || e.dead == math.MaxUint16:
		e.holders = slices.DeleteFunc(e.holders, func(h holder) bool { return h.owner == 0 })
		e.dead = 0
		if cap(e.holders) > maxKeptHolders && len(e.holders) < cap(e.holders)/8 {
			e.holders = slices.Clone(e.holders) // a key that stays busy gives a crowd's slice back
		}
	}
	if h.info != nil {
		since = h.info.since
		b.infos.put(h.info) // before the grant pass, which may reuse it
	}
	return h.owner, since, e.grant(b, now, idx), true
}

// cancel unqueues w, whose context ended while it waited, then runs the
// grant pass at time now for the waiters it may have blocked, and returns
// them.
func (e *entry[K]) cancel(w *waiter, b *books, now time.Time, idx map[owner.ID]int32) (decided *waiter) {
	e.waiters.Remove(w)
	return e.grant(b, now, idx)
}

// close decides every waiter closed and returns them, linked through
// next. Holders stay: they end with their Unlock.
func (e *entry[K]) close() (decided *waiter) {
	var list decidedList
	for w := e.waiters.PopFront(); w != nil; w = e.waiters.PopFront() {
		w.Value.outcome = closedOut
		list.add(w)
	}
	return list.first
}

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
		t.obs.Acquire(resultOf(err), waited)
	}
	return Guard[K]{}, &LockError{Op: op, Key: key, Owner: id, Err: err, render: t.renderAny}
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
		s.unlock()
		return t.granted(s, key, token, 0, true), nil
	case e.holds(r.owner, s.indexOwners(e)):
		err = ErrReentrant
	default:
		if token, ok := e.admit(&r, &s.books, s.ownerCounts(e)); ok {
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
				return t.refuseDeadlock(ctx, op, key, r.owner, refused)
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
				return t.fail(ctx, op, key, r.owner, ctxerr.Of(ctx), since(r.now), !r.turn)
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
		return t.fail(ctx, op, key, r.owner, ErrClosed, since(r.now), !r.turn)
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
		return t.fail(ctx, op, key, r.owner, ctxerr.Of(ctx), since(r.now), true)
	}
	return t.granted(s, key, token, since(r.now), true), nil
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
// detector (if it tracks the key), and, once e is idle, its removal, with
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
	if e.idle() && s.remove(e) {
		if t.dbg != nil {
			t.dbg.markLive(s.idx, false)
		}
		if s.closed {
			t.shardDrained()
		}
	}
	return c.decided
}

// signal wakes the decided waiters, oldest first. Each next is read before
// its waiter is signalled: once woken, a waiter may be recycled.
func signal(w *waiter) {
	for w != nil {
		next := w.Value.next
		w.Signal()
		w = next
	}
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

// waiterPool recycles waiters and their ready channels across all tables.
var waiterPool = sync.Pool{New: func() any { return waitqueue.NewWaiter[waitState]() }}

func releaseWaiter(w *waiter) {
	w.Value = waitState{}
	waiterPool.Put(w)
}

// since returns the time elapsed from t, or 0 for the zero time (clock off).
func since(t time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return time.Since(t)
}

// The transitions' own helpers, and debug's view of an entry.

// addHolder makes r a holder, granted at now, under the shard's next
// token, and counts it in idx if the shard keeps an owner index of e.
func (e *entry[K]) addHolder(r *request, now time.Time, b *books, idx map[owner.ID]int32) uint64 {
	b.token++
	var info *holdInfo
	if b.timed() {
		info = b.infos.get()
		*info = holdInfo{since: now, stack: r.stack, label: r.label}
	}
	e.hold(holder{owner: r.owner, token: b.token, units: r.units, info: info})
	if idx != nil {
		idx[r.owner]++
	}
	return b.token
}

// hold appends h, whose token is above every holder's, to the holders.
func (e *entry[K]) hold(h holder) {
	e.holders = append(e.holders, h)
	e.used += h.units
}

// find returns the index of the live holder with token.
func (e *entry[K]) find(token uint64) (int, bool) {
	i, found := slices.BinarySearchFunc(e.holders, token, func(h holder, t uint64) int { return cmp.Compare(h.token, t) })
	return i, found && e.holders[i].owner != 0
}

// handOff moves the live holder with token to owner to (Guard.HandOff),
// keeping idx's counts, and returns its previous owner; ok is false, and
// nothing changed, if no holder has the token or to is queued on the key.
// On a debug table (debug set) the grant's recorded label becomes label,
// to's.
func (e *entry[K]) handOff(token uint64, to owner.ID, idx map[owner.ID]int32, debug bool, label string) (from owner.ID, ok bool) {
	i, ok := e.find(token)
	if !ok {
		return 0, false
	}
	from = e.holders[i].owner
	if from == to {
		return from, true
	}
	if e.queued(to) {
		return 0, false // to would hold the key and wait for it: a cycle of one
	}
	if info := e.holders[i].info; debug && info != nil {
		info.label = label
	}
	e.holders[i].owner = to
	if idx != nil {
		if idx[from]--; idx[from] <= 0 {
			delete(idx, from)
		}
		idx[to]++
	}
	return from, true
}

// queued reports whether o has a request queued on e, in any mode: a
// walk of the queue.
func (e *entry[K]) queued(o owner.ID) bool {
	for w := range e.waiters.All() {
		if w.Value.owner == o {
			return true
		}
	}
	return false
}

// reset clears the idle e for reuse by another key, keeping its holders
// slice if it is small.
func (e *entry[K]) reset() {
	holders := e.holders[:0]
	if cap(holders) > maxKeptHolders {
		holders = nil
	}
	*e = entry[K]{holders: holders}
}

// maxKeptHolders: an entry keeps its holders slice, once its holders are
// gone, only up to this capacity, so a key once read by many does not
// keep memory at that peak.
const maxKeptHolders = 8

// decidedList is a list of decided waiters linked through their next, in
// the order they were decided.
type decidedList struct{ first, last *waiter }

// add appends w.
func (l *decidedList) add(w *waiter) {
	w.Value.next = nil
	if l.last == nil {
		l.first = w
	} else {
		l.last.Value.next = w
	}
	l.last = w
}

// infoFree recycles holdInfos within a shard of a timed locker.
type infoFree []*holdInfo

// maxFreeInfos is how many recycled holdInfos a shard keeps.
const maxFreeInfos = 16

func (f *infoFree) get() *holdInfo {
	if n := len(*f); n > 0 {
		info := (*f)[n-1]
		*f = (*f)[:n-1]
		return info
	}
	return new(holdInfo)
}

func (f *infoFree) put(info *holdInfo) {
	if len(*f) >= maxFreeInfos {
		return
	}
	*info = holdInfo{}
	*f = append(*f, info)
}

// view is debug's read-only view of a live entry: its key, its live
// holders and its waiters. The long-held and long-wait warning counts
// are debug's own bookkeeping, so a view hands them out to be updated.
type view[K comparable] struct{ e *entry[K] }

// key returns the entry's key.
func (v view[K]) key() K { return v.e.key }

// holding and waiting return the numbers of live holders and waiters.
func (v view[K]) holding() int { return v.e.holding() }
func (v view[K]) waiting() int { return v.e.waiters.Len() }

// holders yields the live holders in grant order.
func (v view[K]) holders() iter.Seq[holder] {
	return func(yield func(holder) bool) {
		for _, h := range v.e.holders {
			if h.owner != 0 && !yield(h) {
				return
			}
		}
	}
}

// waiters yields each waiter's request, in arrival order, with its count
// of long-wait warnings.
func (v view[K]) waiters() iter.Seq2[request, *uint] {
	return func(yield func(request, *uint) bool) {
		for w := range v.e.waiters.All() {
			if !yield(w.Value.request, &w.Value.warned) {
				return
			}
		}
	}
}
