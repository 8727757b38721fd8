package elect_test

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fairlock/fairlock/elect"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
)

// A candidate leads, a process that does not campaign reads who leads,
// and the leader resigns.
func Example() {
	locks := keylock.InProcess(fairlock.New[string]()) // or etcdlock.New, redislock.New
	e := elect.New(locks, "scheduler")
	ctx := context.Background()

	term, err := e.Campaign(ctx, "replica-1") // blocks until this candidate leads
	if err != nil {
		panic(err)
	}
	leader, _ := elect.New(locks, "scheduler").Leader(ctx) // anyone may ask
	fmt.Println("leader:", leader.Value, leader.Token == term.Token())

	// The leader's work: stop when term.Context() ends; check
	// term.Valid() right before each action, and fence the action with
	// term.Token() where the store can.
	if term.Valid() {
		fmt.Println("acting under token", term.Token())
	}

	if err := term.Resign(ctx); err != nil { // the next candidate leads at once
		panic(err)
	}
	leader, _ = e.Leader(ctx)
	fmt.Println("vacant:", leader.Vacant())
	// Output:
	// leader: replica-1 true
	// acting under token 1
	// vacant: true
}

// lastRun is the record of the last run of a periodic job: in a real
// service, a row in the database the job writes to, so that the record
// and the job's effect can share a transaction.
type lastRun struct {
	mu     sync.Mutex
	period int64  // the last period run
	token  uint64 // the term that ran it
	runs   []string
}

// claim records that the term with token runs period, and reports
// whether it may: only a period after the last one run, and only by a
// term no older than the one that ran it (fencing: a deposed leader
// whose check passed before a pause is refused once the new leader has
// run). One atomic step; in SQL:
//
//	UPDATE last_run SET period = $1, token = $2 WHERE period < $1 AND token <= $2
func (r *lastRun) claim(period int64, token uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if period <= r.period || token < r.token {
		return false
	}
	r.period, r.token = period, token
	return true
}

// runDue runs job for the period that the replica's clock (now) is in,
// if the term t still leads and the record says nobody has run it: the
// check-claim-run step of a periodic job on the leader. Each replica
// reads its own clock: replicas whose clocks differ disagree on when a
// period begins, and the record, not the clock, decides.
func runDue(t *elect.Term, now time.Time, every time.Duration, r *lastRun, job func(period int64)) {
	p := now.UnixNano() / int64(every)
	if t.Valid() && r.claim(p, t.Token()) {
		job(p)
	}
}

// everyPeriod runs job once per period while t leads: at each boundary
// of the replica's own clock it calls runDue, until ctx ends (the term's
// context, or one derived from it: it ends at a Resign, a loss, the
// Deadline). A replica runs it for each term it leads (in Election.Run's
// fn).
func everyPeriod(ctx context.Context, t *elect.Term, every time.Duration, r *lastRun, job func(period int64)) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case now := <-timer.C:
			runDue(t, now, every, r, job)
			next := time.Unix(0, (now.UnixNano()/int64(every)+1)*int64(every))
			timer.Reset(time.Until(next))
		}
	}
}

// A job that runs once per period, on the leader only, as each replica
// of a service would run it (Election.Run with everyPeriod).
func ExampleElection_Run_oncePerPeriod() {
	locks := keylock.InProcess(fairlock.New[string]())
	e := elect.New(locks, "nightly-report")
	record := &lastRun{}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := e.Run(ctx, "replica-1", func(ctx context.Context, t *elect.Term) error {
		return everyPeriod(ctx, t, time.Hour, record, func(period int64) {
			// This hour's report; its writes carry t.Token() for fencing.
			record.runs = append(record.runs, fmt.Sprint("period ", period))
		})
	})
	fmt.Println(err, len(record.runs) > 0)
	// Output: context deadline exceeded true
}

// Leadership moves from a replica whose clock is 200ms ahead to one
// whose clock is right, in the middle of a period: the period the first
// ran is not run again by the second, though the second's clock says it
// has just begun (the instants are made up: the clocks are the
// example's).
func ExampleElection_Campaign_clocksDiffer() {
	locks := keylock.InProcess(fairlock.New[string]())
	e := elect.New(locks, "report")
	record := &lastRun{}
	ctx := context.Background()
	const every = time.Second
	t0 := time.Unix(1_000_000, 0) // the start of a period, on the true clock
	job := func(name string) func(int64) {
		return func(p int64) { record.runs = append(record.runs, fmt.Sprint(name, " ran period ", p-1_000_000)) }
	}
	fast := func(real time.Duration) time.Time { return t0.Add(real + 200*time.Millisecond) }
	right := func(real time.Duration) time.Time { return t0.Add(real) }

	a, _ := e.Campaign(ctx, "fast")
	runDue(a, fast(0), every, record, job("fast"))
	runDue(a, fast(850*time.Millisecond), every, record, job("fast")) // its clock says period 1 has begun
	a.Resign(ctx)

	b, _ := e.Campaign(ctx, "right")
	runDue(b, right(900*time.Millisecond), every, record, job("right"))  // still period 0 on its clock
	runDue(b, right(1000*time.Millisecond), every, record, job("right")) // period 1 begins on its clock
	runDue(b, right(2000*time.Millisecond), every, record, job("right"))
	b.Resign(ctx)

	for _, r := range record.runs {
		fmt.Println(r)
	}
	// Output:
	// fast ran period 0
	// fast ran period 1
	// right ran period 2
}
