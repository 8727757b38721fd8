package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRunReports runs the demo briefly and checks that its report has
// every row with a ratio where one belongs, requests sent and answered
// on both sides, a verdict, the note on noise, a dump taken during the
// burst, and no key left held.
func TestRunReports(t *testing.T) {
	var out strings.Builder
	cfg := config{duration: 300 * time.Millisecond, rounds: 2, deadline: 50 * time.Millisecond, work: 2 * time.Millisecond,
		rate: 100, burst: 4, cold: 100, keys: 50}
	if err := run(context.Background(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	report := out.String()
	for _, want := range []string{
		"2 rounds of 300ms per implementation",
		"Clients give up after 50ms.",
		"fairlock keys held after the run: 0",
		"Each figure is the median of 2 rounds",
		"debug.Dump taken during the first burst", `fairlock "orders"`,
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(report, "\n") {
		for _, name := range []string{"requests sent", hotOrder + " requests sent", answered.name, hotAnswered.name, p50.name, p99.name, longest.name, wasted.name, overtaken.name, mostAhead.name} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
				rows[name] = strings.Fields(rest)
			}
		}
	}
	for _, name := range []string{answered.name, hotAnswered.name, p50.name, p99.name, longest.name} {
		cells := rows[name]
		if len(cells) < 3 || !strings.HasSuffix(cells[len(cells)-1], "×") && !strings.HasSuffix(cells[len(cells)-1], "×)") {
			t.Errorf("row %q has no ratio: %q\n%s", name, cells, report)
		}
	}
	for _, name := range []string{wasted.name, overtaken.name, mostAhead.name} {
		if _, ok := rows[name]; !ok {
			t.Errorf("no row %q:\n%s", name, report)
		}
	}
	if sent := rows["requests sent"]; len(sent) != 2 || sent[0] == "0" || sent[0] != sent[1] {
		t.Errorf("requests sent: %q, want the same number, not 0, on both sides", sent)
	}
	if ans := rows[answered.name]; len(ans) < 2 || strings.HasPrefix(ans[0], "0.0%") {
		t.Errorf("fairlock answered nothing within the deadline: %q", ans)
	}
	var v string
	for _, line := range strings.Split(report, "\n") {
		if strings.HasPrefix(line, "verdict: in every round, fairlock bought ") {
			v = line
		}
	}
	if !strings.Contains(v, "; in every round, it cost ") || !strings.Contains(v, "requests answered within their deadline") {
		t.Errorf("no verdict naming gains, costs and requests answered in:\n%s", report)
	}
}

// TestHandlerGivesUp checks the mechanism the demo shows, one request at
// a time: with the order's lock held, a request whose client has already
// gone leaves fairlock's queue at once and never updates the order; the
// sync.Mutex map's handler waits for the lock and then makes the update
// (wasted), unless it checks the context after mu.Lock.
func TestHandlerGivesUp(t *testing.T) {
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	serve := func(svc *service) (done chan struct{}, rec *httptest.ResponseRecorder) {
		svc.startRound()
		rec = httptest.NewRecorder()
		req := httptest.NewRequestWithContext(gone, http.MethodPost, "/orders/"+hotOrder, nil)
		req.SetPathValue("id", hotOrder)
		done = make(chan struct{})
		go func() { defer close(done); svc.ServeHTTP(rec, req) }()
		return done, rec
	}

	t.Run("fairlock", func(t *testing.T) {
		locker := fairlock.New[string]()
		defer locker.Close(context.Background())
		g, err := locker.Lock(context.Background(), hotOrder)
		if err != nil {
			t.Fatal(err)
		}
		svc := newService(fairKeyed{locker}, time.Millisecond, false)
		done, rec := serve(svc)
		select {
		case <-done: // while the lock is still held
			g.Unlock()
		case <-time.After(10 * time.Second):
			g.Unlock()
			<-done
			t.Fatal("fairlock's handler kept waiting for the lock after its client had gone")
		}
		if r := svc.endRound(); rec.Code != http.StatusServiceUnavailable || r.updates != 0 || len(r.waits) != 1 {
			t.Errorf("fairlock: status %d, %d updates, %d lock calls; want 503, 0, 1", rec.Code, r.updates, len(r.waits))
		}
	})
	for _, checkCtx := range []bool{false, true} {
		name, code, updates := "map", http.StatusNoContent, 1
		if checkCtx {
			name, code, updates = "map checking ctx", http.StatusServiceUnavailable, 0
		}
		t.Run(name, func(t *testing.T) {
			kl := &naiveKeyed{m: make(map[string]*sync.Mutex)}
			unlock, _ := kl.lock(context.Background(), hotOrder)
			svc := newService(kl, time.Millisecond, checkCtx)
			done, rec := serve(svc)
			// The handler cannot return before it gets the lock; poll
			// until it is being handled, then let it have the lock.
			for deadline := time.Now().Add(10 * time.Second); ; {
				svc.mu.Lock()
				active := svc.active
				svc.mu.Unlock()
				if active == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the request never reached the handler")
				}
				time.Sleep(time.Millisecond)
			}
			select {
			case <-done:
				t.Fatal("the map's handler returned while the lock was held")
			default:
			}
			unlock()
			<-done
			r := svc.endRound()
			if rec.Code != code || r.updates != updates || r.wasted != updates {
				t.Errorf("status %d, %d updates, %d wasted; want %d, %d, %d", rec.Code, r.updates, r.wasted, code, updates, updates)
			}
		})
	}
}

// TestSchedule checks that a seed gives the same requests at the same
// instants, in order, and that the hot order gets the burst.
func TestSchedule(t *testing.T) {
	cfg := config{duration: 4 * time.Second, rate: 200, burst: 4, cold: 100, keys: 10}
	a, b := schedule(cfg, 7), schedule(cfg, 7)
	if len(a) == 0 || len(a) != len(b) {
		t.Fatalf("schedules of one seed differ in length: %d, %d", len(a), len(b))
	}
	hot := make([]int, 4) // per quarter
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("schedules of one seed differ at %d: %v, %v", i, a[i], b[i])
		}
		if i > 0 && a[i].at < a[i-1].at {
			t.Fatalf("arrival %d at %v before arrival %d at %v", i, a[i].at, i-1, a[i-1].at)
		}
		if a[i].key == hotOrder {
			hot[a[i].at*4/cfg.duration]++
		} else if a[i].key == "order-0" || a[i].key > "order-9" {
			t.Errorf("cold arrival on %q", a[i].key)
		}
	}
	// 200/s for 1s per quarter, 800/s in the second: Poisson counts with
	// these means are well within ±25% of them.
	for q, want := range []int{200, 800, 200, 200} {
		if hot[q] < want*3/4 || hot[q] > want*5/4 {
			t.Errorf("quarter %d: %d hot arrivals, want about %d", q+1, hot[q], want)
		}
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
// it: more requests answered and less waiting in every round are gains,
// the reverse in every round costs, and a figure whose rounds straddle
// 1× (or stay within 2% of it) the same within the run's spread, whatever
// its median says.
func TestVerdict(t *testing.T) {
	ms := time.Millisecond
	round := func(answered, hotAnswered, wasted int, longestWait time.Duration, latencies ...time.Duration) stats {
		return stats{sent: 100, answered: answered, hotSent: 50, hotAnswered: hotAnswered,
			latencies: latencies, roundRecord: roundRecord{waits: []time.Duration{longestWait}, updates: 100, wasted: wasted}}
	}

	// One round: every ratio is its own range, on one side of 1 or the other.
	fair := []stats{round(80, 30, 0, 100*ms, 5*ms, 5*ms, 90*ms)}
	naive := []stats{round(60, 10, 30, 400*ms, 4*ms, 4*ms, 60*ms)}
	want := "verdict: in every round, fairlock bought 3.00× the order-0 requests answered within their deadline (60.0% against 20.0%), " +
		"1.33× the requests answered within their deadline (80.0% against 60.0%), " +
		"0.0% of updates made for a client that had gone, against 30.0% and 0.25× the longest lock wait of any request; " +
		"in every round, it cost 1.25× the median time to answer and 1.50× the p99 time to answer; " +
		"the same within this run's spread (its rounds fall on both sides, or within 2%): 0.0% of order-0 lock grants overtaken by a later call, against 0.0%."
	if got := verdict(fair, naive); got != want {
		t.Errorf("verdict =\n%s\nwant\n%s", got, want)
	}

	// Three rounds whose answered ratios straddle 1: its median reads as
	// a gain (1.05×), but a round says the opposite (0.90×), so it is the
	// same within the spread. The longest wait holds in every round.
	fair = []stats{round(63, 10, 0, 100*ms), round(54, 10, 0, 100*ms), round(70, 10, 0, 100*ms)}
	naive = []stats{round(60, 10, 0, 300*ms), round(60, 10, 0, 300*ms), round(60, 10, 0, 300*ms)}
	got := verdict(fair, naive)
	for _, want := range []string{
		"verdict: in every round, fairlock bought 0.33× the longest lock wait of any request; in every round, it cost nothing;",
		"1.05× (0.90×–1.17×) the requests answered within their deadline",
		"1.00× the order-0 requests answered within their deadline (20.0% against 20.0%)",
		"0.0% of updates made for a client that had gone, against 0.0%",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("verdict %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "bought 1.05") || strings.Contains(got, "cost 1.") {
		t.Errorf("verdict %q judges a straddling figure by its median", got)
	}

	// Rounds that all agree, with a spread that does not reach 1: a gain
	// and a cost, median and range shown.
	fair = []stats{round(80, 20, 1, 100*ms), round(85, 20, 2, 100*ms), round(90, 20, 3, 100*ms)}
	naive = []stats{round(60, 20, 0, 100*ms), round(60, 20, 0, 100*ms), round(60, 20, 0, 100*ms)}
	got = verdict(fair, naive)
	for _, want := range []string{
		"bought 1.42× (1.33×–1.50×) the requests answered within their deadline (85.0% against 60.0%)",
		"it cost 2.0% (1.0%–3.0%) of updates made for a client that had gone, against 0.0%",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("verdict %q lacks %q", got, want)
		}
	}
}
