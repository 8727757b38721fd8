package fairlock

import (
	"context"
	"errors"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/owner"
)

// TestContextEndedWhileWaitingForShardMutex: a call whose context ends
// while it waits to take the shard mutex is refused once it has it, even
// on a free key (x/sync/semaphore's Acquire does the same). The wait is
// made deterministic with a fast claim held unpublished: lock backs off
// until the test publishes it, after cancelling the context.
func TestContextEndedWhileWaitingForShardMutex(t *testing.T) {
	l := New[string](WithShards(1))
	defer l.Close(context.Background())
	s := &l.t.shards[0]
	const token = 7
	s.state.Store(token<<tokenShift | heldBit | claimingBit) // another key's claim, mid-publish

	ctx, cancel := context.WithCancel(context.Background())
	backingOff := make(chan struct{}, 1)
	testHookClaimWait = func() {
		select {
		case backingOff <- struct{}{}:
		default:
		}
	}
	defer func() { testHookClaimWait = nil }()
	res := make(chan error, 1)
	go func() {
		g, err := l.Lock(ctx, "free")
		if err == nil {
			g.Unlock()
		}
		res <- err
	}()
	<-backingOff // Lock passed its early context check and waits for the shard
	cancel()
	s.fastKey, s.fastTag, s.fastOwner, s.fastUnits = "other", l.t.tagOf("other"), owner.Goroutine(), lockerUnits
	s.state.Store(token<<tokenShift | heldBit)
	err := <-res
	Guard[string]{s: s, token: token, key: "other"}.Unlock()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock whose context ended while it waited for the shard mutex: %v, want context.Canceled", err)
	}
	if l.Len() != 0 {
		t.Fatalf("Len = %d", l.Len())
	}
}

// TestClaimWaitBacksOff: a mutex-side call that finds a fast claim
// unpublished (its claimant preempted between two stores) yields a few
// times, then sleeps with growing back-off instead of spinning on
// runtime.Gosched for as long as the claimant is off the CPU.
func TestClaimWaitBacksOff(t *testing.T) {
	l := New[string](WithShards(1))
	defer l.Close(context.Background())
	s := &l.t.shards[0]
	const token = 3
	s.state.Store(token<<tokenShift | heldBit | claimingBit)
	var tries atomic.Int64
	testHookClaimWait = func() { tries.Add(1) }
	defer func() { testHookClaimWait = nil }()
	done := make(chan bool)
	go func() { done <- l.Locked("k") }()
	// Long enough for the back-off to reach its cap: 4 yields, then sleeps
	// of 1µs, 2µs … 1ms (about 2ms in all), then 1ms each.
	const hold = 50 * time.Millisecond
	time.Sleep(hold)
	s.fastKey, s.fastTag, s.fastOwner, s.fastUnits = "k", l.t.tagOf("k"), owner.Goroutine(), lockerUnits
	s.state.Store(token<<tokenShift | heldBit)
	locked := <-done
	Guard[string]{s: s, token: token, key: "k"}.Unlock()
	if !locked {
		t.Fatal("Locked(k) = false once the claim was published")
	}
	// Sleeping backs off to one try per millisecond: at most a few dozen
	// tries over the hold, where a Gosched loop makes thousands.
	if n := tries.Load(); n > claimYields+maxClaimBackoff+int64(hold/time.Millisecond)+20 {
		t.Fatalf("%d tries while the claim was unpublished for %v: no back-off", n, hold)
	}
}

// TestDetectorGivesMemoryBack: the detector's maps, which only shrink by
// deletion, are made anew once a peak of awaited keys is gone, as the
// shard's overflow map is (Lifecycle: a map that grew large is rebuilt
// once it empties).
func TestDetectorGivesMemoryBack(t *testing.T) {
	l := New[int](WithDeadlockDetection())
	defer l.Close(context.Background())
	ctx := context.Background()
	const keys = 3 * shrinkAt
	var guards []Guard[int]
	for k := range keys {
		g, err := l.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		guards = append(guards, g)
	}
	var wg sync.WaitGroup
	for k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := l.Lock(ctx, k)
			if err == nil {
				g.Unlock()
			}
		}()
	}
	d := l.t.detector
	for {
		d.mu.Lock()
		n := len(d.waits)
		d.mu.Unlock()
		if n == keys {
			break
		}
		runtime.Gosched()
	}
	d.mu.Lock()
	before := d.holders
	d.mu.Unlock()
	for _, g := range guards {
		g.Unlock()
	}
	wg.Wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.holders) != 0 || len(d.waits) != 0 {
		t.Fatalf("detector keeps %d keys and %d waiting owners when idle", len(d.holders), len(d.waits))
	}
	// Made anew at an eighth of the peak, the maps are made anew again
	// once they empty: no size between the peak and zero is kept.
	if same(before, d.holders) || d.peak != 0 {
		t.Fatalf("the detector's maps were not made anew after a peak of %d awaited keys (kept a map made for %d)", keys, d.peak)
	}
}

// same reports whether two maps are one map.
func same[K comparable, V any](a, b map[K]V) bool {
	return reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

// TestProcsRefreshedOffTheReleasePath: the release path reads a cached
// GOMAXPROCS; the cache follows a change within procsRefreshEvery queued
// waits of a shard, refreshed by waiters that are about to block.
func TestProcsRefreshedOffTheReleasePath(t *testing.T) {
	prev := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(prev)
	l := New[string](WithShards(1))
	defer l.Close(context.Background())
	runtime.GOMAXPROCS(prev + 1)
	if got := procs.Load(); got != int32(prev) {
		t.Fatalf("procs = %d before any wait, want the value cached by New, %d", got, prev)
	}
	ctx := context.Background()
	g, _ := l.Lock(ctx, "k")
	for range procsRefreshEvery {
		done := make(chan struct{})
		go func() {
			defer close(done)
			g2, err := l.Lock(ctx, "k")
			if err == nil {
				g2.Unlock()
			}
		}()
		for l.Waiters("k") != 1 {
			runtime.Gosched()
		}
		g.Unlock()
		<-done
		g, _ = l.Lock(ctx, "k")
	}
	g.Unlock()
	if got := procs.Load(); got != int32(prev+1) {
		t.Fatalf("procs = %d after %d waits, want %d", got, procsRefreshEvery, prev+1)
	}
}

// TestWatchdogVisitsOnlyLiveShards: the live-shard bitmap the watchdog
// walks has exactly the bits of the shards that hold keys.
func TestWatchdogVisitsOnlyLiveShards(t *testing.T) {
	l := New[int](WithShards(256), WithLongHeld(time.Hour))
	defer l.Close(context.Background())
	ctx := context.Background()
	bits := func() (n int) {
		for i := range l.t.dbg.liveShards {
			for w := l.t.dbg.liveShards[i].Load(); w != 0; w &= w - 1 {
				n++
			}
		}
		return n
	}
	if n := bits(); n != 0 {
		t.Fatalf("%d live bits on an idle Locker", n)
	}
	var guards []Guard[int]
	shards := map[*shard[int]]bool{}
	for k := range 40 {
		g, _ := l.Lock(ctx, k)
		guards = append(guards, g)
		s, _ := l.t.shardOf(k)
		shards[s] = true
	}
	n := bits()
	for _, g := range guards {
		g.Unlock()
	}
	if n != len(shards) {
		t.Fatalf("%d live bits for %d shards with held keys", n, len(shards))
	}
	if n := bits(); n != 0 {
		t.Fatalf("%d live bits once every key is released", n)
	}
}

// TestUnclosedLockerIsReleased: a Locker with debug, a watchdog and an
// observer that is dropped without Close leaves the debug registry, is
// unregistered from its observer, and its watchdog goroutine exits.
func TestUnclosedLockerIsReleased(t *testing.T) {
	obs := &countingObserver{}
	func() {
		l := New[string](WithName("dropped"), WithLongHeld(time.Millisecond), WithObserver(obs))
		g, _ := l.Lock(context.Background(), "k")
		g.Unlock()
	}()
	deadline := time.Now().Add(time.Minute)
	for {
		runtime.GC()
		registered := false
		for _, n := range registry.Names() {
			registered = registered || n == "dropped"
		}
		if !registered && obs.unregistered.Load() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a dropped Locker is still registered (%v) or not unregistered from its observer (%d)", registered, obs.unregistered.Load())
		}
		time.Sleep(time.Millisecond)
	}
	// goleak, in TestMain, checks that the watchdog goroutine is gone.
}

type countingObserver struct{ unregistered atomic.Int64 }

func (o *countingObserver) Register(string, func() Stats) LockerObserver { return o }
func (o *countingObserver) Acquire(Result, time.Duration)                {}
func (o *countingObserver) Release(time.Duration)                        {}
func (o *countingObserver) Unregister()                                  { o.unregistered.Add(1) }

// TestRegisterSeesACompleteLocker: an Observer may collect at once from
// Register (a periodic reader, a scrape): stats must read complete shards.
// Under -race, registering before the shards are set up is reported.
func TestRegisterSeesACompleteLocker(t *testing.T) {
	obs := &eagerObserver{}
	for range 20 {
		l := New[string](WithObserver(obs))
		s := NewSemaphore[string](2, WithObserver(obs))
		obs.wg.Wait()
		l.Close(context.Background())
		s.Close(context.Background())
	}
}

// eagerObserver reads stats from another goroutine as soon as Register
// is called.
type eagerObserver struct {
	countingObserver
	wg sync.WaitGroup
}

func (o *eagerObserver) Register(_ string, stats func() Stats) LockerObserver {
	o.wg.Add(1)
	go func() {
		defer o.wg.Done()
		for range 10 {
			if st := stats(); st.Keys != 0 {
				panic("keys in a new Locker")
			}
		}
	}()
	return o
}

// errProbeCtx is a caller's context whose Err method, once armed, checks
// whether the call's shard mutex is free: it asks Locked, on the same
// (only) shard, from another goroutine.
type errProbeCtx struct {
	context.Context
	l       *Locker[string]
	armed   atomic.Bool
	underMu atomic.Bool
}

func (c *errProbeCtx) Err() error {
	if c.armed.Load() {
		done := make(chan struct{})
		go func() { c.l.Locked("other"); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			c.underMu.Store(true) // Locked could not take the shard mutex: the caller holds it
		}
	}
	return c.Context.Err()
}

// TestContextMethodsRunOutsideShardMutex: the context of a call that ends
// while the call waits for the shard mutex has its Err (and Value, through
// context.Cause) called only after the mutex is released: they are the
// caller's code, and may take locks of their own or call the Locker.
func TestContextMethodsRunOutsideShardMutex(t *testing.T) {
	l := New[string](WithShards(1))
	defer l.Close(context.Background())
	s := &l.t.shards[0]
	const token = 5
	s.state.Store(token<<tokenShift | heldBit | claimingBit) // a claim mid-publish on another key
	inner, cancel := context.WithCancel(context.Background())
	ctx := &errProbeCtx{Context: inner, l: l}
	backingOff := make(chan struct{}, 1)
	testHookClaimWait = func() {
		select {
		case backingOff <- struct{}{}:
		default:
		}
	}
	defer func() { testHookClaimWait = nil }()
	res := make(chan error, 1)
	go func() { _, err := l.Lock(ctx, "k"); res <- err }()
	<-backingOff // past the early context check, waiting for the shard
	cancel()
	ctx.armed.Store(true)
	s.fastKey, s.fastTag, s.fastOwner, s.fastUnits = "other", l.t.tagOf("other"), owner.Goroutine(), lockerUnits
	s.state.Store(token<<tokenShift | heldBit)
	err := <-res
	Guard[string]{s: s, token: token, key: "other"}.Unlock()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock: %v, want context.Canceled", err)
	}
	if ctx.underMu.Load() {
		t.Fatal("the context's Err method ran while the call held the shard mutex")
	}
}

// TestManyReaders: thousands of shared holders of one key, released in an
// order unlike their grants', keep the books right: the key stays held
// until the last leaves, a writer queued behind them is granted then, and
// the holders' owner index (kept while they are many) is dropped.
func TestManyReaders(t *testing.T) {
	for _, opts := range [][]Option{nil, {WithDeadlockDetection()}} {
		l := New[string](opts...)
		ctx := context.Background()
		const n = 5000
		guards := make([]Guard[string], n)
		for i := range guards {
			g, err := l.RLock(owner.NewContext(ctx), "k")
			if err != nil {
				t.Fatal(err)
			}
			guards[i] = g
		}
		reader := owner.NewContext(ctx)
		g0, err := l.RLock(reader, "k")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.RLock(reader, "k"); !errors.Is(err, ErrReentrant) {
			t.Fatalf("a reader among %d, again: %v", n, err)
		}
		s, tag := l.t.shardOf("k")
		s.lock()
		indexed := s.find("k", tag).indexed
		s.unlock()
		if !indexed {
			t.Fatalf("no owner index for %d holders", n)
		}
		writer := make(chan error, 1)
		go func() {
			g, err := l.Lock(owner.NewContext(ctx), "k")
			if err == nil {
				g.Unlock()
			}
			writer <- err
		}()
		for l.Waiters("k") != 1 {
			runtime.Gosched()
		}
		g0.Unlock()
		// Release every third, then the rest from the back.
		for i := 0; i < n; i += 3 {
			guards[i].Unlock()
		}
		for i := n - 1; i >= 0; i-- {
			if i%3 != 0 {
				if len(writer) != 0 {
					t.Fatalf("the writer was granted with %d readers left", i+1)
				}
				guards[i].Unlock()
			}
		}
		if err := <-writer; err != nil {
			t.Fatal(err)
		}
		if l.Len() != 0 || len(s.owners) != 0 {
			t.Fatalf("Len = %d, owner indexes %d when idle", l.Len(), len(s.owners))
		}
		l.Close(ctx)
	}
}

// TestOverflowMapShrinksAroundAHeldKey: one key held long does not keep a
// shard's peak-sized overflow map: it is made anew at an eighth of its
// peak, and dropped once the last key is released.
func TestOverflowMapShrinksAroundAHeldKey(t *testing.T) {
	l := New[int](WithShards(1))
	defer l.Close(context.Background())
	ctx := context.Background()
	const keys = 8 * shrinkAt
	guards := make([]Guard[int], keys)
	for k := range guards {
		guards[k], _ = l.Lock(ctx, k)
	}
	s := &l.t.shards[0]
	s.lock()
	peakMap := s.overflow
	s.unlock()
	for _, g := range guards[1:] {
		g.Unlock()
	}
	s.lock()
	remade, n := !same(peakMap, s.overflow), s.live
	s.unlock()
	guards[0].Unlock()
	if !remade || n != 1 {
		t.Fatalf("with 1 of %d keys left: overflow map remade %v, live %d", keys, remade, n)
	}
	s.lock()
	kept, peak := s.overflow != nil, s.peak
	s.unlock()
	if kept {
		t.Fatalf("an idle shard keeps the overflow map made anew for %d keys", peak)
	}
}

// TestCrowdOfReadersGivesMemoryBack: a key read by a crowd and then held by
// few keeps neither the crowd's holders slice nor its owner index, and a
// shard whose keys were read by many keeps no map of owner indexes once
// they are gone (Lifecycle: memory does not stay at a peak).
func TestCrowdOfReadersGivesMemoryBack(t *testing.T) {
	const crowd, stay = 2000, 10
	l := New[string](WithShards(1))
	defer l.Close(context.Background())
	ctx := context.Background()
	guards := make([]Guard[string], crowd)
	defer func() { // on failure, before Close: Unlock is idempotent
		for _, g := range guards {
			g.Unlock()
		}
	}()
	for i := range guards {
		g, err := l.RLock(owner.NewContext(ctx), "k")
		if err != nil {
			t.Fatal(err)
		}
		guards[i] = g
	}
	s, tag := l.t.shardOf("k")
	holders := func() (n, capacity int, indexes int) {
		s.lock()
		defer s.unlock()
		e := s.find("k", tag)
		return e.holding(), cap(e.holders), len(s.owners)
	}
	if _, _, idx := holders(); idx != 1 {
		t.Fatalf("%d readers: %d owner indexes, want 1", crowd, idx)
	}
	for _, g := range guards[stay:] {
		g.Unlock()
	}
	if n, c, _ := holders(); n != stay || c > crowd/8 {
		t.Fatalf("%d of %d readers left: %d holders in a slice of capacity %d", stay, crowd, n, c)
	}
	s.lock()
	ix := s.owners[s.find("k", tag)]
	s.unlock()
	if ix == nil {
		t.Fatalf("%d of %d readers left: no owner index", stay, crowd)
	}
	if len(ix.counts) != stay || ix.peak > crowd/8 {
		t.Fatalf("%d of %d readers left: an owner index of %d owners, made at a peak of %d; want one made anew", stay, crowd, len(ix.counts), ix.peak)
	}
	// A writer queues behind the last readers and is granted once they go:
	// the key stays live throughout.
	writer := make(chan Guard[string], 1)
	go func() {
		g, err := l.Lock(owner.NewContext(ctx), "k")
		if err != nil {
			t.Error(err)
		}
		writer <- g
	}()
	for l.Waiters("k") != 1 {
		runtime.Gosched()
	}
	for _, g := range guards[:stay] {
		g.Unlock()
	}
	w := <-writer
	defer w.Unlock()
	n, c, idx := holders()
	if n != 1 || c > maxKeptHolders || idx != 0 {
		t.Fatalf("the writer after a crowd: %d holders, slice capacity %d, %d owner indexes", n, c, idx)
	}
	s.lock()
	kept := s.owners != nil
	s.unlock()
	if kept {
		t.Fatal("the shard keeps its map of owner indexes with no index in it")
	}
	w.Unlock()
	if l.Len() != 0 {
		t.Fatalf("Len = %d when idle", l.Len())
	}
}

// TestReleasedFastKeyIsLetGo: a shard's reference to the last key granted
// on its lock-free path goes once the shard is next used by another key,
// and at Close: a pointer key's object is then collected.
func TestReleasedFastKeyIsLetGo(t *testing.T) {
	type account struct{ _ [1 << 16]byte } // large enough to be its own allocation
	l := New[*account](WithShards(1))
	ctx := context.Background()
	var collected [2]atomic.Bool
	lockOnce := func(i int) {
		a := new(account)
		runtime.AddCleanup(a, func(i int) { collected[i].Store(true) }, i)
		g, err := l.Lock(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		g.Unlock()
	}
	gone := func(i int) bool {
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			if collected[i].Load() {
				return true
			}
			runtime.GC()
			time.Sleep(time.Millisecond) // cleanups run on their own goroutine
		}
		return collected[i].Load()
	}
	lockOnce(0)
	lockOnce(1) // the shard's next use: by another key
	if !gone(0) {
		t.Error("the first key is still reachable after another key used its shard")
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !gone(1) {
		t.Error("the last key is still reachable after Close")
	}
	runtime.KeepAlive(l)
}
