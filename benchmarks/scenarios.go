package benchmarks

import (
	"context"
	"math"
	"math/rand"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// OpResult is a per-operation cost from testing.Benchmark.
type OpResult struct {
	NsPerOp     float64
	AllocsPerOp int64
	BytesPerOp  int64
}

func opResult(r testing.BenchmarkResult) OpResult {
	return OpResult{NsPerOp: float64(r.T.Nanoseconds()) / float64(r.N), AllocsPerOp: r.AllocsPerOp(), BytesPerOp: r.AllocedBytesPerOp()}
}

// Keys returns n distinct keys "key-0" … "key-(n-1)".
func Keys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
	}
	return keys
}

// UncontendedLoop is scenario 1: one goroutine cycles Lock+Unlock over 4096
// keys, b.N times.
func UncontendedLoop(b *testing.B, impl Impl) {
	l := impl.New()
	h := l.Handle()
	keys := Keys(4096)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := h.Lock(ctx, keys[i&4095]); err != nil {
			b.Fatal(err)
		}
		h.Unlock()
	}
}

// ParallelDistinctLoop is scenario 2: b.RunParallel, each goroutine cycling
// over 1024 keys of its own.
func ParallelDistinctLoop(b *testing.B, impl Impl) {
	l := impl.New()
	keys := Keys(64 * 1024)
	var next atomic.Int64
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		h := l.Handle()
		own := keys[(next.Add(1)-1)%64*1024:][:1024]
		for i := 0; pb.Next(); i++ {
			if err := h.Lock(ctx, own[i&1023]); err != nil {
				b.Error(err)
				return
			}
			h.Unlock()
		}
	})
}

// Uncontended runs scenario 1 under testing.Benchmark.
func Uncontended(impl Impl) OpResult {
	return opResult(testing.Benchmark(func(b *testing.B) { UncontendedLoop(b, impl) }))
}

// ParallelDistinct runs scenario 2 under testing.Benchmark.
func ParallelDistinct(impl Impl) OpResult {
	return opResult(testing.Benchmark(func(b *testing.B) { ParallelDistinctLoop(b, impl) }))
}

// Contended is what a timed multi-goroutine scenario measured. Every
// figure covers the counted part of the run: from the end of its warm-up
// (warmUp) to the moment it was told to stop.
type Contended struct {
	Goroutines int
	Ops        int             // successful Lock+Unlock cycles (or RLock, Acquire)
	Failed     int             // Locks that gave up (cancellation storm)
	Elapsed    time.Duration   // wall time
	PerG       []int           // successful cycles per goroutine
	Waits      []time.Duration // the wait of every successful Lock, sorted
	Entries    int             // per-key entries left after the run (-1: none kept)
	// CPU is the CPU time, user and system, that the whole process used
	// (getrusage(2), RUSAGE_SELF), and CPUOK whether the platform reports
	// it. Nothing else runs in the process during a run, so it is what the
	// goroutines used: the critical sections, the clock reads that time
	// each wait, and whatever the lock spends spinning, parking and waking.
	// Figures of some of a run's goroutines only (ReadMostlyResult's
	// Readers and Writers) have none: CPUOK is false.
	CPU   time.Duration
	CPUOK bool
	// Allocs is the number of heap objects the whole process allocated
	// over the same window (runtime.MemStats.Mallocs, read just outside
	// it: ReadMemStats stops the world, and flushes the per-processor
	// caches that runtime/metrics would count only a span at a time): the
	// lock's, and the harness's, which allocates nothing per cycle unless
	// a goroutine's sample slice grows. Cycles in flight when the window
	// closes may add theirs. As with CPU, figures of some goroutines only
	// have none: AllocsOK is false.
	Allocs   uint64
	AllocsOK bool
}

// Throughput is successful cycles per second.
func (c Contended) Throughput() float64 { return float64(c.Ops) / c.Elapsed.Seconds() }

// CPUPerMillion is the process CPU seconds per 10⁶ successful cycles (the
// same number as CPU microseconds per cycle), or NaN if the platform does
// not report CPU time or nothing was granted.
func (c Contended) CPUPerMillion() float64 {
	if !c.CPUOK || c.Ops == 0 {
		return math.NaN()
	}
	return c.CPU.Seconds() / float64(c.Ops) * 1e6
}

// AllocsPerOp is the heap objects allocated per successful cycle over
// the run, or NaN for the figures of some goroutines only or when nothing
// was granted.
func (c Contended) AllocsPerOp() float64 {
	if !c.AllocsOK || c.Ops == 0 {
		return math.NaN()
	}
	return float64(c.Allocs) / float64(c.Ops)
}

// Jain is Jain's fairness index of the per-goroutine counts, (Σx)²/(n·Σx²):
// 1 when every goroutine got the same share, 1/n when one got all of it.
func (c Contended) Jain() float64 { return Jain(c.PerG) }

// Quantile returns the q-quantile of the waits (0 <= q <= 1) by the
// nearest-rank method: the smallest wait that at least a fraction q of
// the waits do not exceed (the ⌈q·n⌉-th of n, the first for q = 0).
func (c Contended) Quantile(q float64) time.Duration {
	if len(c.Waits) == 0 {
		return 0
	}
	// The epsilon keeps a product such as 0.07·100 = 7.000000000000001
	// at rank 7.
	rank := int(math.Ceil(q*float64(len(c.Waits)) - 1e-9))
	return c.Waits[min(len(c.Waits), max(rank, 1))-1]
}

// Jain is Jain's fairness index of xs.
func Jain(xs []int) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += float64(x)
		sq += float64(x) * float64(x)
	}
	if sq == 0 {
		return math.NaN()
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// Spin busy-works for d: a critical section that keeps the CPU, as real
// work under a lock does, rather than parking.
func Spin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

// cycle is one goroutine's operation: it reports how long a successful
// Lock waited, or ok=false for a give-up.
type cycle func(h Handle) (wait time.Duration, ok bool)

// warmUp is the start of a timed run of length d that run counts nothing
// of: a tenth of it. When the goroutines start, the first to run cycles
// alone on the free key until the scheduler has started the others, so
// the first moments of a run measure one goroutine, not contention, and
// would skew the per-goroutine shares of a short run.
func warmUp(d time.Duration) time.Duration { return d / 10 }

// run drives g goroutines on impl's exclusive lock (runGoroutines, with
// one holder at a time) and returns what they measured together.
func run(impl Impl, g int, d time.Duration, newCycle func(rng *rand.Rand) cycle) Contended {
	l := impl.New()
	r := runGoroutines(g, 1, d, l.Handle, func(_ int, rng *rand.Rand) func(Handle) (time.Duration, bool) {
		return newCycle(rng)
	})
	c := r.contended(nil)
	c.Entries = l.Entries()
	return c
}

// goroutineRun is what runGoroutines measured, goroutine by goroutine.
type goroutineRun struct {
	elapsed time.Duration
	cpu     time.Duration // the process's, user and system
	cpuOK   bool
	allocs  uint64            // the process's heap objects
	waits   [][]time.Duration // by goroutine: the wait of each successful call
	failed  []int             // by goroutine: calls that gave up
}

// contended returns the figures of the goroutines i for which in(i) is
// true, or of every goroutine if in is nil: their grants, give-ups and
// sorted waits over the run's wall time. Only the figures of every
// goroutine carry the run's CPU time: the process's CPU time is not split
// between goroutines. Entries is left to the caller.
func (r goroutineRun) contended(in func(i int) bool) Contended {
	c := Contended{Elapsed: r.elapsed}
	if in == nil {
		c.CPU, c.CPUOK, c.Allocs, c.AllocsOK = r.cpu, r.cpuOK, r.allocs, true
		in = func(int) bool { return true }
	}
	for i, w := range r.waits {
		if !in(i) {
			continue
		}
		c.Goroutines++
		c.PerG = append(c.PerG, len(w))
		c.Ops += len(w)
		c.Failed += r.failed[i]
		c.Waits = append(c.Waits, w...)
	}
	slices.Sort(c.Waits)
	return c
}

// runGoroutines drives g goroutines for warmUp(d) and then d. Goroutine i
// takes its own handle from handle, makes its cycle with newCycle (given i
// and its own random source) and calls the cycle in a loop. It counts,
// times and takes the process CPU time over the d after the warm-up only.
// holders is how many goroutines can hold the key at once (1 for an
// exclusive lock), which sizes the room for their waits (samples).
func runGoroutines[H any](g, holders int, d time.Duration, handle func() H, newCycle func(i int, rng *rand.Rand) func(H) (time.Duration, bool)) goroutineRun {
	res := goroutineRun{waits: make([][]time.Duration, g), failed: make([]int, g)}
	// counting and stop are written once each by this goroutine and read
	// by every other after each cycle; a grant counts if it returned
	// while counting was set and stop was not.
	var counting, stop atomic.Bool
	var wg, ready sync.WaitGroup
	start := make(chan struct{})
	for i := range g {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			h := handle()
			op := newCycle(i, rand.New(rand.NewSource(int64(i)+1)))
			w := samples(g, holders, d)
			ready.Done()
			<-start
			for !stop.Load() {
				wait, ok := op(h)
				if !counting.Load() || stop.Load() {
					continue
				}
				if !ok {
					res.failed[i]++
					continue
				}
				w = append(w, wait)
			}
			res.waits[i] = w
		}()
	}
	ready.Wait()
	// Collect the garbage of earlier runs now, as testing.B does before
	// each benchmark, so that a collection they made due does not start
	// inside this run and bill its pauses to this lock.
	runtime.GC()
	close(start)
	time.Sleep(warmUp(d))
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	allocs0 := ms.Mallocs
	cpu0, ok0 := processCPU()
	t0 := time.Now()
	counting.Store(true)
	time.Sleep(d)
	stop.Store(true)
	res.elapsed = time.Since(t0)
	cpu1, ok1 := processCPU()
	runtime.ReadMemStats(&ms)
	res.allocs = ms.Mallocs - allocs0
	res.cpu, res.cpuOK = cpu1-cpu0, ok0 && ok1
	wg.Wait()
	return res
}

// samplesPerSecond bounds the calls per second, on a key one goroutine
// can hold at a time, that run records without growing a slice: above the
// hot-key rate of every lock here, so that a goroutine's record grows only
// if it takes several times its share.
const samplesPerSecond = 2_000_000

// maxHolderScale bounds the factor by which samples widens its room for
// a key that several goroutines hold at once.
const maxHolderScale = 4

// samples returns an empty slice with room for one goroutine's share of
// samplesPerSecond over d, its pages already touched. When holders
// goroutines can hold the key at once the grants can come that many times
// as fast, as far as there are processors to run the holders: the room
// grows by that factor, up to maxHolderScale. The room stops at 2 s of
// samples; a longer run grows them.
//
// Growing a slice inside a run allocates fresh memory, faults its pages in
// and copies the old contents, all after an Unlock and before the next
// Lock. Under a FIFO lock the goroutines move in step, so they would all
// grow theirs in consecutive turns, each while the holder it had just
// woken waited for its processor: the harness, not the lock, would set
// the longest waits.
func samples(g, holders int, d time.Duration) []time.Duration {
	scale := max(1, min(holders, runtime.GOMAXPROCS(0), maxHolderScale))
	s := make([]time.Duration, max(4096, int(min(d, 2*time.Second).Seconds()*samplesPerSecond)*scale/g))
	for i := range s {
		s[i] = 1 // touch every page now, not at the first append of the run
	}
	return s[:0]
}

// HotKey is scenario 3: g goroutines Lock one key, hold it for hold, and
// Unlock, for d.
func HotKey(impl Impl, g int, hold, d time.Duration) Contended {
	return run(impl, g, d, func(*rand.Rand) cycle { return lockSpin(func() string { return "hot" }, hold) })
}

// BlockingHolder is scenario 4: g goroutines Lock one key, sleep for hold
// while they hold it (as a holder that waits on a disk or a network call
// does), and Unlock, for d. With the holder asleep no goroutine has work
// to do but wait, so the process CPU time per grant is what the lock
// spends on spinning, parking and waking, plus the sleep's timer, which
// is the same for every lock.
func BlockingHolder(impl Impl, g int, hold, d time.Duration) Contended {
	ctx := context.Background()
	return run(impl, g, d, func(*rand.Rand) cycle {
		return func(h Handle) (time.Duration, bool) {
			t := time.Now()
			if err := h.Lock(ctx, "hot"); err != nil {
				return 0, false
			}
			wait := time.Since(t)
			time.Sleep(hold)
			h.Unlock()
			return wait, true
		}
	})
}

// Zipf is scenario 5: g goroutines lock keys drawn from a Zipf
// distribution (exponent s) over n keys, holding each for hold.
func Zipf(impl Impl, g, n int, s float64, hold, d time.Duration) Contended {
	keys := Keys(n)
	return run(impl, g, d, func(rng *rand.Rand) cycle {
		z := rand.NewZipf(rng, s, 1, uint64(n-1))
		return lockSpin(func() string { return keys[z.Uint64()] }, hold)
	})
}

// lockSpin locks the key that next returns, spins for hold and unlocks.
func lockSpin(next func() string, hold time.Duration) cycle {
	ctx := context.Background()
	return func(h Handle) (time.Duration, bool) {
		t := time.Now()
		if err := h.Lock(ctx, next()); err != nil {
			return 0, false
		}
		wait := time.Since(t)
		Spin(hold)
		h.Unlock()
		return wait, true
	}
}

// CancelStorm is scenario 7: g goroutines Lock one hot key, each with a
// random timeout up to maxTimeout, holding it for hold when granted. Only
// for Cancellable locks. Entries must be 0 afterwards.
func CancelStorm(impl Impl, g int, hold, maxTimeout, d time.Duration) Contended {
	return run(impl, g, d, func(rng *rand.Rand) cycle {
		return func(h Handle) (time.Duration, bool) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+rng.Int63n(int64(maxTimeout))))
			t := time.Now()
			err := h.Lock(ctx, "hot")
			cancel()
			if err != nil {
				return 0, false
			}
			wait := time.Since(t)
			Spin(hold)
			h.Unlock()
			return wait, true
		}
	})
}

// ChurnResult is what scenario 6 measured.
type ChurnResult struct {
	Keys         int
	BytesPerKey  float64 // bytes allocated per key locked and released
	AllocsPerKey float64
	PeakHeap     int64 // heap in use while every key was held, above the baseline
	Retained     int64 // heap in use after all were released and a GC, above the baseline
	Entries      int   // per-key entries left (-1: none kept)
}

// Churn is scenario 6: one goroutine locks n distinct keys, holding all of
// them, then unlocks them all; then the heap is measured after a GC. Only
// for Unbounded locks.
func Churn(impl Impl, n int) ChurnResult {
	keys := Keys(n)
	ctx := context.Background()
	l := impl.New()
	handles := make([]Handle, n) // made before the baseline: not the lock's cost
	for i := range handles {
		handles[i] = l.Handle()
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base, allocs0, bytes0 := int64(ms.HeapInuse), ms.Mallocs, ms.TotalAlloc

	for i, k := range keys {
		if err := handles[i].Lock(ctx, k); err != nil {
			panic(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	peak := int64(ms.HeapInuse) - base
	for _, h := range handles {
		h.Unlock()
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	res := ChurnResult{
		Keys:         n,
		PeakHeap:     peak,
		Retained:     int64(ms.HeapInuse) - base,
		Entries:      l.Entries(),
		AllocsPerKey: float64(ms.Mallocs-allocs0) / float64(n),
		BytesPerKey:  float64(ms.TotalAlloc-bytes0) / float64(n),
	}
	runtime.KeepAlive(handles)
	runtime.KeepAlive(keys)
	return res
}

// The scenarios of fairlock's other modes: shared holds (RLock) against a
// map of sync.RWMutex, and Semaphore against a map of x/sync semaphores.
// Each takes the implementations that have the mode (Impl.NewRW,
// Impl.NewSemaphore).

// UncontendedRWLoop is scenario 8: one goroutine cycles RLock+Unlock
// (shared) or Lock+Unlock over 4096 keys on impl's lock with shared holds,
// b.N times.
func UncontendedRWLoop(b *testing.B, impl Impl, shared bool) {
	h := impl.NewRW().RWHandle()
	take := h.Lock
	if shared {
		take = h.RLock
	}
	keys := Keys(4096)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := take(ctx, keys[i&4095]); err != nil {
			b.Fatal(err)
		}
		h.Unlock()
	}
}

// UncontendedAcquireLoop is scenario 9: one goroutine cycles
// Acquire(1)+Unlock over 4096 keys of impl's semaphore with n units per
// key, b.N times.
func UncontendedAcquireLoop(b *testing.B, impl Impl, n int64) {
	h := impl.NewSemaphore(n).SemHandle()
	keys := Keys(4096)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := h.Acquire(ctx, keys[i&4095], 1); err != nil {
			b.Fatal(err)
		}
		h.Unlock()
	}
}

// UncontendedRW runs scenario 8 under testing.Benchmark.
func UncontendedRW(impl Impl, shared bool) OpResult {
	return opResult(testing.Benchmark(func(b *testing.B) { UncontendedRWLoop(b, impl, shared) }))
}

// UncontendedAcquire runs scenario 9 under testing.Benchmark.
func UncontendedAcquire(impl Impl, n int64) OpResult {
	return opResult(testing.Benchmark(func(b *testing.B) { UncontendedAcquireLoop(b, impl, n) }))
}

// ReadMostlyWriters is how many of g goroutines write in the read-mostly
// scenario: a tenth of them, rounded, and at least one.
func ReadMostlyWriters(g int) int { return max(1, (g+5)/10) }

// ReadMostlyResult is what a read-mostly run measured. Readers and Writers
// are the grants and waits of the goroutines of each role, over the run's
// wall time; only All, every goroutine's, carries the run's CPU time, which
// is not split between goroutines. Each has the entries left after the
// run.
type ReadMostlyResult struct {
	All, Readers, Writers Contended
}

// WriteShare is the writers' share of the grants, or NaN if there were
// none.
func (r ReadMostlyResult) WriteShare() float64 {
	if r.All.Ops == 0 {
		return math.NaN()
	}
	return float64(r.Writers.Ops) / float64(r.All.Ops)
}

// ReadMostly is scenario 10: g goroutines on one key, for d. Goroutines 0
// to writers-1 are writers: they Lock the key. The others are readers:
// they RLock it. Each holds it for hold, busy, and Unlocks. A goroutine
// keeps its role for the whole run, so the writers' share of the grants
// shows whom the lock favours. Only for implementations with NewRW.
func ReadMostly(impl Impl, g, writers int, hold, d time.Duration) ReadMostlyResult {
	l := impl.NewRW()
	ctx := context.Background()
	r := runGoroutines(g, g-writers, d, l.RWHandle, func(i int, _ *rand.Rand) func(RWHandle) (time.Duration, bool) {
		take := RWHandle.RLock
		if i < writers {
			take = RWHandle.Lock
		}
		return func(h RWHandle) (time.Duration, bool) {
			t := time.Now()
			if err := take(h, ctx, "hot"); err != nil {
				return 0, false
			}
			wait := time.Since(t)
			Spin(hold)
			h.Unlock()
			return wait, true
		}
	})
	res := ReadMostlyResult{
		All:     r.contended(nil),
		Readers: r.contended(func(i int) bool { return i >= writers }),
		Writers: r.contended(func(i int) bool { return i < writers }),
	}
	res.All.Entries = l.Entries()
	res.Readers.Entries, res.Writers.Entries = res.All.Entries, res.All.Entries
	return res
}

// SemaphoreHotKey is scenario 11: g goroutines on one key of impl's
// semaphore with n units per key, for d. Goroutine i Acquires 1 + i mod
// maxW units (all of them 1 unit for maxW = 1), holds them for hold, busy,
// and gives them back. Only for implementations with NewSemaphore.
func SemaphoreHotKey(impl Impl, g int, n, maxW int64, hold, d time.Duration) Contended {
	l := impl.NewSemaphore(n)
	ctx := context.Background()
	r := runGoroutines(g, int(n), d, l.SemHandle, func(i int, _ *rand.Rand) func(SemHandle) (time.Duration, bool) {
		w := 1 + int64(i)%maxW
		return func(h SemHandle) (time.Duration, bool) {
			t := time.Now()
			if err := h.Acquire(ctx, "hot", w); err != nil {
				return 0, false
			}
			wait := time.Since(t)
			Spin(hold)
			h.Unlock()
			return wait, true
		}
	})
	c := r.contended(nil)
	c.Entries = l.Entries()
	return c
}
