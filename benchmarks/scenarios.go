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

// Contended is what a timed multi-goroutine scenario measured.
type Contended struct {
	Goroutines int
	Ops        int             // successful Lock+Unlock cycles after the warm-up
	Failed     int             // Locks that gave up after the warm-up (cancellation storm)
	Elapsed    time.Duration   // wall time of the run after its warm-up
	PerG       []int           // successful cycles per goroutine after the warm-up
	Waits      []time.Duration // the wait of every successful Lock after the warm-up, sorted
	Entries    int             // per-key entries left after the run (-1: none kept)
	// LongestPause is the longest interval in the run in which no Lock
	// returned in any goroutine. On a hot key under a FIFO lock it is a
	// stall that every queued waiter sat through, such as the holder's
	// thread losing its CPU; it puts the max wait next to what the machine
	// did in the same run.
	LongestPause time.Duration
	// GrantsInMaxWait counts the Locks that returned in other goroutines
	// while the longest wait lasted. A strict FIFO queue of g goroutines
	// grants at most g-1 others before a call that has joined it, so under
	// a FIFO lock a larger count says part of the longest wait, about one
	// turn of the key per extra grant, passed before the call reached the
	// lock's queue (its thread held up, as by another thread taking its
	// CPU). Under a barging lock the count is how often the waiting call
	// was overtaken.
	GrantsInMaxWait int
	// PauseInMaxWait is the longest interval within the longest wait in
	// which no Lock returned anywhere: when it is most of that wait, the
	// call sat through a stall of the whole run.
	PauseInMaxWait time.Duration
}

// Throughput is successful cycles per second.
func (c Contended) Throughput() float64 { return float64(c.Ops) / c.Elapsed.Seconds() }

// Jain is Jain's fairness index of the per-goroutine counts, (Σx)²/(n·Σx²):
// 1 when every goroutine got the same share, 1/n when one got all of it.
func (c Contended) Jain() float64 { return Jain(c.PerG) }

// Quantile returns the q-quantile of the waits (0 <= q <= 1).
func (c Contended) Quantile(q float64) time.Duration {
	if len(c.Waits) == 0 {
		return 0
	}
	return c.Waits[min(len(c.Waits)-1, int(q*float64(len(c.Waits))))]
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

// cycle is one goroutine's operation: it reports when a successful Lock
// returned and how long it waited, or ok=false for a give-up.
type cycle func(h Handle) (granted time.Time, wait time.Duration, ok bool)

// warmUp is the start of a timed run of length d that run counts nothing
// of: a tenth of it. When the goroutines start, the first to run cycles
// alone on a free key until the scheduler gets the others going, which
// took up to about 4 ms here; counting that skewed the per-goroutine
// shares of a 150 ms run (-quick), so that a strict FIFO lock's Jain index
// came out 0.95–0.97 in 3 of 40 such runs (one goroutine with twice the
// others' grants), and containerd's in 2 of 40. The 1.5 s runs were
// skewed ten times less. What run reports is the contended steady state.
func warmUp(d time.Duration) time.Duration { return d / 10 }

// run drives g goroutines for warmUp(d) and then d; each makes its cycle
// with newCycle (given its own random source) and calls it in a loop. It
// reports what happened in the d after the warm-up.
func run(impl Impl, g int, d time.Duration, newCycle func(rng *rand.Rand) cycle) Contended {
	l := impl.New()
	warm := warmUp(d)
	res := Contended{Goroutines: g, PerG: make([]int, g)}
	waits := make([][]time.Duration, g)
	grants := make([][]time.Duration, g) // when each Lock returned, from t0
	failed := make([]int, g)
	var t0 time.Time // set before start is closed
	var stop atomic.Bool
	var wg, ready sync.WaitGroup
	start := make(chan struct{})
	for i := range g {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			h := l.Handle()
			op := newCycle(rand.New(rand.NewSource(int64(i) + 1)))
			w, at := samples(g, warm+d), samples(g, warm+d)
			ready.Done()
			<-start
			for !stop.Load() {
				granted, wait, ok := op(h)
				if !ok {
					if time.Since(t0) >= warm {
						failed[i]++
					}
					continue
				}
				w = append(w, wait)
				at = append(at, granted.Sub(t0))
			}
			waits[i], grants[i] = afterWarmUp(w, at, warm)
			res.PerG[i] = len(grants[i])
		}()
	}
	ready.Wait()
	// Collect the garbage of earlier runs now, as testing.B does before
	// each benchmark, so that a collection they made due does not start
	// inside this run and bill its pauses to this lock.
	runtime.GC()
	t0 = time.Now()
	close(start)
	time.Sleep(warm + d)
	stop.Store(true)
	wg.Wait()
	res.Elapsed = time.Since(t0) - warm
	for i := range g {
		res.Ops += res.PerG[i]
		res.Failed += failed[i]
		res.Waits = append(res.Waits, waits[i]...)
	}
	slices.Sort(res.Waits)
	res.LongestPause = longestGap(slices.Concat(grants...))
	res.GrantsInMaxWait, res.PauseInMaxWait = insideLongestWait(waits, grants)
	res.Entries = l.Entries()
	return res
}

// afterWarmUp returns the waits and grant times of one goroutine's Locks
// that were granted at warm or later; grants holds the times (from the
// run's start, in order) at which the Locks whose waits are in waits were
// granted.
func afterWarmUp(waits, grants []time.Duration, warm time.Duration) ([]time.Duration, []time.Duration) {
	j, _ := slices.BinarySearch(grants, warm)
	return waits[j:], grants[j:]
}

// samplesPerSecond bounds the Lock calls per second that run records
// without growing a slice: above every lock's hot-key rate here (at most
// about 10⁶/s), so that a goroutine's record grows only if it takes
// several times its share.
const samplesPerSecond = 2_000_000

// samples returns an empty slice with room for one goroutine's share of
// samplesPerSecond over d, its pages already touched. The room stops at
// 2 s (64 MB over both slices of all goroutines); a longer run grows
// them.
//
// Why. When the slices grew inside a run, each growth (up to 90 KB of
// fresh memory, faulted in and copied) took about 100 µs after an Unlock.
// Under a FIFO lock the goroutines move in step, so all 32 grew theirs in
// consecutive turns, each while the holder it had just woken on the same
// processor waited for it. The hand-offs of that turn of the queue took
// up to 160 µs each, and a call that waited through them set the max
// wait: 2.2 and 2.7 ms at G=32 in two runs, both about 1.1 s in, where
// the slices grew the fifth time.
func samples(g int, d time.Duration) []time.Duration {
	s := make([]time.Duration, max(4096, int(min(d, 2*time.Second).Seconds()*samplesPerSecond)/g))
	for i := range s {
		s[i] = 1 // touch every page now, not at the first append of the run
	}
	return s[:0]
}

// longestGap sorts ts and returns the largest difference between
// neighbours (0 for fewer than two).
func longestGap(ts []time.Duration) time.Duration {
	slices.Sort(ts)
	var gap time.Duration
	for i := 1; i < len(ts); i++ {
		gap = max(gap, ts[i]-ts[i-1])
	}
	return gap
}

// insideLongestWait finds the longest wait, waits[i][j], which ended when
// grants[i][j] (from the run's start) was taken. It counts the grants of
// all goroutines strictly inside that wait and returns the longest
// interval inside it with no grant, from its start to its end.
func insideLongestWait(waits, grants [][]time.Duration) (n int, pause time.Duration) {
	var longest, end time.Duration
	for i := range waits {
		for j, w := range waits[i] {
			if w > longest {
				longest, end = w, grants[i][j]
			}
		}
	}
	start := end - longest
	inside := []time.Duration{start, end}
	for _, ts := range grants {
		for _, t := range ts {
			if t > start && t < end {
				inside = append(inside, t)
			}
		}
	}
	return len(inside) - 2, longestGap(inside)
}

// HotKey is scenario 3: g goroutines Lock one key, hold it for hold, and
// Unlock, for d.
func HotKey(impl Impl, g int, hold, d time.Duration) Contended {
	return run(impl, g, d, func(*rand.Rand) cycle { return lockSpin(func() string { return "hot" }, hold) })
}

// Zipf is scenario 4: g goroutines lock keys drawn from a Zipf
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
	return func(h Handle) (time.Time, time.Duration, bool) {
		t := time.Now()
		if err := h.Lock(ctx, next()); err != nil {
			return time.Time{}, 0, false
		}
		granted := time.Now()
		Spin(hold)
		h.Unlock()
		return granted, granted.Sub(t), true
	}
}

// CancelStorm is scenario 6: g goroutines Lock one hot key, each with a
// random timeout up to maxTimeout, holding it for hold when granted. Only
// for Cancellable locks. Entries must be 0 afterwards.
func CancelStorm(impl Impl, g int, hold, maxTimeout, d time.Duration) Contended {
	return run(impl, g, d, func(rng *rand.Rand) cycle {
		return func(h Handle) (time.Time, time.Duration, bool) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+rng.Int63n(int64(maxTimeout))))
			t := time.Now()
			err := h.Lock(ctx, "hot")
			cancel()
			if err != nil {
				return time.Time{}, 0, false
			}
			granted := time.Now()
			Spin(hold)
			h.Unlock()
			return granted, granted.Sub(t), true
		}
	})
}

// ChurnResult is what scenario 5 measured.
type ChurnResult struct {
	Keys         int
	BytesPerKey  float64 // bytes allocated per key locked and released
	AllocsPerKey float64
	PeakHeap     int64 // heap in use while every key was held, above the baseline
	Retained     int64 // heap in use after all were released and a GC, above the baseline
	Entries      int   // per-key entries left (-1: none kept)
}

// Churn is scenario 5: one goroutine locks n distinct keys, holding all of
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
