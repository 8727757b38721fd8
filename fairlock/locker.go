// Package fairlock provides Locker, a fair, strict-FIFO keyed mutex.
//
// Calls on the same key exclude each other and are granted in the order in
// which they arrived; calls on different keys never wait on each other. A
// flow that locks a key it already holds gets ErrReentrant instead of
// deadlocking itself, and with WithDeadlockDetection a Lock that would
// close a wait-for cycle between flows gets ErrDeadlock.
//
// # Owners
//
// Each call has an owner, owner.Of(ctx): the flow token carried by ctx
// (owner.NewContext), or else the calling goroutine. Reentrancy and
// deadlock detection are per owner. Unlock is not: a Guard may be unlocked
// from any goroutine.
//
// # Memory model
//
// For a key k, the n'th Unlock of k synchronizes before the return of the
// m'th successful Lock or TryLock of k, for n < m, as for sync.Mutex.
//
// # Costs
//
// An uncontended Lock+Unlock, on a key whose shard holds no other key, is
// three atomic operations on the shard's state word and no mutex (the fast
// path, described in shard.go); anything else takes the shard mutex. Neither
// allocates with debug and observer off. A Lock that must wait allocates
// nothing either once the Locker has warmed up: waiters are recycled. A
// key's entry exists only while the key is held or awaited, so a Locker
// over millions of distinct keys holds memory only for the ones in use.
package fairlock

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/waitqueue"
)

// Locker is a fair, strict-FIFO keyed mutex. Make one with New; the zero
// Locker is not usable. A Locker must not be copied after first use. All
// methods are safe for concurrent use.
type Locker[K comparable] struct {
	seed   maphash.Seed
	shards []shard[K]
	mask   uint64

	name      string
	logger    *slog.Logger
	keyFormat func(K) string   // WithKeyFormatter, or nil
	renderAny func(any) string // renders a K held in an any: for errors
	timed     bool             // read the clock on grant/release: debug or observer on
	obs       LockerObserver   // nil without WithObserver
	dbg       *debugState      // nil without WithDebug
	detector  *detector[K]     // nil without WithDeadlockDetection

	reentrant     atomic.Int64 // ErrReentrant returns
	doubleUnlocks atomic.Int64 // Unlocks of a Guard already unlocked

	closeOnce sync.Once
	closing   atomic.Bool   // Close has begun: set before it marks any shard
	draining  atomic.Int64  // after Close: shards with live keys, +1 while Close walks them
	drained   chan struct{} // closed when draining reaches 0
}

// entry is the state of one live key on the mutex side. It exists while
// the key has a holder; waiters always queue behind a holder (hand-off
// never leaves a key free with waiters). A fast grant has no entry until
// the mutex side inflates it (see the fast path in shard.go).
type entry[K comparable] struct {
	key     K
	slot    int                        // guarded by s.mu: index in s.slots, or -1 in s.overflow
	holder  owner.ID                   // guarded by s.mu
	gen     uint64                     // guarded by s.mu: current grant; 0 when recycled
	waiters waitqueue.Queue[waitState] // guarded by s.mu
	hold    *holdInfo                  // guarded by s.mu: timed Lockers only, else nil
}

// holdInfo is what debug and an observer know of a grant. It hangs off
// the entry, and stays with it when the entry is recycled, so that Lockers
// without them keep a held key to 80 bytes (for a string key) rather than
// 128.
type holdInfo struct {
	grantedAt time.Time
	stack     []uintptr // WithStacks: the holder's Lock call stack
	warned    uint      // long-held warnings given for this grant
}

// grant makes id the holder of e under generation gen, granted at t with
// stack (both only kept by timed Lockers). s.mu is held.
func (e *entry[K]) grant(id owner.ID, gen uint64, t time.Time, stack []uintptr) {
	e.holder, e.gen = id, gen
	if e.hold != nil {
		*e.hold = holdInfo{grantedAt: t, stack: stack}
	}
}

// outcome of a wait, decided under the shard mutex by whoever ends it.
type outcome uint8

const (
	waiting outcome = iota
	granted
	closedOut
)

// waitState is a queued Lock call; it lives in a waitqueue.Waiter.
type waitState struct {
	owner   owner.ID
	outcome outcome // guarded by s.mu
	gen     uint64  // guarded by s.mu: the grant's generation once granted
	since   time.Time
	stack   []uintptr
	warned  uint
}

type waiter = waitqueue.Waiter[waitState]

// waiterPool recycles waiters and their ready channels across all Lockers.
var waiterPool = sync.Pool{New: func() any { return waitqueue.NewWaiter[waitState]() }}

// lockers counts Lockers made, for default names.
var lockers atomic.Int64

// New returns an open Locker for keys of type K. It allocates the shards
// (WithShards) and, with WithDebug and WithLongHeld, starts one watchdog
// goroutine that Close stops. Keys are hashed with hash/maphash.Comparable:
// K must not be, or contain, an interface holding an uncomparable value,
// or Lock panics as a map would.
func New[K comparable](opts ...Option) *Locker[K] {
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	n := lockers.Add(1)
	if cfg.name == "" {
		cfg.name = fmt.Sprintf("fairlock-%d", n)
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	l := &Locker[K]{
		seed:    maphash.MakeSeed(),
		shards:  make([]shard[K], cfg.shards),
		mask:    uint64(cfg.shards - 1),
		name:    cfg.name,
		logger:  cfg.logger,
		drained: make(chan struct{}),
	}
	if cfg.keyFormat != nil {
		f, ok := cfg.keyFormat.(func(K) string)
		if !ok {
			panic(fmt.Sprintf("fairlock: WithKeyFormatter given a %T for a Locker of %v keys", cfg.keyFormat, reflect.TypeFor[K]()))
		}
		l.keyFormat = f
	}
	l.renderAny = func(k any) string {
		if key, ok := k.(K); ok {
			return l.keyText(key)
		}
		return renderKey(k)
	}
	if cfg.deadlocks {
		l.detector = newDetector[K]()
	}
	if cfg.observer != nil {
		l.obs = cfg.observer.Register(l.name, l.stats)
	}
	l.timed = l.obs != nil || cfg.debug
	// The deadlock detector needs no fast path of its own: it tracks only
	// awaited keys, and a waiter inflates a fast grant before it asks.
	fast := !l.timed
	for i := range l.shards {
		s := &l.shards[i]
		s.l, s.fast = l, fast
		if !fast {
			s.state.Store(slowBit) // for good: see the fast path in shard.go
		}
	}
	if cfg.debug {
		l.startDebug(cfg) // last: from here on other goroutines can read l
	}
	return l
}

// keyText renders key for errors, debug output and warnings: with the
// WithKeyFormatter function if one was given, else by renderKey's rules;
// control characters are escaped either way. It may run user code, so it
// is never called with a shard mutex held.
func (l *Locker[K]) keyText(key K) string {
	if l.keyFormat != nil {
		return escapeNonPrinting(l.keyFormat(key))
	}
	return renderKey(key)
}

// shardOf returns key's shard and its tag there (the key's hash, never 0).
func (l *Locker[K]) shardOf(key K) (*shard[K], uint64) {
	h := maphash.Comparable(l.seed, key)
	return &l.shards[h&l.mask], h | 1
}

// tagOf returns key's tag in its shard.
func (l *Locker[K]) tagOf(key K) uint64 {
	return maphash.Comparable(l.seed, key) | 1
}

// now reads the clock only when someone will look at the time.
func (l *Locker[K]) now() time.Time {
	if l.timed {
		return time.Now()
	}
	return time.Time{}
}

// Lock locks key for the owner of ctx (owner.Of) and returns the Guard
// that unlocks it. If the key is held, Lock blocks until every Lock that
// queued on the key before it has been granted and released, then takes the
// lock directly from the previous holder; it never overtakes an earlier
// waiter.
//
// Lock returns an error wrapping:
//   - the context's error if ctx is done before the lock is granted, even
//     when the key is free; the caller then holds nothing;
//   - ErrReentrant at once if the owner already holds key;
//   - ErrClosed if the Locker is closed, or closes while Lock waits;
//   - ErrDeadlock (also a *DeadlockError) with WithDeadlockDetection, at
//     once, if waiting would close a wait-for cycle;
//   - ErrInvalidKey at once if key is not equal to itself (it is or holds
//     a NaN).
//
// The returned error is a *LockError naming the key and owner; building
// it allocates. A granted Lock allocates nothing when it does not wait,
// and nothing beyond a recycled waiter when it does. On a key whose shard (of WithShards) holds nothing
// else, and without WithDebug or WithObserver, Lock is lock-free: one
// compare-and-swap and one atomic store, without the shard mutex.
func (l *Locker[K]) Lock(ctx context.Context, key K) (Guard[K], error) {
	s, tag := l.shardOf(key)
	if g, ok := l.lockFast(ctx, s, key); ok {
		return g, nil
	}
	return l.lockSlow(ctx, key, s, tag)
}

// lockFast grants key if its shard is idle in fast mode: nothing held or
// awaited on the shard. It reports false, having changed nothing, in every
// other case, including a nil or done ctx and a key not equal to itself (a
// NaN; for a string key the test is a length and a pointer comparison).
// See the fast path in shard.go.
func (l *Locker[K]) lockFast(ctx context.Context, s *shard[K], key K) (Guard[K], bool) {
	if ctx == nil || ctx.Err() != nil || key != key {
		return Guard[K]{}, false
	}
	st := s.state.Load()
	if st&(heldBit|slowBit) != 0 {
		return Guard[K]{}, false
	}
	id := owner.Of(ctx) // before the claim: ctx.Value is the caller's code
	gen := st>>genShift + 1
	if !s.state.CompareAndSwap(st, gen<<genShift|heldBit|claimingBit) {
		return Guard[K]{}, false
	}
	s.fastKey, s.fastOwner = key, id
	s.state.Store(gen<<genShift | heldBit) // publish
	return Guard[K]{s: s, gen: gen, key: key}, true
}

// lockSlow is Lock's path under the shard mutex. It is outlined so that
// Lock's fast path stays short, as in sync.Mutex.
func (l *Locker[K]) lockSlow(ctx context.Context, key K, s *shard[K], tag uint64) (Guard[K], error) {
	r := request[K]{s: s, tag: tag}
	if err := l.prepare(ctx, "Lock", key, &r); err != nil {
		return Guard[K]{}, err
	}
	s.lock()
	if e := s.find(key, r.tag); e != nil || s.closed {
		return l.lockHeld(ctx, e, key, &r)
	}
	g := s.grantNew(key, &r)
	s.unlock()
	if l.obs != nil {
		l.obs.Acquire(Acquired, 0)
	}
	return g, nil
}

// request is what Lock and TryLock work out before taking the shard mutex.
type request[K comparable] struct {
	id    owner.ID
	s     *shard[K]
	tag   uint64    // the key's tag in s
	now   time.Time // zero unless the Locker is timed
	stack []uintptr // nil unless WithStacks
}

// prepare checks ctx and fills r, whose shard and tag are set, with the
// call's owner and, if they will be looked at, its time and stack. op names
// the caller in errors.
func (l *Locker[K]) prepare(ctx context.Context, op string, key K, r *request[K]) error {
	if ctx == nil {
		panic("fairlock: " + op + " with a nil context")
	}
	if err := ctx.Err(); err != nil {
		_, err = l.fail(ctx, op, key, 0, contextError(ctx), 0)
		return err
	}
	if key != key {
		_, err := l.fail(ctx, op, key, 0, ErrInvalidKey, 0)
		return err
	}
	r.id, r.now = owner.Of(ctx), l.now()
	if l.dbg != nil && l.dbg.stacks {
		r.stack = captureStack()
	}
	return nil
}

// TryLock locks key for the owner of ctx if it can do so at once: the key
// is neither held nor awaited. It never blocks (beyond the shard mutex) and
// never overtakes a queued waiter.
//
// TryLock returns an error wrapping the context's error if ctx is already
// done, ErrReentrant if the owner holds key, ErrWouldBlock if someone else
// holds it or waits for it, ErrClosed if the Locker is closed, and
// ErrInvalidKey if key is not equal to itself (a NaN). It allocates nothing
// on success; a refusal allocates its error, the *LockError and the key
// boxed in it (two objects, 80 bytes for a string key on 64-bit platforms:
// BenchmarkTryLockHeld), so a caller that polls TryLock in a loop pays
// that per refused try.
func (l *Locker[K]) TryLock(ctx context.Context, key K) (Guard[K], error) {
	s, tag := l.shardOf(key)
	if g, ok := l.lockFast(ctx, s, key); ok {
		return g, nil
	}
	return l.tryLockSlow(ctx, key, s, tag)
}

// tryLockSlow is TryLock's path under the shard mutex.
func (l *Locker[K]) tryLockSlow(ctx context.Context, key K, s *shard[K], tag uint64) (Guard[K], error) {
	r := request[K]{s: s, tag: tag}
	if err := l.prepare(ctx, "TryLock", key, &r); err != nil {
		return Guard[K]{}, err
	}
	s.lock()
	e := s.find(key, r.tag)
	var err error
	switch {
	case s.closed:
		err = ErrClosed
	case e != nil && e.holder == r.id:
		err = ErrReentrant
	case e != nil:
		err = ErrWouldBlock
	default:
		g := s.grantNew(key, &r)
		s.unlock()
		if l.obs != nil {
			l.obs.Acquire(Acquired, 0)
		}
		return g, nil
	}
	s.unlock()
	return l.fail(ctx, "TryLock", key, r.id, err, 0)
}

// grantNew makes key's entry with id as its holder. s.mu is held and key
// has no entry.
func (s *shard[K]) grantNew(key K, r *request[K]) Guard[K] {
	e := s.newEntry(key)
	s.insert(e, r.tag)
	s.gen++
	e.grant(r.id, s.gen, r.now, r.stack)
	return Guard[K]{s: s, gen: e.gen, key: key}
}

// lockHeld is Lock's path when key has an entry (held) or the shard is
// closed. s.mu is held on entry and released before it returns.
func (l *Locker[K]) lockHeld(ctx context.Context, e *entry[K], key K, r *request[K]) (Guard[K], error) {
	s, id, now := r.s, r.id, r.now
	switch {
	case s.closed:
		s.unlock()
		return l.fail(ctx, "Lock", key, id, ErrClosed, 0)
	case e.holder == id:
		s.unlock()
		return l.fail(ctx, "Lock", key, id, ErrReentrant, 0)
	}
	if l.detector != nil {
		if cycle := l.detector.enqueue(key, e.holder, id); cycle != nil {
			s.unlock()
			return l.refuseDeadlock(ctx, key, id, cycle)
		}
	}
	w := waiterPool.Get().(*waiter)
	w.Value = waitState{owner: id, since: now, stack: r.stack}
	e.waiters.PushBack(w)
	s.waiting++
	s.unlock()

	done := ctx.Done()
	if done == nil {
		<-w.Ready() // ctx never ends: a plain receive costs less than a select
	} else {
		select {
		case <-w.Ready():
		case <-done:
			s.lock()
			if w.Value.outcome == waiting {
				// Still queued: leave the queue. The key keeps its holder, so
				// the entry stays.
				e.waiters.Remove(w)
				s.waiting--
				if l.detector != nil {
					l.detector.leave(key, id, e.waiters.Len() > 0)
				}
				s.unlock()
				releaseWaiter(w)
				return l.fail(ctx, "Lock", key, id, contextError(ctx), since(now))
			}
			// Granted or closed in the same instant. The decider signals after
			// releasing s.mu (and, one time in yieldEvery, a yield); take its
			// signal so w can be reused.
			s.unlock()
			<-w.Ready()
		}
	}

	out, gen := w.Value.outcome, w.Value.gen
	releaseWaiter(w)
	if out == closedOut {
		return l.fail(ctx, "Lock", key, id, ErrClosed, since(now))
	}
	g := Guard[K]{s: s, gen: gen, key: key}
	// Granted. If ctx ended meanwhile, give the grant back through the
	// internal hand-off so the next waiter runs, and report the context's
	// error: the caller holds nothing (as x/sync/semaphore does).
	if done != nil {
		select {
		case <-done:
			g.release(false)
			return l.fail(ctx, "Lock", key, id, contextError(ctx), since(now))
		default:
		}
	}
	if l.obs != nil {
		l.obs.Acquire(Acquired, since(now))
	}
	return g, nil
}

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

// fail builds the error for a call that did not get the lock, counts it
// and reports it to the observer.
func (l *Locker[K]) fail(ctx context.Context, op string, key K, id owner.ID, err error, waited time.Duration) (Guard[K], error) {
	if id == 0 {
		id = owner.Of(ctx)
	}
	if err == ErrReentrant {
		l.reentrant.Add(1)
	}
	if l.obs != nil {
		l.obs.Acquire(resultOf(err), waited)
	}
	return Guard[K]{}, &LockError{Op: op, Key: key, Owner: id, Err: err, render: l.renderAny}
}

// release ends the grant g holds, if it is still current, and hands the key
// to the head waiter. It reports whether g was current. report says whether
// the observer hears of the release (not for a grant given back unused).
//
// Fairness policy. A release never makes the key free while anyone waits:
// ownership passes under the shard mutex to the waiter at the head of the
// key's queue, which is then woken. A Lock or TryLock that arrives in the
// instant between this hand-off and the waiter running finds the key held
// and queues behind it. This is strict FIFO, sync.Mutex's starvation mode
// made permanent (golang.org/issue/13086 describes that mode). Its cost
// against barging is throughput on a hot key: every hand-off waits for a
// goroutine wake-up (a few microseconds) during which the key is held but
// idle, where a barging mutex would let an already-running goroutine take
// it. In exchange no waiter is ever overtaken, so the wait of the n'th
// waiter is bounded by n hold times plus n wake-ups.
func (g Guard[K]) release(report bool) bool {
	s := g.s
	l := s.l
	tag, now := l.tagOf(g.key), l.now()
	s.lock()
	e := s.find(g.key, tag)
	if e == nil || e.gen != g.gen {
		s.unlock()
		return false
	}
	var grantedAt time.Time
	if e.hold != nil {
		grantedAt = e.hold.grantedAt
	}
	next := s.handOff(e, now)
	yield := next != nil && s.handOffs%yieldEvery == 0
	s.unlock()
	if next != nil {
		if yield && runtime.GOMAXPROCS(0) == 1 {
			runtime.Gosched()
		}
		next.Signal()
	}
	if report && l.obs != nil {
		l.obs.Release(now.Sub(grantedAt))
	}
	return true
}

// yieldEvery is how often, in hand-offs of a shard, a release yields its
// processor before it wakes the waiter it handed the key to, when the
// program runs on one processor (GOMAXPROCS=1).
//
// Why. Waking a goroutine puts it in the waker's runnext slot, which the Go
// scheduler runs before its run queues and on the waker's time slice. On a
// hot key every release wakes the next holder, who releases and wakes the
// next, so the holders form a chain that keeps the processor. Goroutines
// that are runnable but not queued here wait in a run queue until the chain
// breaks: one preempted between its Unlock and its next Lock, or one woken
// from the shard mutex and pushed out of runnext by the next wake-up. The
// scheduler's own remedy, a look at the global run queue every 61
// schedules (schedule in runtime/proc.go), seldom comes, because the chain
// runs on one inherited time slice. With GOMAXPROCS=1 (a one-CPU machine,
// or uber-go/automaxprocs under a one-CPU quota), 10 of 14 runs of 32
// goroutines on a hot key saw a maximum wait of 10 to 51 ms, where the
// queue itself turns over in 0.1 ms, and execution traces showed a
// goroutine preempted after its Unlock run again 75 and 173 ms later.
//
// A yield before the wake-up leaves runnext empty, so the scheduler serves
// its run queues, those goroutines reach the key's queue, and the chain
// resumes with the holder it was handed to (granted already, woken after
// the yield). TestHandOffChainLetsRunQueueIn checks the bound.
//
// With more processors, idle ones take runnable goroutines from the chain's
// run queue, so the chain starves nobody for long (one trace with two
// processors showed a 5 ms wait of this kind, while the other processor's
// thread was off the CPU), and a yield costs a thread wake-up (Gosched
// wakes an idle processor). Yielding there too was measured
// (docs/performance.md): 4% more hot-key throughput, but more
// multi-millisecond stalls with 128 goroutines on the 2-core CI machine,
// so it is not done. Nor is a yield of the thread (sched_yield(2)): it
// removed most 4 ms stalls on the idle CI machine, but beside CPU-bound
// neighbours it gave them CPU time or took it from them depending on how
// often it ran ("A kernel-level yield" in docs/performance.md).
//
// Cost with one processor: one runtime.Gosched per yieldEvery hand-offs, a
// few hundred nanoseconds, and nothing to wake; with more, a read of
// GOMAXPROCS per yieldEvery hand-offs.
const yieldEvery = 64

// handOff ends e's current grant: the head waiter becomes the holder and is
// returned for the caller to signal once s.mu is released, or, with no
// waiter, the entry is deleted and recycled. s.mu is held.
func (s *shard[K]) handOff(e *entry[K], now time.Time) *waiter {
	w := e.waiters.PopFront()
	if w == nil {
		s.remove(e)
		return nil
	}
	s.waiting--
	s.gen++
	s.handOffs++
	e.grant(w.Value.owner, s.gen, now, w.Value.stack)
	w.Value.outcome, w.Value.gen = granted, s.gen
	if d := s.l.detector; d != nil {
		d.handOff(e.key, e.holder, e.waiters.Len() > 0)
	}
	return w
}

// remove deletes the idle entry e and recycles it. s.mu is held.
func (s *shard[K]) remove(e *entry[K]) {
	s.delete(e)
	hold := e.hold
	*e = entry[K]{}
	if hold != nil {
		*hold = holdInfo{}
		e.hold = hold
	}
	if len(s.free) < maxFree {
		s.free = append(s.free, e)
	}
	if s.live == 0 && s.closed {
		s.l.shardDrained()
	}
}

// Locked reports whether key is held at this instant. It takes one shard
// mutex and allocates nothing.
func (l *Locker[K]) Locked(key K) bool {
	s, tag := l.shardOf(key)
	s.lock()
	ok := s.find(key, tag) != nil
	s.unlock()
	return ok
}

// Waiters returns the number of Lock calls queued on key at this instant,
// not counting the holder. It takes one shard mutex and allocates nothing.
func (l *Locker[K]) Waiters(key K) int {
	s, tag := l.shardOf(key)
	s.lock()
	n := 0
	if e := s.find(key, tag); e != nil {
		n = e.waiters.Len()
	}
	s.unlock()
	return n
}

// Len returns the number of keys that have a holder or a waiter (every
// awaited key has a holder). It is 0 once all work is done, whatever was
// cancelled. It takes each shard mutex in turn, so it is a sum of
// per-shard instants, not one snapshot.
func (l *Locker[K]) Len() int {
	return l.stats().Keys
}

// stats sums the live counts over the shards.
func (l *Locker[K]) stats() Stats {
	var st Stats
	for i := range l.shards {
		s := &l.shards[i]
		s.lock()
		st.Keys += s.live
		st.Waiters += s.waiting
		s.unlock()
	}
	return st
}

// Close closes the Locker: later Lock and TryLock calls return ErrClosed,
// and queued waiters wake with ErrClosed at once. Close then waits until
// every holder has unlocked or ctx is done, whichever comes first; on ctx's
// end it returns an error wrapping ctx's error and naming how many keys are
// still held (they may still be unlocked later). It stops the Locker's
// watchdog goroutine, unregisters it from package debug and its Observer,
// and is safe to call more than once and concurrently; each call waits as
// described. A nil ctx means context.Background.
func (l *Locker[K]) Close(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	l.closeOnce.Do(l.close)
	select {
	case <-l.drained:
		return nil
	default:
	}
	select {
	case <-l.drained:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("fairlock: Close of %s: %d keys still held: %w", l.name, l.Len(), contextError(ctx))
	}
}

func (l *Locker[K]) close() {
	l.closing.Store(true)
	l.draining.Store(1) // Close's own count, dropped after the walk
	var woken []*waiter
	for i := range l.shards {
		s := &l.shards[i]
		s.lock()
		s.closed = true
		for e := range s.entries() {
			for w := e.waiters.PopFront(); w != nil; w = e.waiters.PopFront() {
				w.Value.outcome = closedOut
				woken = append(woken, w)
				if l.detector != nil {
					l.detector.leave(e.key, w.Value.owner, e.waiters.Len() > 0)
				}
			}
		}
		s.waiting = 0
		if s.live > 0 {
			l.draining.Add(1)
		}
		s.unlock()
	}
	for _, w := range woken {
		w.Signal()
	}
	if l.dbg != nil {
		l.dbg.stop()
	}
	if l.obs != nil {
		l.obs.Unregister()
	}
	l.shardDrained() // Close's own count
}

// shardDrained drops the count of shards Close waits for.
func (l *Locker[K]) shardDrained() {
	if l.draining.Add(-1) == 0 {
		close(l.drained)
	}
}

// captureStack records the caller of Lock or TryLock and up to 31 frames
// above it. It is called from prepare: skip Callers, captureStack, prepare,
// lockSlow or tryLockSlow, and Lock or TryLock.
func captureStack() []uintptr {
	pcs := make([]uintptr, 32)
	return pcs[:runtime.Callers(5, pcs)]
}
