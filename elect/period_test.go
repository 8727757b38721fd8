package elect_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/elect"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
)

// The recipe of example_test.go (lastRun, runDue, everyPeriod) for a job
// that runs once per period on the leader only, tested.

// TestOncePerPeriodClocksDiffer: a replica whose clock is ahead runs a
// period early; leadership moves mid-period to a replica whose clock is
// behind, which finds that period (and the one its clock is still in)
// run, and runs the next; a deposed leader whose check passed before a
// pause is refused by the record's token (fencing), whichever period its
// clock says. Every period runs once.
func TestOncePerPeriodClocksDiffer(t *testing.T) {
	for _, skew := range []time.Duration{200 * time.Millisecond, -200 * time.Millisecond, 0} {
		t.Run(fmt.Sprint("skew ", skew), func(t *testing.T) {
			_, l := newLocker(t, "period")
			e := elect.New(l, "job")
			record := &lastRun{}
			ctx := context.Background()
			const every = time.Second
			t0 := time.Unix(2_000_000, 0) // a period's start on the true clock
			var ran []int64
			job := func(p int64) { ran = append(ran, p-2_000_000) }
			a, err := e.Campaign(ctx, "a") // a's clock is off by skew
			if err != nil {
				t.Fatal(err)
			}
			for _, at := range []time.Duration{0, 500 * time.Millisecond, 900 * time.Millisecond} {
				runDue(a, t0.Add(at+skew), every, record, job)
			}
			bch := campaign(t, ctx, e, "b")
			if err := a.Resign(ctx); err != nil { // mid-period
				t.Fatal(err)
			}
			b := recv(t, bch, "b's term")
			for _, at := range []time.Duration{950 * time.Millisecond, 1000 * time.Millisecond, 1500 * time.Millisecond, 2000 * time.Millisecond, 2100 * time.Millisecond} {
				runDue(b, t0.Add(at), every, record, job)
			}
			// a, deposed, was paused after its Valid check: its claim
			// comes with its old token, for a period its clock says is new.
			if record.claim(5, a.Token()) {
				t.Fatal("a claim with the deposed term's token was accepted")
			}
			b.Resign(ctx)
			want := []int64{0, 1, 2}
			if skew < 0 {
				want = []int64{-1, 0, 1, 2} // a's clock was still in the period before
			}
			if !slices.Equal(ran, want) {
				t.Fatalf("periods run %v, want %v: each once", ran, want)
			}
		})
	}
}

// TestOncePerPeriodLeadershipMoves: two replicas run the recipe with
// Election.Run on the real clock, each giving leadership up after a
// period and a half (mid-period) so that it moves back and forth; no
// period runs twice, and the periods run go forward.
func TestOncePerPeriodLeadershipMoves(t *testing.T) {
	fl := fairlock.New[string]()
	defer fl.Close(context.Background())
	l := keylock.InProcess(fl)
	record := &lastRun{}
	const every = 20 * time.Millisecond
	var mu sync.Mutex
	var ran []int64
	terms := 0
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := elect.New(l, "job")
			e.Run(ctx, name, func(ctx context.Context, t *elect.Term) error {
				mu.Lock()
				terms++
				mu.Unlock()
				tctx, stop := context.WithTimeout(ctx, every*3/2)
				defer stop()
				everyPeriod(tctx, t, every, record, func(p int64) {
					mu.Lock()
					ran = append(ran, p)
					mu.Unlock()
				})
				return nil // resign, and campaign again behind the other
			})
		}()
	}
	await(t, "twelve leadership changes", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return terms >= 12
	})
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d terms ran %d periods", terms, len(ran))
	for i := 1; i < len(ran); i++ {
		if ran[i] <= ran[i-1] {
			t.Fatalf("period %d ran after period %d: %v", ran[i], ran[i-1], ran)
		}
	}
}
