package benchmarks

import (
	"context"
	"errors"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The scenarios as Go benchmarks, one sub-benchmark per implementation:
//
//	go test -bench . -benchmem
//
// cmd/compare runs the same code and prints ratios.

func BenchmarkUncontended(b *testing.B) {
	for _, impl := range Impls() {
		b.Run(impl.Name, func(b *testing.B) { UncontendedLoop(b, impl) })
	}
}

func BenchmarkParallelDistinct(b *testing.B) {
	for _, impl := range Impls() {
		if impl.SingleKey {
			continue
		}
		b.Run(impl.Name, func(b *testing.B) { ParallelDistinctLoop(b, impl) })
	}
}

// BenchmarkHotKey reports throughput, Jain's index and wait tails as
// custom metrics, for G = 8, 32, 128 and a 2µs critical section. Each run
// lasts b.N × 1ms of wall time.
func BenchmarkHotKey(b *testing.B) {
	for _, g := range []int{8, 32, 128} {
		for _, impl := range Impls() {
			b.Run("G="+strconv.Itoa(g)+"/"+impl.Name, func(b *testing.B) {
				c := HotKey(impl, g, 2*time.Microsecond, time.Duration(b.N)*time.Millisecond)
				report(b, c)
			})
		}
	}
}

// BenchmarkBlockingHolder reports throughput and CPU per grant for 8
// goroutines on one key whose holder sleeps 1ms. Each run lasts b.N × 10ms
// of wall time.
func BenchmarkBlockingHolder(b *testing.B) {
	for _, impl := range Impls() {
		b.Run(impl.Name, func(b *testing.B) {
			report(b, BlockingHolder(impl, 8, time.Millisecond, time.Duration(b.N)*10*time.Millisecond))
		})
	}
}

// semUnits is the units per key of the semaphore benchmarks.
const semUnits = 4

// withMode returns the implementations, of Impls and ModePeers, that have
// the mode has reports.
func withMode(has func(Impl) bool) []Impl {
	return slices.DeleteFunc(append(Impls(), ModePeers()...), func(i Impl) bool { return !has(i) })
}

func hasRW(i Impl) bool        { return i.NewRW != nil }
func hasSemaphore(i Impl) bool { return i.NewSemaphore != nil }

// BenchmarkUncontendedModes cycles, over 4096 keys on one goroutine,
// RLock+Unlock and Lock+Unlock on the locks with shared holds and
// Acquire(1)+Unlock on the semaphores.
func BenchmarkUncontendedModes(b *testing.B) {
	for _, impl := range withMode(hasRW) {
		b.Run("RLock/"+impl.Name, func(b *testing.B) { UncontendedRWLoop(b, impl, true) })
		b.Run("Lock/"+impl.Name, func(b *testing.B) { UncontendedRWLoop(b, impl, false) })
	}
	for _, impl := range withMode(hasSemaphore) {
		b.Run("Acquire/"+impl.Name, func(b *testing.B) { UncontendedAcquireLoop(b, impl, semUnits) })
	}
}

// BenchmarkReadMostly reports, for G = 8 and 32 goroutines on one key of
// which a tenth write (ReadMostlyWriters) and a 2µs critical section,
// reads and writes per second, the writers' share of the grants, CPU per
// grant, the readers' and the writers' wait tails and Jain's index over
// every goroutine. Each run lasts b.N × 1ms of wall time.
func BenchmarkReadMostly(b *testing.B) {
	for _, g := range []int{8, 32} {
		for _, impl := range withMode(hasRW) {
			b.Run("G="+strconv.Itoa(g)+"/"+impl.Name, func(b *testing.B) {
				r := ReadMostly(impl, g, ReadMostlyWriters(g), 2*time.Microsecond, time.Duration(b.N)*time.Millisecond)
				b.ReportMetric(r.Readers.Throughput(), "reads/s")
				b.ReportMetric(r.Writers.Throughput(), "writes/s")
				b.ReportMetric(r.WriteShare(), "write-share")
				if r.All.CPUOK {
					b.ReportMetric(r.All.CPUPerMillion(), "cpu-s/1e6-ops")
				}
				b.ReportMetric(r.All.AllocsPerOp(), "allocs/grant")
				b.ReportMetric(µs(r.Readers.Quantile(0.99)), "reader-p99-µs")
				b.ReportMetric(µs(r.Readers.Quantile(1)), "reader-max-µs")
				b.ReportMetric(µs(r.Writers.Quantile(0.99)), "writer-p99-µs")
				b.ReportMetric(µs(r.Writers.Quantile(1)), "writer-max-µs")
				b.ReportMetric(r.All.Jain(), "jain")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// BenchmarkSemaphore reports what BenchmarkHotKey does for G = 8 and 32
// goroutines on one key of a semaphore with 4 units, each taking 1 unit,
// and for G = 32 taking 1 to 3 units; a 2µs critical section. Each run
// lasts b.N × 1ms of wall time.
func BenchmarkSemaphore(b *testing.B) {
	for _, c := range []struct {
		g    int
		maxW int64
		name string
	}{{8, 1, "w=1"}, {32, 1, "w=1"}, {32, 3, "w=1-3"}} {
		for _, impl := range withMode(hasSemaphore) {
			b.Run("G="+strconv.Itoa(c.g)+"/"+c.name+"/"+impl.Name, func(b *testing.B) {
				report(b, SemaphoreHotKey(impl, c.g, semUnits, c.maxW, 2*time.Microsecond, time.Duration(b.N)*time.Millisecond))
			})
		}
	}
}

// report reports a contended run's figures per grant, not per b.N: the
// allocations of the run's window per successful cycle (-benchmem's
// allocs/op is per window of wall time, and counts the harness's setup),
// and the wait percentiles in µs with their fractions.
func report(b *testing.B, c Contended) {
	b.ReportMetric(c.Throughput(), "ops/s")
	if c.CPUOK {
		b.ReportMetric(c.CPUPerMillion(), "cpu-s/1e6-ops")
	}
	b.ReportMetric(c.AllocsPerOp(), "allocs/grant")
	b.ReportMetric(c.Jain(), "jain")
	for _, q := range []struct {
		q    float64
		unit string
	}{{0.5, "p50-µs"}, {0.99, "p99-µs"}, {0.999, "p99.9-µs"}, {1, "max-µs"}} {
		b.ReportMetric(µs(c.Quantile(q.q)), q.unit)
	}
	b.ReportMetric(0, "ns/op")
}

// µs returns d in microseconds, fractions kept.
func µs(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// TestChurnLeavesNothing: after a million-key churn (a hundred thousand
// under -short) fairlock holds no entry and retains no heap for it.
func TestChurnLeavesNothing(t *testing.T) {
	n := 1_000_000
	if testing.Short() {
		n = 100_000
	}
	r := Churn(Impls()[0], n)
	if r.Entries != 0 {
		t.Fatalf("fairlock keeps %d entries after churn", r.Entries)
	}
	// What stays behind is the shards' recycled entries (at most 16 each),
	// a constant whatever the burst: under 1 MiB, where a map that never
	// shrinks keeps tens of bytes per key (spill maps are dropped once they
	// empty).
	if r.Retained > 1<<20 {
		t.Fatalf("fairlock retains %d bytes after churning %d keys (peak %d)", r.Retained, n, r.PeakHeap)
	}
	t.Logf("%+v", r)
}

// TestCancelStormLeaksNothing: waiters giving up at random leave no entry
// behind, in fairlock and in the other cancellable lock. A storm counts
// only if some waiters were granted and some gave up; how long a hand-off
// takes depends on the machine and the race detector, so the longest
// timeout grows tenfold (up to 50 ms) until a storm has both, and every
// storm run must leak nothing.
func TestCancelStormLeaksNothing(t *testing.T) {
	for _, impl := range Impls() {
		if !impl.Cancellable {
			continue
		}
		var c Contended
		for maxTimeout := 50 * time.Microsecond; maxTimeout <= 50*time.Millisecond; maxTimeout *= 10 {
			c = CancelStorm(impl, 16, 2*time.Microsecond, maxTimeout, 100*time.Millisecond)
			if c.Entries != 0 {
				t.Errorf("%s: %d entries leaked after a cancellation storm (timeouts up to %v)", impl.Name, c.Entries, maxTimeout)
			}
			if c.Ops > 0 && c.Failed > 0 {
				break
			}
		}
		if c.Ops == 0 || c.Failed == 0 {
			t.Errorf("%s: storm had %d grants and %d give-ups even with timeouts up to 50ms; want both", impl.Name, c.Ops, c.Failed)
		}
	}
}

// TestQuantileIsNearestRank: the q-quantile of n waits is the ⌈q·n⌉-th,
// so p99 of 100 waits is the 99th, not the largest.
func TestQuantileIsNearestRank(t *testing.T) {
	waits := func(n int) Contended {
		c := Contended{}
		for i := 1; i <= n; i++ {
			c.Waits = append(c.Waits, time.Duration(i))
		}
		return c
	}
	for _, tc := range []struct {
		n    int
		q    float64
		want time.Duration
	}{
		{100, 0.99, 99}, {100, 1, 100}, {100, 0.5, 50}, {100, 0, 1},
		{1000, 0.999, 999}, {4, 0.5, 2}, {3, 0.5, 2}, {1, 0.999, 1}, {100, 0.07, 7},
	} {
		if got := waits(tc.n).Quantile(tc.q); got != tc.want {
			t.Errorf("Quantile(%v) of 1..%d = %d, want %d", tc.q, tc.n, got, tc.want)
		}
	}
	if got := (Contended{}).Quantile(0.5); got != 0 {
		t.Errorf("Quantile of no waits = %d, want 0", got)
	}
}

// TestBlockingHolderExcludes: with every holder asleep for hold, no two
// grants of the key overlap, so a run grants at most one more than fits
// end to end in its wall time. (Whether the goroutines share the grants
// is what the scenario's Jain index measures; a barging lock need not.)
func TestBlockingHolderExcludes(t *testing.T) {
	const hold = time.Millisecond
	for _, impl := range Impls() {
		c := BlockingHolder(impl, 4, hold, 60*time.Millisecond)
		if limit := int(c.Elapsed/hold) + 1; c.Ops == 0 || c.Ops > limit {
			t.Errorf("%s: %d grants of a key held %v each in %v; want 1 to %d", impl.Name, c.Ops, hold, c.Elapsed, limit)
		}
		if c.Failed != 0 || c.Entries > 0 {
			t.Errorf("%s: %d failed Locks, %d entries left; want none", impl.Name, c.Failed, c.Entries)
		}
	}
}

// TestProcessCPUCounts: on a platform that reports process CPU time, a
// goroutine that spins until the process has used 5ms more than at the
// start stops, well within a wall-clock limit that only a clock that
// never moves would reach.
func TestProcessCPUCounts(t *testing.T) {
	start, ok := processCPU()
	if !ok {
		t.Skip("no process CPU time on this platform")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		now, _ := processCPU()
		if now < start {
			t.Fatalf("process CPU time went back from %v to %v", start, now)
		}
		if now-start >= 5*time.Millisecond {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process CPU time grew %v in 10s of spinning", now-start)
		}
	}
}

// TestCPUPerMillion checks the unit: 2s of CPU over 10⁶ grants is 2, and
// a run without CPU time or without grants has none.
func TestCPUPerMillion(t *testing.T) {
	if got := (Contended{Ops: 1_000_000, CPU: 2 * time.Second, CPUOK: true}).CPUPerMillion(); got != 2 {
		t.Errorf("CPUPerMillion = %v, want 2", got)
	}
	for _, c := range []Contended{{Ops: 10, CPU: time.Second}, {CPU: time.Second, CPUOK: true}} {
		if got := c.CPUPerMillion(); !math.IsNaN(got) {
			t.Errorf("CPUPerMillion(%+v) = %v, want NaN", c, got)
		}
	}
}

// TestModeImpls: the mode scenarios have fairlock and one peer each, and
// no peer of a mode has an exclusive lock of its own (it would join
// scenarios 1 to 7).
func TestModeImpls(t *testing.T) {
	for _, c := range []struct {
		mode string
		has  func(Impl) bool
		want []string
	}{
		{"shared holds", hasRW, []string{"fairlock", "sync.RWMutex map"}},
		{"semaphore", hasSemaphore, []string{"fairlock", "x/sync semaphore map"}},
	} {
		var got []string
		for _, impl := range withMode(c.has) {
			got = append(got, impl.Name)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("implementations with %s: %q, want %q", c.mode, got, c.want)
		}
	}
	for _, impl := range ModePeers() {
		if impl.New != nil || impl.Cancellable || impl.Unbounded || impl.SingleKey || impl.PerKeyState {
			t.Errorf("%s: an exclusive lock or its flags (%+v); a mode peer has neither", impl.Name, impl)
		}
	}
}

// returnsWithin runs f in a goroutine of its own (fairlock's owner is the
// calling goroutine) and reports whether it returned within d; if not,
// done is closed once it has.
func returnsWithin(d time.Duration, f func()) (ok bool, done <-chan struct{}) {
	c := make(chan struct{})
	go func() { defer close(c); f() }()
	select {
	case <-c:
		return true, c
	case <-time.After(d):
		return false, c
	}
}

// TestRWAdapters: on every lock with shared holds, two readers hold a key
// together, a writer waits for both, a reader that comes after the writer
// waits for it, and the key's entry goes when the last leaves.
func TestRWAdapters(t *testing.T) {
	const patience = 30 * time.Millisecond
	ctx := context.Background()
	for _, impl := range withMode(hasRW) {
		l := impl.NewRW()
		r1, r2, w, r3 := l.RWHandle(), l.RWHandle(), l.RWHandle(), l.RWHandle()
		must := func(err error) {
			if err != nil {
				t.Errorf("%s: %v", impl.Name, err)
			}
		}
		if ok, _ := returnsWithin(time.Second, func() { must(r1.RLock(ctx, "k")) }); !ok {
			t.Fatalf("%s: RLock of a free key did not return", impl.Name)
		}
		if ok, _ := returnsWithin(time.Second, func() { must(r2.RLock(ctx, "k")) }); !ok {
			t.Fatalf("%s: a second reader waited for the first", impl.Name)
		}
		wOK, wDone := returnsWithin(patience, func() { must(w.Lock(ctx, "k")) })
		if wOK {
			t.Fatalf("%s: Lock returned while two readers held the key", impl.Name)
		}
		r3OK, r3Done := returnsWithin(patience, func() { must(r3.RLock(ctx, "k")) })
		r1.Unlock()
		r2.Unlock()
		<-wDone
		if r3OK {
			t.Errorf("%s: a reader that came after a waiting writer got the key first", impl.Name)
		}
		select {
		case <-r3Done:
			t.Errorf("%s: a reader got the key while the writer held it", impl.Name)
		case <-time.After(patience):
		}
		w.Unlock()
		<-r3Done
		r3.Unlock()
		if n := l.Entries(); n != 0 {
			t.Errorf("%s: %d entries left, want 0", impl.Name, n)
		}
	}
}

// TestSemaphoreAdapters: on every semaphore of 4 units, 3 units and 1
// fit together on a key, a fifth unit waits until its context ends,
// another key is not in the way, and the entries go when the last leaves.
func TestSemaphoreAdapters(t *testing.T) {
	const patience = 30 * time.Millisecond
	ctx := context.Background()
	for _, impl := range withMode(hasSemaphore) {
		l := impl.NewSemaphore(4)
		a, b, c, d := l.SemHandle(), l.SemHandle(), l.SemHandle(), l.SemHandle()
		must := func(err error) {
			if err != nil {
				t.Errorf("%s: %v", impl.Name, err)
			}
		}
		if ok, _ := returnsWithin(time.Second, func() { must(a.Acquire(ctx, "k", 3)) }); !ok {
			t.Fatalf("%s: Acquire(3) of 4 free units did not return", impl.Name)
		}
		if ok, _ := returnsWithin(time.Second, func() { must(b.Acquire(ctx, "k", 1)) }); !ok {
			t.Fatalf("%s: Acquire(1) beside 3 of 4 units did not return", impl.Name)
		}
		var err error
		_, done := returnsWithin(time.Second, func() {
			ctx, cancel := context.WithTimeout(ctx, patience)
			defer cancel()
			err = c.Acquire(ctx, "k", 1)
		})
		<-done
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: a fifth unit of 4: %v, want the context's deadline", impl.Name, err)
		}
		if ok, _ := returnsWithin(time.Second, func() { must(d.Acquire(ctx, "other", 4)) }); !ok {
			t.Errorf("%s: Acquire(4) of another key waited", impl.Name)
		}
		a.Unlock()
		b.Unlock()
		d.Unlock()
		if n := l.Entries(); n != 0 {
			t.Errorf("%s: %d entries left, want 0", impl.Name, n)
		}
	}
}

// TestRoleFigures: a run's figures for some of its goroutines count only
// theirs and carry no CPU time; those of every goroutine carry it.
func TestRoleFigures(t *testing.T) {
	r := goroutineRun{
		elapsed: time.Second, cpu: 3 * time.Second, cpuOK: true, allocs: 12,
		waits:  [][]time.Duration{{2, 1}, {9}, {6, 4, 5}},
		failed: []int{0, 1, 2},
	}
	some := r.contended(func(i int) bool { return i != 1 })
	if some.Goroutines != 2 || some.Ops != 5 || some.Failed != 2 || !slices.Equal(some.PerG, []int{2, 3}) ||
		!slices.Equal(some.Waits, []time.Duration{1, 2, 4, 5, 6}) || some.CPUOK || some.Elapsed != time.Second ||
		some.AllocsOK || !math.IsNaN(some.AllocsPerOp()) {
		t.Errorf("goroutines 0 and 2: %+v", some)
	}
	all := r.contended(nil)
	if all.Goroutines != 3 || all.Ops != 6 || all.Failed != 3 || !all.CPUOK || all.CPU != 3*time.Second || all.Waits[5] != 9 ||
		all.AllocsPerOp() != 2 {
		t.Errorf("every goroutine: %+v", all)
	}
}

func TestReadMostlyWriters(t *testing.T) {
	for g, want := range map[int]int{1: 1, 8: 1, 10: 1, 15: 2, 32: 3, 128: 13} {
		if got := ReadMostlyWriters(g); got != want {
			t.Errorf("ReadMostlyWriters(%d) = %d, want %d", g, got, want)
		}
	}
}

// TestReadMostlyRoles: a short read-mostly run on each lock with shared
// holds grants both roles, keeps their figures apart, and leaves no entry.
// A run may grant the writers nothing if they are kept off the processors
// for all of it (readers that share the key never park while no writer is
// queued), so a lock has three runs to grant both roles.
func TestReadMostlyRoles(t *testing.T) {
	for _, impl := range withMode(hasRW) {
		var r ReadMostlyResult
		for range 3 {
			if r = ReadMostly(impl, 8, 2, 2*time.Microsecond, 60*time.Millisecond); r.Readers.Ops > 0 && r.Writers.Ops > 0 {
				break
			}
		}
		if r.Readers.Goroutines != 6 || r.Writers.Goroutines != 2 || r.All.Goroutines != 8 {
			t.Errorf("%s: %d readers and %d writers of %d, want 6 and 2 of 8", impl.Name, r.Readers.Goroutines, r.Writers.Goroutines, r.All.Goroutines)
		}
		if r.Readers.Ops == 0 || r.Writers.Ops == 0 || r.Readers.Ops+r.Writers.Ops != r.All.Ops {
			t.Errorf("%s: %d reads and %d writes of %d grants", impl.Name, r.Readers.Ops, r.Writers.Ops, r.All.Ops)
		}
		if len(r.Writers.Waits) != r.Writers.Ops || len(r.Readers.Waits) != r.Readers.Ops {
			t.Errorf("%s: %d writer and %d reader waits for %d and %d grants", impl.Name, len(r.Writers.Waits), len(r.Readers.Waits), r.Writers.Ops, r.Readers.Ops)
		}
		if s := r.WriteShare(); !(s > 0 && s < 1) {
			t.Errorf("%s: writers' share %v, want between 0 and 1", impl.Name, s)
		}
		if r.Readers.CPUOK || r.Writers.CPUOK {
			t.Errorf("%s: a role's figures carry the run's CPU time", impl.Name)
		}
		if r.All.Entries != 0 || r.All.Failed != 0 {
			t.Errorf("%s: %d entries left, %d failed; want none", impl.Name, r.All.Entries, r.All.Failed)
		}
	}
}

// TestSemaphoreHotKeyGrants: a short run with mixed weights on each
// semaphore grants every goroutine and leaves no entry.
func TestSemaphoreHotKeyGrants(t *testing.T) {
	for _, impl := range withMode(hasSemaphore) {
		c := SemaphoreHotKey(impl, 6, 4, 3, 2*time.Microsecond, 60*time.Millisecond)
		if c.Goroutines != 6 || slices.Contains(c.PerG, 0) || c.Failed != 0 || c.Entries != 0 {
			t.Errorf("%s: %d goroutines with grants %v, %d failed, %d entries left; want 6, each granted, none, none",
				impl.Name, c.Goroutines, c.PerG, c.Failed, c.Entries)
		}
	}
}
