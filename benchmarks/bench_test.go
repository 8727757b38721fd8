package benchmarks

import (
	"math"
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

func report(b *testing.B, c Contended) {
	b.ReportMetric(c.Throughput(), "ops/s")
	if c.CPUOK {
		b.ReportMetric(c.CPUPerMillion(), "cpu-s/1e6-ops")
	}
	b.ReportMetric(c.Jain(), "jain")
	b.ReportMetric(float64(c.Quantile(0.99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(c.Quantile(1).Microseconds()), "max-µs")
	b.ReportMetric(0, "ns/op")
}

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
// behind, in fairlock and in the other cancellable lock.
func TestCancelStormLeaksNothing(t *testing.T) {
	for _, impl := range Impls() {
		if !impl.Cancellable {
			continue
		}
		c := CancelStorm(impl, 16, 2*time.Microsecond, 50*time.Microsecond, 100*time.Millisecond)
		if c.Entries != 0 {
			t.Errorf("%s: %d entries leaked after a cancellation storm", impl.Name, c.Entries)
		}
		if c.Ops == 0 || c.Failed == 0 {
			t.Errorf("%s: storm had %d grants and %d give-ups; want both", impl.Name, c.Ops, c.Failed)
		}
	}
}

// TestBlockingHolderExcludes: with every holder asleep for hold, no two
// grants of the key overlap, so a run grants at most one more than fits
// end to end in its wall time; and the goroutines share the grants.
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
