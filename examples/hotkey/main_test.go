package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRunReports runs the demo briefly and checks that its report has
// every row with a ratio where one belongs, served requests on both sides,
// no failures, a verdict naming both a cost and a gain, the note on
// noise, a mid-run dump, and no key left held.
func TestRunReports(t *testing.T) {
	var out strings.Builder
	cfg := config{duration: 200 * time.Millisecond, rounds: 2, clients: 8, keys: 50, skew: 2, steps: 4, hold: 20 * time.Microsecond}
	if err := run(context.Background(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	report := out.String()
	for _, want := range []string{
		"2 rounds of 200ms per implementation",
		"fairlock keys held after the run: 0",
		"Each figure is the median of 2 rounds",
		`debug.Dump taken mid-run under load`, `fairlock "orders"`,
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(report, "\n") {
		for _, name := range []string{"requests served", "requests failed", throughput.name, p50.name, p99.name, pMax.name, overtaken.name, mostAhead.name} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
				rows[name] = strings.Fields(rest)
			}
		}
	}
	for _, name := range []string{throughput.name, p50.name, p99.name, pMax.name} {
		cells := rows[name]
		if len(cells) < 3 || !strings.HasSuffix(cells[len(cells)-1], "×") && !strings.HasSuffix(cells[len(cells)-1], "×)") {
			t.Errorf("row %q has no ratio: %q\n%s", name, cells, report)
		}
	}
	if served := rows["requests served"]; len(served) != 2 || served[0] == "0" || served[1] == "0" {
		t.Errorf("an implementation served nothing: %q", served)
	}
	if failed := rows["requests failed"]; len(failed) != 2 || failed[0] != "0" || failed[1] != "0" {
		t.Errorf("requests failed: %q", failed)
	}
	var v string
	for _, line := range strings.Split(report, "\n") {
		if strings.HasPrefix(line, "verdict: in every round, fairlock bought ") {
			v = line
		}
	}
	if !strings.Contains(v, "; in every round, it cost ") || !strings.Contains(v, "lock calls overtaken by a later call, against") {
		t.Errorf("no verdict naming gain, cost and overtaking in:\n%s", report)
	}
}

// TestOvertakes checks the counts on known grant orders. Times are start
// times in the order the calls were granted.
func TestOvertakes(t *testing.T) {
	at := func(ms ...int) []time.Time {
		base := time.Unix(0, 0)
		ts := make([]time.Time, len(ms))
		for i, m := range ms {
			ts[i] = base.Add(time.Duration(m) * time.Millisecond)
		}
		return ts
	}
	for _, c := range []struct {
		starts          []time.Time
		overtaken, most int
	}{
		{nil, 0, 0},
		{at(1, 2, 3, 4), 0, 0},          // FIFO
		{at(1, 2, 2, 3), 0, 0},          // ties overtake nobody
		{at(4, 3, 2, 1), 3, 3},          // LIFO: the call that began first is granted last, after 3 later ones
		{at(1, 5, 6, 2, 7, 3), 2, 3},    // 2 is overtaken by 5 and 6; 3 by 5, 6 and 7
		{at(10, 1, 2, 3, 11, 4), 4, 2},  // 1, 2, 3 and 4 each overtaken by 10 (and 4 by 11)
		{at(10, 11, 1, 12, 2), 2, 3},    // 1 by 10, 11; 2 by 10, 11, 12
		{at(5, 5, 1, 5), 1, 2},          // 1 by both 5s; the last 5 by nobody
		{at(2, 9, 1, 8, 7, 3), 4, 3},    // 1 by 2, 9; 8 by 9; 7 by 9, 8; 3 by 9, 8, 7
		{at(1, 3, 2, 4, 6, 5, 7), 2, 1}, // two neighbours swapped twice
	} {
		overtaken, most := overtakes(c.starts)
		if overtaken != c.overtaken || most != c.most {
			t.Errorf("overtakes(%v) = %d, %d; want %d, %d", c.starts, overtaken, most, c.overtaken, c.most)
		}
	}
}

// TestVerdict checks that each figure lands on the side every round puts
// it: a higher throughput and a lower wait in every round are gains, the
// reverse in every round costs, and a figure whose rounds straddle 1× (or
// stay within 2% of it) the same within the run's spread, whatever its
// median says.
func TestVerdict(t *testing.T) {
	ms := time.Millisecond
	round := func(served int, overtaken int, waits ...time.Duration) stats {
		return stats{served: served, elapsed: time.Second, waits: waits, calls: 100, overtaken: overtaken}
	}

	// One round: every ratio is its own range, on one side of 1 or the other.
	fair := []stats{round(900, 0, 30*ms, 40*ms, 50*ms)}
	naive := []stats{round(1000, 20, 10*ms, 20*ms, 100*ms)}
	want := "verdict: in every round, fairlock bought 0.0% of order-0 lock calls overtaken by a later call, against 20.0%, " +
		"0.50× the p99 wait and 0.50× the longest wait; in every round, it cost 0.90× the throughput and 2.00× the median order-0 wait."
	if got := verdict(fair, naive); got != want {
		t.Errorf("verdict =\n%s\nwant\n%s", got, want)
	}

	// Within 2%, and more overtaken: the same, and a cost.
	fair[0].served, fair[0].overtaken = 1010, 30
	got := verdict(fair, naive)
	for _, want := range []string{
		"; the same within this run's spread (its rounds fall on both sides, or within 2%): 1.01× the throughput.",
		"it cost 30.0% of order-0 lock calls overtaken by a later call, against 20.0% and 2.00× the median order-0 wait;",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("verdict %q lacks %q", got, want)
		}
	}

	// Three rounds whose throughput ratios straddle 1: its median reads
	// as a gain (1.07×), but a round says the opposite (0.81×), so it is
	// the same within the spread. The tail (p99, max) and the overtaking
	// hold in every round.
	fair = []stats{
		round(1070, 0, 10*ms, 10*ms, 13*ms),
		round(810, 0, 10*ms, 10*ms, 7*ms),
		round(1100, 0, 10*ms, 10*ms, 14*ms),
	}
	naive = []stats{
		round(1000, 5, 10*ms, 10*ms, 10*ms, 40*ms),
		round(1000, 9, 10*ms, 10*ms, 10*ms, 40*ms),
		round(1000, 1, 10*ms, 10*ms, 10*ms, 40*ms),
	}
	got = verdict(fair, naive)
	for _, want := range []string{
		"verdict: in every round, fairlock bought 0.0% of order-0 lock calls overtaken by a later call, against 5.0% (1.0%–9.0%)",
		"the longest wait; in every round, it cost nothing;",
		"the same within this run's spread",
		"1.07× (0.81×–1.10×) the throughput",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("verdict %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "cost 1.") || strings.Contains(got, "bought 1.07") {
		t.Errorf("verdict %q judges a straddling figure by its median", got)
	}

	// Rounds that all agree, with a spread that does not reach 1: a gain
	// and a cost, median and range shown.
	fair = []stats{round(800, 0, 10*ms), round(850, 0, 10*ms), round(900, 0, 10*ms)}
	naive = []stats{round(1000, 3, 20*ms), round(1000, 3, 20*ms), round(1000, 3, 20*ms)}
	got = verdict(fair, naive)
	for _, want := range []string{
		"it cost 0.85× (0.80×–0.90×) the throughput",
		"bought 0.0% of order-0 lock calls overtaken by a later call, against 3.0%, 0.50× the median order-0 wait",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("verdict %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "the same within") {
		t.Errorf("verdict %q calls an agreeing figure the same", got)
	}
}
