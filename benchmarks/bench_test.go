package benchmarks

import (
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
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

func report(b *testing.B, c Contended) {
	b.ReportMetric(c.Throughput(), "ops/s")
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
		// Grants were spread over the run, so the longest pause between
		// them lies strictly between nothing and the whole run.
		if c.Ops > 1 && (c.LongestPause <= 0 || c.LongestPause >= c.Elapsed) {
			t.Errorf("%s: longest pause %v, want within (0, %v)", impl.Name, c.LongestPause, c.Elapsed)
		}
	}
}

// TestInsideLongestWait checks the count and the pause on known waits and
// grant times.
func TestInsideLongestWait(t *testing.T) {
	// Goroutine 0 waited 2 (granted at 3) and then 9, granted at 20: the
	// grants at 12 and 15 of goroutine 1 fall inside (11, 20), the one at
	// 11 (the window's start) and at 25 do not. The longest interval
	// without a grant inside the wait is 15 to 20.
	waits := [][]time.Duration{{2, 9}, {1, 1, 1, 4}}
	grants := [][]time.Duration{{3, 20}, {11, 12, 15, 25}}
	if n, pause := insideLongestWait(waits, grants); n != 2 || pause != 5 {
		t.Errorf("insideLongestWait = %d grants, pause %v; want 2, 5ns", n, pause)
	}
	if n, pause := insideLongestWait(nil, nil); n != 0 || pause != 0 {
		t.Errorf("insideLongestWait of no waits = %d, %v; want 0, 0", n, pause)
	}
}

// TestLongestGap checks the pause measure on known grant times.
// TestAfterWarmUp: a goroutine's Locks granted before the warm-up ends
// are dropped with their waits, one granted at its end or later is kept.
func TestAfterWarmUp(t *testing.T) {
	ms := time.Millisecond
	waits := []time.Duration{1 * ms, 2 * ms, 3 * ms, 4 * ms}
	grants := []time.Duration{5 * ms, 10 * ms, 10 * ms, 15 * ms}
	for _, c := range []struct {
		warm       time.Duration
		wantWaits  []time.Duration
		wantGrants []time.Duration
	}{
		{0, waits, grants},
		{5 * ms, waits, grants},
		{6 * ms, waits[1:], grants[1:]},
		{10 * ms, waits[1:], grants[1:]},
		{11 * ms, waits[3:], grants[3:]},
		{16 * ms, nil, nil},
	} {
		w, g := afterWarmUp(waits, grants, c.warm)
		if diff := cmp.Diff(c.wantWaits, w, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("warm-up %v: waits (-want +got):\n%s", c.warm, diff)
		}
		if diff := cmp.Diff(c.wantGrants, g, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("warm-up %v: grants (-want +got):\n%s", c.warm, diff)
		}
	}
}

func TestLongestGap(t *testing.T) {
	for _, c := range []struct {
		ts   []time.Duration
		want time.Duration
	}{
		{nil, 0},
		{[]time.Duration{5}, 0},
		{[]time.Duration{30, 10, 12, 50}, 20}, // unsorted: 10 12 30 50
		{[]time.Duration{7, 7, 9}, 2},
	} {
		if got := longestGap(c.ts); got != c.want {
			t.Errorf("longestGap(%v) = %v, want %v", c.ts, got, c.want)
		}
	}
}
