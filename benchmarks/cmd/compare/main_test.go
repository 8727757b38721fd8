package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/benchmarks"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestMaxWaitShape checks that the line under the targets tells the three
// shapes of fairlock's longest wait apart, at the FIFO bound of G-1 grants.
func TestMaxWaitShape(t *testing.T) {
	waits := []time.Duration{80 * time.Microsecond, 3 * time.Millisecond}
	for _, c := range []struct {
		grants int
		pause  time.Duration
		shape  waitShape
		want   string
	}{
		{32, 100 * time.Microsecond, heldUp, "held up before it joined the queue (32 grants"},
		{31, 2 * time.Millisecond, stalled, "in the queue through a stall of the whole run (no grant anywhere for 2.00ms of it)"},
		{31, 100 * time.Microsecond, queued, "in the queue (31 grants; longest interval without one 100.0µs)"},
	} {
		got := maxWaitShape(benchmarks.Contended{Goroutines: 32, Waits: waits, GrantsInMaxWait: c.grants, PauseInMaxWait: c.pause})
		if got.shape != c.shape || !strings.HasPrefix(got.text, "3.00ms, ") || !strings.Contains(got.text, c.want) {
			t.Errorf("maxWaitShape(%d grants, pause %v) = %+v, want shape %d, 3.00ms and %q", c.grants, c.pause, got, c.shape, c.want)
		}
	}
}

// TestMedianOp checks that one slow round does not set an implementation's
// per-operation cost, and that the rounds are left in the order taken.
func TestMedianOp(t *testing.T) {
	rounds := []benchmarks.OpResult{{NsPerOp: 61}, {NsPerOp: 88, AllocsPerOp: 1}, {NsPerOp: 55}}
	if got, want := medianOp(rounds), (benchmarks.OpResult{NsPerOp: 61}); got != want {
		t.Errorf("medianOp(61, 88, 55 ns) = %+v, want %+v", got, want)
	}
	if rounds[0].NsPerOp != 61 || rounds[1].NsPerOp != 88 || rounds[2].NsPerOp != 55 {
		t.Errorf("medianOp reordered its argument: %+v", rounds)
	}
}

// TestPrintTargetRuns checks the summary of repeated runs: each run's
// value, a star on a miss, the count of runs that met the bar and the
// median over the runs.
func TestPrintTargetRuns(t *testing.T) {
	run := func(maxWait, jain float64) []target {
		return []target{
			{"hot key G=32: max wait ÷ moby/locker", maxWait, "<=", 0.25},
			{"hot key G=32: Jain", jain, ">=", 0.99},
		}
	}
	var b strings.Builder
	steal := func(run, hot32 time.Duration) hostSteal { return hostSteal{run, hot32, true} }
	printTargetRuns(&b, [][]target{run(0.13, 1), run(0.34, 1), run(0.12, 0.98), run(0.25, 1)},
		[]hostSteal{steal(150*time.Millisecond, 20*time.Millisecond), steal(2*time.Second, 900*time.Millisecond),
			steal(0, 0), steal(310*time.Millisecond, 40*time.Millisecond)})
	lines := strings.Split(b.String(), "\n")
	for _, c := range []struct{ prefix, want string }{
		{"hot key G=32: max wait", "<=  0.250  0.130  0.340*  0.120  0.250  3/4  0.190"},
		{"hot key G=32: Jain", ">=  0.990  1.000  1.000  0.980*  1.000  3/4  1.000"},
		{"host steal time over the run (s)", "0.15  2.00  0.00  0.31  0.23"},
		{"host steal time in G=32 hot-key runs (s)", "0.02  0.90  0.00  0.04  0.03"},
	} {
		found := false
		for _, l := range lines {
			if strings.Contains(l, c.prefix) {
				found = true
				if got := strings.Join(strings.Fields(l[strings.Index(l, c.prefix)+len(c.prefix):]), "  "); !strings.HasSuffix(got, c.want) {
					t.Errorf("row %q = %q, want it to end %q", c.prefix, got, c.want)
				}
			}
		}
		if !found {
			t.Errorf("no row for %q in\n%s", c.prefix, b.String())
		}
	}
	if !strings.Contains(b.String(), "Targets over 4 runs") {
		t.Errorf("no heading in\n%s", b.String())
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := median(slices.Clone(c.xs)); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.xs, got, c.want)
		}
	}
}

// TestMissed checks that a run counts as missing the max-wait bar only
// when that target, not another one, was missed.
func TestMissed(t *testing.T) {
	met := []target{{maxWaitTarget, 0.1, "<=", 0.25}, {"hot key G=32: Jain", 1, ">=", 0.99}}
	otherMissed := []target{{maxWaitTarget, 0.1, "<=", 0.25}, {"hot key G=32: Jain", 0.9, ">=", 0.99}}
	maxMissed := []target{{maxWaitTarget, 0.4, "<=", 0.25}, {"hot key G=32: Jain", 1, ">=", 0.99}}
	for _, c := range []struct {
		ts   []target
		want bool
	}{
		{met, false},
		{otherMissed, false},
		{maxMissed, true},
	} {
		if got := missed(c.ts, maxWaitTarget); got != c.want {
			t.Errorf("missed(%v) = %v, want %v", c.ts, got, c.want)
		}
	}
}

// TestMaxWaitHints checks which explanation follows the max-wait misses:
// the realtime class for a call held up before the queue (and only under
// time-sharing), the whole-run stall for a stall under any class, and
// nothing for a wait in the queue or for no miss.
func TestMaxWaitHints(t *testing.T) {
	for _, c := range []struct {
		missedBy []waitShape
		realtime bool
		want     []string
	}{
		{nil, false, nil},
		{[]waitShape{queued}, false, nil},
		{[]waitShape{heldUp}, false, []string{schedulerHint}},
		{[]waitShape{heldUp}, true, nil},
		{[]waitShape{stalled}, false, []string{stallHint}},
		{[]waitShape{stalled}, true, []string{stallHint}},
		{[]waitShape{stalled, heldUp, stalled}, false, []string{schedulerHint, stallHint}},
	} {
		if got := maxWaitHints(c.missedBy, c.realtime); !slices.Equal(got, c.want) {
			t.Errorf("maxWaitHints(%v, realtime %v) gave %d hints, want %d: %q", c.missedBy, c.realtime, len(got), len(c.want), got)
		}
	}
}
