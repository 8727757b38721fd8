package fairlock

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/fairlock/fairlock/internal/ctxerr"
	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/waitqueue"
)

// table is what a Locker and a Semaphore are made of: keys hashed onto
// shards of per-key state machines (entry), each key with size units,
// and the options around them. It runs the grant and release protocol and
// tells the deadlock detector, the observer and debug of its results.
type table[K comparable] struct {
	seed   maphash.Seed
	shards []shard[K]
	mask   uint64
	size   int64  // units per key: lockerUnits for a Locker, n for a Semaphore
	kind   string // "Locker" or "Semaphore", for debug output

	name      string
	logger    *slog.Logger
	keyFormat func(K) string   // WithKeyFormatter, or nil
	renderAny func(any) string // renders a K held in an any: for errors
	timed     bool             // read the clock on grant/release: debug or observer on
	stacks    bool             // WithStacks
	obs       LockerObserver   // nil without WithObserver
	dbg       *debugState      // nil without WithDebug
	detector  *detector[K]     // nil without WithDeadlockDetection
	// liveShards has a bit per shard that has live keys, and liveCount
	// counts those shards; only with a long-held watchdog, which walks just
	// those shards and sleeps while there are none.
	liveShards []atomic.Uint64
	liveCount  atomic.Int64

	reentrant     atomic.Int64 // ErrReentrant returns
	doubleUnlocks atomic.Int64 // Unlocks of a Guard already unlocked

	closing  atomic.Bool   // Close has begun: set before it marks any shard
	draining atomic.Int64  // after Close: shards with live keys, +1 while Close walks them
	drained  chan struct{} // closed when draining reaches 0
	// released says who releases the registrations (closer): the Close
	// that sees the table drained, or, if Close gave up waiting first,
	// whoever drains it. See settleRelease.
	released atomic.Uint32
	closer   *closer // what Close and an unreachable table's cleanup release
}

// lockerUnits is a Locker key's size: a Lock takes all of it, an RLock one
// unit, so readers can never fill it.
const lockerUnits = 1<<63 - 1

// tables counts tables made, for default names.
var tables atomic.Int64

// init sets up t for keys of size units with opts. It registers t with
// package debug and its Observer last, once t is complete, since from
// then on other goroutines read it.
func (t *table[K]) init(kind string, size int64, opts []Option) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.name == "" {
		cfg.name = fmt.Sprintf("fairlock-%d", tables.Add(1))
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	t.seed = maphash.MakeSeed()
	t.shards = make([]shard[K], cfg.shards)
	t.mask = uint64(cfg.shards - 1)
	t.size, t.kind = size, kind
	t.name, t.logger = cfg.name, cfg.logger
	t.drained = make(chan struct{})
	if cfg.keyFormat != nil {
		f, ok := cfg.keyFormat.(func(K) string)
		if !ok {
			panic(fmt.Sprintf("fairlock: WithKeyFormatter given a %T for a %s of %v keys", cfg.keyFormat, kind, reflect.TypeFor[K]()))
		}
		t.keyFormat = f
	}
	t.renderAny = func(k any) string {
		if key, ok := k.(K); ok {
			return t.keyText(key)
		}
		return renderKey(k)
	}
	if cfg.deadlocks {
		t.detector = newDetector[K](kind == "Semaphore")
	}
	t.timed = cfg.observer != nil || cfg.debug
	t.stacks = cfg.stacks
	if cfg.debug && cfg.longHeld > 0 {
		t.liveShards = make([]atomic.Uint64, (len(t.shards)+63)/64)
	}
	// The deadlock detector needs no fast path of its own: it tracks only
	// awaited keys, and a waiter inflates a fast grant before it asks.
	fast := !t.timed
	for i := range t.shards {
		s := &t.shards[i]
		s.t, s.fast, s.idx = t, fast, uint32(i)
		if !fast {
			s.state.Store(slowBit) // for good: see the fast path in shard.go
		}
	}
	refreshProcs()

	// Last: registration publishes t. Neither the registry, the watchdog
	// nor the observer's stats keep t reachable (weak pointers), so a
	// table dropped without Close is released by its cleanup.
	t.closer = &closer{}
	wt := weak.Make(t)
	if cfg.observer != nil {
		t.obs = cfg.observer.Register(t.name, func() Stats {
			if t := wt.Value(); t != nil {
				return t.stats()
			}
			return Stats{}
		})
		t.closer.obs = t.obs
	}
	if cfg.debug {
		startDebug(t, cfg)
		t.closer.dbg = t.dbg
	}
	if t.obs != nil || t.dbg != nil {
		runtime.AddCleanup(t, (*closer).release, t.closer)
	}
}

// closer releases what a table registered outside itself: its debug
// registration and watchdog, and its observer. Close stops the watchdog at
// once and releases the rest once the table is drained; the runtime
// releases everything once an unclosed table is unreachable.
type closer struct {
	once sync.Once
	obs  LockerObserver
	dbg  *debugState
}

// stopWatchdog stops the watchdog goroutine, if any.
func (c *closer) stopWatchdog() {
	if c.dbg != nil {
		c.dbg.stopWatchdog()
	}
}

// release stops the watchdog and unregisters from the debug registry and
// the observer, once.
func (c *closer) release() {
	c.once.Do(func() {
		if c.dbg != nil {
			c.dbg.stopWatchdog()
			c.dbg.unregister()
		}
		if c.obs != nil {
			c.obs.Unregister()
		}
	})
}

// keyText renders key for errors, debug output and warnings: with the
// WithKeyFormatter function if one was given, else by renderKey's rules;
// control characters are escaped either way. It may run user code, so it
// is never called with a shard mutex held.
func (t *table[K]) keyText(key K) string {
	if t.keyFormat != nil {
		return escapeNonPrinting(t.keyFormat(key))
	}
	return renderKey(key)
}

// shardOf returns key's shard and its tag there (the key's hash, never 0).
// It panics with notMade on a zero Locker or Semaphore: the test takes the
// place of the index's bounds check, so it costs nothing.
func (t *table[K]) shardOf(key K) (*shard[K], uint64) {
	h := maphash.Comparable(t.seed, key)
	i := h & t.mask
	if i >= uint64(len(t.shards)) {
		panic(notMade)
	}
	return &t.shards[i], h | 1
}

// notMade is the panic of a call on the zero Locker or Semaphore.
const notMade = "fairlock: a Locker or Semaphore not made by New or NewSemaphore (the zero value is not usable)"

// tagOf returns key's tag in its shard.
func (t *table[K]) tagOf(key K) uint64 {
	return maphash.Comparable(t.seed, key) | 1
}

// now reads the clock only when someone will look at the time.
func (t *table[K]) now() time.Time {
	if t.timed {
		return time.Now()
	}
	return time.Time{}
}

// markLive records whether shard i has live keys, for the watchdog, and
// wakes the watchdog when the first shard gets some.
func (t *table[K]) markLive(i uint32, live bool) {
	if t.liveShards == nil {
		return
	}
	word, bit := &t.liveShards[i/64], uint64(1)<<(i%64)
	if !live {
		word.And(^bit)
		t.liveCount.Add(-1)
		return
	}
	word.Or(bit)
	if t.liveCount.Add(1) == 1 {
		select {
		case t.dbg.wake <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// fastGrant grants key for units if its shard is idle in fast mode:
// nothing held or awaited on the shard. It reports false, having changed
// nothing, in every other case, including a nil or done ctx and a key not
// equal to itself (a NaN; for a string key the test is a length and a
// pointer comparison). See the fast path in shard.go.
func (t *table[K]) fastGrant(ctx context.Context, s *shard[K], key K, units int64) (Guard[K], bool) {
	if ctx == nil || ctx.Err() != nil || key != key {
		return Guard[K]{}, false
	}
	if s.state.Load()&(heldBit|slowBit) != 0 {
		return Guard[K]{}, false
	}
	token, ok := s.claim(key, owner.Of(ctx), units) // ctx.Value before the claim: it is the caller's code
	if !ok {
		return Guard[K]{}, false
	}
	return Guard[K]{s: s, gen: token, key: key}, true
}

// acquire is the path of every call that asks for a key under the shard
// mutex: Lock, RLock, Acquire and Wait (blocking) and their Try forms
// (try). r carries the units and whether it is a Wait. A Wait returns the
// zero Guard.
func (t *table[K]) acquire(ctx context.Context, op string, key K, s *shard[K], tag uint64, r request, try bool) (Guard[K], error) {
	if ctx == nil {
		panic("fairlock: " + op + " with a nil context")
	}
	if err := ctx.Err(); err != nil {
		return t.fail(ctx, op, key, 0, ctxerr.Of(ctx), 0, !r.turn)
	}
	if key != key {
		return t.fail(ctx, op, key, 0, ErrInvalidKey, 0, !r.turn)
	}
	r.owner, r.now = owner.Of(ctx), t.now()
	if t.stacks {
		r.stack = captureStack()
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
	case e == nil:
		if r.turn {
			s.unlock() // a free key: the turn is now
			return Guard[K]{}, nil
		}
		e = s.newEntry(key)
		s.insert(e, tag)
		token := e.addHolder(&r, &s.gen, s.infoPool().get(), nil)
		s.unlock()
		return t.granted(s, key, token, 0, true), nil
	case e.holds(r.owner, s.ownerIndex(e)):
		err = ErrReentrant
	case try:
		token, ok := e.admit(&r, t.size, &s.gen, s.infoPool(), s.index(e))
		if !ok {
			err = ErrWouldBlock
			break
		}
		s.unlock()
		return t.granted(s, key, token, 0, !r.turn), nil
	default:
		if token, ok := e.admit(&r, t.size, &s.gen, s.infoPool(), s.index(e)); ok {
			s.unlock()
			return t.granted(s, key, token, 0, !r.turn), nil
		}
		if t.detector != nil {
			if refused := t.detector.wait(key, e.holders, r.owner, !e.tracked); refused != nil {
				s.unlock()
				return t.refuseDeadlock(ctx, op, key, r.owner, refused)
			}
			e.tracked = true
		}
		return t.wait(ctx, op, key, s, e, r)
	}
	s.unlock()
	if err == errContextDone {
		err = ctxerr.Of(ctx)
	}
	return t.fail(ctx, op, key, r.owner, err, 0, !r.turn)
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
	return Guard[K]{s: s, gen: token, key: key}
}

// wait queues r on e and blocks until a grant pass decides it or ctx ends.
// s.mu is held on entry and released before it blocks.
func (t *table[K]) wait(ctx context.Context, op string, key K, s *shard[K], e *entry[K], r request) (Guard[K], error) {
	w := waiterPool.Get().(*waiter)
	w.Value = waitState{request: r}
	e.waiters.PushBack(w)
	s.waiting++
	s.parks++
	refresh := s.parks%procsRefreshEvery == 0
	s.unlock()
	if refresh {
		refreshProcs() // off the hand-off path: this caller is about to wait
	}

	done := ctx.Done()
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
				e.waiters.Remove(w)
				s.waiting--
				if t.detector != nil {
					t.detector.stopWaiting(key, r.owner)
				}
				decided := t.grantPass(s, e, t.now(), 0)
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
	g := Guard[K]{s: s, gen: token, key: key}
	// Granted. If ctx ended meanwhile, give the grant back through the
	// internal release, so the next waiter runs, and report the context's
	// error: the caller holds nothing (as x/sync/semaphore does).
	if isDone(done) {
		g.release(false)
		return t.fail(ctx, op, key, r.owner, ctxerr.Of(ctx), since(r.now), true)
	}
	return t.granted(s, key, token, since(r.now), true), nil
}

// grantPass runs e's grant pass at time now and settles the shard's books
// for what it decided: waiter counts, the detector (if it tracks the key;
// released is the owner whose release led here, or 0), and e's removal
// once it is idle. It returns the decided waiters for the caller to
// signal after s.mu is released. s.mu is held.
func (t *table[K]) grantPass(s *shard[K], e *entry[K], now time.Time, released owner.ID) *waiter {
	decided := e.grant(t.size, &s.gen, now, s.infoPool(), s.index(e))
	n := 0
	for w := decided; w != nil; w = w.Value.next {
		n++
	}
	if n > 0 {
		s.waiting -= n
		s.handOffs++
	}
	if e.tracked {
		e.tracked = e.waiters.Len() > 0
		t.detector.settle(e.key, released, decided, e.tracked)
	}
	if e.idle() {
		s.remove(e)
	}
	return decided
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

// fail builds the error for a call that did not get the key, counts it
// and, if report, tells the observer.
func (t *table[K]) fail(ctx context.Context, op string, key K, id owner.ID, err error, waited time.Duration, report bool) (Guard[K], error) {
	if ctx == nil {
		panic("fairlock: " + op + " with a nil context")
	}
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
	tag := t.tagOf(g.key)
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
	h, ok := e.release(g.gen, s.index(e))
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
	s.dropIndexIfFew(e)
	var grantedAt time.Time
	if h.info != nil {
		grantedAt = h.info.since
		s.infos.put(h.info)
	}
	decided := t.grantPass(s, e, now, h.owner)
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

// locked reports whether key has a holder at this instant.
func (t *table[K]) locked(key K) bool {
	s, tag := t.shardOf(key)
	s.lock()
	e := s.find(key, tag)
	ok := e != nil && e.holding() > 0
	s.unlock()
	return ok
}

// waiters returns the number of calls queued on key at this instant.
func (t *table[K]) waiters(key K) int {
	s, tag := t.shardOf(key)
	s.lock()
	n := 0
	if e := s.find(key, tag); e != nil {
		n = e.waiters.Len()
	}
	s.unlock()
	return n
}

// stats sums the live counts over the shards.
func (t *table[K]) stats() Stats {
	var st Stats
	for i := range t.shards {
		s := &t.shards[i]
		s.lock()
		st.Keys += s.live
		st.Waiters += s.waiting
		s.unlock()
	}
	return st
}

// close implements Close for both faces.
func (t *table[K]) close(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if t.shards == nil {
		panic(notMade)
	}
	if t.closing.CompareAndSwap(false, true) {
		t.closeShards()
	}
	select {
	case <-t.drained:
		t.closer.release()
		return nil
	default:
	}
	select {
	case <-t.drained:
		t.closer.release()
		return nil
	case <-ctx.Done():
	}
	if t.settleRelease(closeGaveUp) {
		t.closer.release() // drained in the meantime
		return nil
	}
	return fmt.Errorf("fairlock: Close of %q: %s still held: %w", t.name, count(t.Len(), "key"), ctxerr.Of(ctx))
}

// count writes n with its noun, singular for one: "1 key", "3 keys".
func count[N ~int | ~int64](n N, one string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %ss", n, one)
}

// The two events after which a closing table's registrations (debug,
// watchdog, observer) are released. They stay while holders remain, so a
// Close stuck on a holder can be looked into through debug output and
// metrics, and every Release reaches the observer before Unregister.
const (
	closeGaveUp  = 1 << iota // a Close returned on its ctx's end
	tableDrained             // the last holder or waiter left a closed table
)

// settleRelease records ev and reports whether the other event had
// already happened: then the caller releases the registrations.
func (t *table[K]) settleRelease(ev uint32) bool {
	other := uint32(closeGaveUp|tableDrained) &^ ev
	return t.released.Or(ev)&other != 0
}

// Len returns the number of live keys; see Locker.Len.
func (t *table[K]) Len() int { return t.stats().Keys }

// closeShards marks every shard closed, decides every waiter closed and
// wakes them, and releases the table's registrations.
func (t *table[K]) closeShards() {
	t.draining.Store(1) // Close's own count, dropped after the walk
	var all decidedList
	for i := range t.shards {
		s := &t.shards[i]
		s.lock()
		s.closed = true
		for e := range s.entries() {
			decided := e.closeWaiters()
			if e.tracked {
				e.tracked = false
				t.detector.settle(e.key, 0, decided, false)
			}
			for w := decided; w != nil; {
				next := w.Value.next // add clears it
				all.add(w)
				w = next
			}
		}
		s.waiting = 0
		if s.live > 0 {
			t.draining.Add(1)
		}
		s.unlock()
	}
	signal(all.first)
	t.closer.stopWatchdog()
	t.shardDrained() // Close's own count
}

// shardDrained drops the count of shards Close waits for.
func (t *table[K]) shardDrained() {
	if t.draining.Add(-1) == 0 {
		close(t.drained)
		if t.settleRelease(tableDrained) {
			// Close gave up before the last holder left; this may run
			// under a shard mutex, and Unregister is the user's code.
			go t.closer.release()
		}
	}
}

// captureStack records the caller of Lock (or RLock, Acquire, Wait and
// their Try forms) and up to 31 frames above it. It is called from
// acquire: skip Callers, captureStack, acquire and the face's method.
func captureStack() []uintptr {
	pcs := make([]uintptr, 32)
	return pcs[:runtime.Callers(4, pcs)]
}
