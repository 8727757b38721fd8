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
	"weak"

	"github.com/fairlock/fairlock/internal/ctxerr"
)

// table is what a Locker and a Semaphore are made of: keys hashed onto
// shards of per-key state machines (entry), each key with size units,
// and the options around them: its lifecycle (init, Close), and the
// deadlock detector, observer and debug state that the per-key protocol
// (entry.go) reports to.
type table[K comparable] struct {
	seed   maphash.Seed
	shards []shard[K]
	mask   uint64
	size   int64 // units per key: lockerUnits for a Locker, n for a Semaphore
	kind   kind  // a Locker or a Semaphore

	name      string
	logger    *slog.Logger
	keyFormat func(K) string   // WithKeyFormatter, or nil
	renderAny func(any) string // renders a K held in an any, for errors: the formatter's; nil without one (renderKey)
	timed     bool             // read the clock on grant/release: debug or observer on
	stacks    bool             // WithStacks
	obs       LockerObserver   // nil without WithObserver
	dbg       *debugState      // nil without WithDebug
	detector  *detector[K]     // nil without WithDeadlockDetection

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

// kind tells a Locker's table from a Semaphore's.
type kind uint8

const (
	lockerKind kind = iota
	semaphoreKind
)

// String returns "Locker" or "Semaphore", the kind's name in debug output.
func (k kind) String() string {
	if k == semaphoreKind {
		return "Semaphore"
	}
	return "Locker"
}

// lockerUnits is a Locker key's size: a Lock takes all of it, an RLock one
// unit, so readers can never fill it.
const lockerUnits = 1<<63 - 1

// tables counts tables made, for default names.
var tables atomic.Int64

// init sets up t for keys of size units with opts. It registers t with
// package debug and its Observer last, once t is complete, since from
// then on other goroutines read it.
func (t *table[K]) init(k kind, size int64, opts []Option) {
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
	t.size, t.kind = size, k
	t.name, t.logger = cfg.name, cfg.logger
	t.drained = make(chan struct{})
	if cfg.keyFormat != nil {
		f, ok := cfg.keyFormat.(func(K) string)
		if !ok {
			panic(fmt.Sprintf("fairlock: WithKeyFormatter given a %T for a %v of %v keys", cfg.keyFormat, k, reflect.TypeFor[K]()))
		}
		t.keyFormat = f
		t.renderAny = func(k any) string {
			if key, ok := k.(K); ok {
				return t.keyText(key)
			}
			return renderKey(k)
		}
	}
	// Without a formatter renderAny stays nil: keyText then renders a
	// string key itself, so that a long one is cut inside its quotes.
	if cfg.deadlocks {
		t.detector = newDetector[K](k == semaphoreKind)
	}
	t.timed = cfg.observer != nil || cfg.debug
	t.stacks = cfg.stacks
	// The deadlock detector needs no fast path of its own: it tracks only
	// awaited keys, and a waiter inflates a fast grant before it asks.
	for i := range t.shards {
		s := &t.shards[i]
		s.t, s.idx, s.books.size = t, uint32(i), size
		if t.timed {
			s.books.infos = infoFree{} // not nil: timed (no allocation)
			s.state.Store(slowBit)     // for good: see the fast path in shard.go
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

// shardOf returns key's shard and its tag there (the key's hash, never 0).
// A call hashes its key once: a fast claim stores the tag for inflate,
// and only an Unlock that takes the shard mutex hashes the key again (see
// Guard). It panics with notMade on a zero Locker or Semaphore: the test
// takes the place of the index's bounds check, so it costs nothing.
func (t *table[K]) shardOf(key K) (*shard[K], uint64) {
	h := maphash.Comparable(t.seed, key)
	i := h & t.mask
	if i >= uint64(len(t.shards)) {
		panic(notMade)
	}
	return &t.shards[i], h | 1
}

// tagOf returns key's tag in its shard, as shardOf does.
func (t *table[K]) tagOf(key K) uint64 { return maphash.Comparable(t.seed, key) | 1 }

// notMade is the panic of a call on the zero Locker or Semaphore.
const notMade = "fairlock: a Locker or Semaphore not made by New or NewSemaphore (the zero value is not usable)"

// now reads the clock only when someone will look at the time.
func (t *table[K]) now() time.Time {
	if t.timed {
		return time.Now()
	}
	return time.Time{}
}

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
			// A key with waiters has holders, so settle removes no entry.
			for w := t.settle(s, e, change{decided: e.close()}); w != nil; {
				next := w.Value.next // add clears it
				all.add(w)
				w = next
			}
		}
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
