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
// median over the runs; then each run's G=32 throughputs, fairlock's
// longest wait beside what the bar allowed and the clock-only probe's
// longest stall, and the steal time.
func TestPrintTargetRuns(t *testing.T) {
	run := func(maxWait, jain, fairOps float64, stealRun, stealHot time.Duration) runResult {
		return runResult{
			p99Ratio: maxWait / 4,
			targets: []target{
				{"hot key G=32: max wait ÷ moby/locker", maxWait, "<=", 0.25},
				{"hot key G=32: Jain", jain, ">=", 0.99},
			},
			steal:      hostSteal{stealRun, stealHot, true},
			hot32:      map[string]float64{"fairlock": fairOps, "moby/locker": 351_680, "containerd/kmutex": 254_527, "sync.Mutex": 369_429},
			maxWait:    time.Duration(maxWait * float64(12*time.Millisecond)),
			allowed:    3 * time.Millisecond,
			clockStall: stealHot * 10,
		}
	}
	var b strings.Builder
	printTargetRuns(&b, []runResult{
		run(0.13, 1, 263_566, 150*time.Millisecond, 20*time.Millisecond),
		run(0.34, 1, 240_000, 2*time.Second, 900*time.Millisecond),
		run(0.12, 0.98, 251_049, 0, 0),
		run(0.25, 1, 270_100, 310*time.Millisecond, 40*time.Millisecond),
	})
	lines := strings.Split(b.String(), "\n")
	for _, c := range []struct{ prefix, want string }{
		{"hot key G=32: max wait ÷ moby/locker", "<=  0.250  0.130  0.340*  0.120  0.250  3/4  0.190"},
		{"hot key G=32: Jain", ">=  0.990  1.000  1.000  0.980*  1.000  3/4  1.000"},
		{"hot key G=32: p99 wait ÷ moby/locker (no bar)", "0.033  0.085  0.030  0.062  0.048"},
		{"hot key G=32: fairlock max wait (ms)", "1.56  4.08  1.44  3.00  2.28"},
		{"hot key G=32: max wait the bar allowed (ms)", "3.00  3.00  3.00  3.00  3.00"},
		{"host: longest clock-only stall (ms)", "200.00  9000.00  0.00  400.00  300.00"},
		{"hot key G=32: fairlock ops/s (thousands)", "263.6  240.0  251.0  270.1  257.3"},
		{"hot key G=32: moby/locker ops/s (thousands)", "351.7  351.7  351.7  351.7  351.7"},
		{"hot key G=32: containerd/kmutex ops/s (thousands)", "254.5  254.5  254.5  254.5  254.5"},
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
	if strings.Contains(b.String(), "sync.Mutex") {
		t.Errorf("the summary shows sync.Mutex's throughput, which no bar compares with:\n%s", b.String())
	}
}

// TestPrintTargetRunsWithoutSteal checks that the steal rows are left out
// when a run could not read the steal time, not printed as zeros.
func TestPrintTargetRunsWithoutSteal(t *testing.T) {
	runs := []runResult{
		{targets: []target{{"hot key G=32: Jain", 1, ">=", 0.99}}, steal: hostSteal{time.Second, 0, true}},
		{targets: []target{{"hot key G=32: Jain", 1, ">=", 0.99}}, steal: hostSteal{}},
	}
	var b strings.Builder
	printTargetRuns(&b, runs)
	if strings.Contains(b.String(), "steal") {
		t.Errorf("steal rows printed though run 2 did not read it:\n%s", b.String())
	}
	runs[1].steal = hostSteal{0, 0, true}
	b.Reset()
	printTargetRuns(&b, runs)
	if !strings.Contains(b.String(), "host steal time over the run (s)") {
		t.Errorf("no steal rows though every run read it:\n%s", b.String())
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

// TestRunOrder checks that a series of as many runs as there are
// implementations puts each implementation in each place once, that every
// run measures all of them, and that the first run keeps Impls' order.
func TestRunOrder(t *testing.T) {
	impls := benchmarks.Impls()
	n := len(impls)
	if got := names(runOrder(impls, 0)); got != names(impls) {
		t.Errorf("run 0 order = %s, want Impls' order %s", got, names(impls))
	}
	places := map[string]map[int]bool{}
	for run := range n {
		order := runOrder(impls, run)
		if len(order) != n {
			t.Fatalf("run %d measures %d implementations, want %d", run, len(order), n)
		}
		for place, impl := range order {
			if places[impl.Name] == nil {
				places[impl.Name] = map[int]bool{}
			}
			if places[impl.Name][place] {
				t.Errorf("%s takes place %d twice in %d runs", impl.Name, place, n)
			}
			places[impl.Name][place] = true
		}
	}
	for _, impl := range impls {
		if len(places[impl.Name]) != n {
			t.Errorf("%s took %d of the %d places over %d runs", impl.Name, len(places[impl.Name]), n, n)
		}
	}
	if got, want := runOrder(impls, n+1)[0].Name, impls[1].Name; got != want {
		t.Errorf("run %d starts with %s, want %s (the rotation repeats)", n+1, got, want)
	}
	if impls[0].Name != "fairlock" {
		t.Errorf("runOrder rotated Impls' own slice: it now starts with %s", impls[0].Name)
	}
}

// TestHostStallLine checks the line under a run's targets that sets the
// clock-only probe's longest stall beside what the max-wait bar allowed
// fairlock and what it waited, and that the allowance comes from the
// max-wait target's own bound.
func TestHostStallLine(t *testing.T) {
	ts := []target{{"hot key G=32: Jain", 1, ">=", 0.99}, {maxWaitTarget, 0.4, "<=", 0.25}}
	if got := maxWaitBound(ts); got != 0.25 {
		t.Errorf("maxWaitBound = %v, want the max-wait target's 0.25", got)
	}
	r := runResult{clockStall: 9960 * time.Microsecond, allowed: 2390 * time.Microsecond, maxWait: 4360 * time.Microsecond}
	want := "a thread that only read the clock stalled for up to 9.96ms in 1.5s after the G=32 runs; the max-wait bar allowed fairlock 2.39ms, and it waited 4.36ms at most"
	if got := r.hostStallLine(1500 * time.Millisecond); got != want {
		t.Errorf("hostStallLine =\n%q, want\n%q", got, want)
	}
}

// TestHostStallHint checks that the hint counts only the runs that missed
// the max-wait bar while the clock-only probe stalled for longer than the
// bar allowed, and that it is left out when there are none.
func TestHostStallHint(t *testing.T) {
	run := func(ratio float64, stall, allowed time.Duration) runResult {
		return runResult{targets: []target{{maxWaitTarget, ratio, "<=", 0.25}}, clockStall: stall, allowed: allowed}
	}
	ms := time.Millisecond
	if got := hostStallHint([]runResult{run(0.1, 9*ms, 3*ms), run(0.4, 2*ms, 3*ms)}); got != "" {
		t.Errorf("hint with no miss over the probe's stall: %q", got)
	}
	got := hostStallHint([]runResult{run(0.6, 20*ms, 4*ms), run(0.1, 9*ms, 3*ms), run(0.4, 2*ms, 3*ms), run(0.3, 10*ms, 3*ms)})
	if !strings.HasPrefix(got, "In 2 of the 3 run(s) that missed the max-wait bar,") {
		t.Errorf("hostStallHint = %q, want it to count 2 of 3 missed runs", got)
	}
}
