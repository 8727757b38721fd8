package disttest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/elect"
	"github.com/fairlock/fairlock/fairlock"
)

// Elections (package elect) among worker processes, whose leaders act
// on a fenced store in the test's process: the role "elect" of the
// candidates, and the scenarios a backend's own tests call, each with a
// Backend (Server, TTL, New and Calls) and a prefix of its own.

// electRole is the role "elect": a candidate of the election on Key,
// driven by the cues it reads (Worker.Cue), one per line: "campaign"
// campaigns with the value Args["value"] and says "leader TOKEN" once it
// leads; "resign" resigns and says "resigned ERR"; "sync" says "synced"
// (everything it said before has been written). While it leads it acts
// every 5 ms, saying "act TOKEN N", each time right after term.Valid()
// said it leads; when the term ends it says "ended lost" or "ended
// resigned". It returns when its standard input ends.
func (w Worker) electRole(ctx context.Context, tools Tools) error {
	e := elect.New(tools.Locker, w.Key)
	var term *elect.Term
	for {
		cue, err := w.Cue()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		switch cue {
		case "campaign":
			t, err := e.Campaign(ctx, w.Args["value"])
			if err != nil {
				return err
			}
			term = t
			w.Say("leader", t.Token())
			go w.act(t)
		case "resign":
			w.Say("resigned", term.Resign(ctx))
		case "sync":
			w.Say("synced")
		}
	}
}

// act is a leader's work: an action every 5 ms while the term is valid.
func (w Worker) act(t *elect.Term) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for n := 1; ; {
		select {
		case <-t.Done():
			why := "resigned"
			if errors.Is(context.Cause(t.Context()), fairlock.ErrLost) {
				why = "lost"
			}
			w.Say("ended", why)
			return
		case <-tick.C:
			if t.Valid() {
				w.Say("act", t.Token(), n)
				n++
			}
		}
	}
}

// fencedActs is the fenced store of the election scenarios: every action
// of every leader comes to it, in the order its lines arrive, and an
// action whose term's token is below the largest it has seen is a
// violation: an old term acted after a newer one had.
type fencedActs struct {
	mu         sync.Mutex // protects the fields below
	max        uint64
	acts       map[uint64]int
	violations []string
}

// act records an action of the term with token, said in line.
func (s *fencedActs) act(token uint64, line string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.acts == nil {
		s.acts = make(map[uint64]int)
	}
	if token < s.max {
		s.violations = append(s.violations, fmt.Sprintf("%q after an action of term %d", line, s.max))
	}
	s.max = max(s.max, token)
	s.acts[token]++
}

// count returns the number of actions of the term with token.
func (s *fencedActs) count(token uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acts[token]
}

// check fails t if the store saw an old term act after a newer one.
func (s *fencedActs) check(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.violations) > 0 {
		t.Errorf("the fenced store saw old terms act after newer ones: %q", s.violations)
	}
}

// await waits until the store has n actions of the term with token.
func (s *fencedActs) await(t testing.TB, token uint64, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for s.count(token) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d actions of term %d, want %d", s.count(token), token, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// candidate is a worker process of the role "elect".
type candidate struct {
	p      *Proc
	events chan string // what it says but its actions, which go to the store
}

// startCandidate starts a worker of b in the role "elect" with value on
// key under prefix, its actions going to store; t.Cleanup kills it.
func startCandidate(t testing.TB, b Backend, prefix, key, value string, store *fencedActs) *candidate {
	t.Helper()
	p := b.start(t, "elect", prefix, key, map[string]string{"value": value})
	c := &candidate{p: p, events: make(chan string, 1000)}
	out := p.Collect(func(line string) {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "act" {
			tok, _ := strconv.ParseUint(f[1], 10, 64)
			store.act(tok, value+": "+line)
			return
		}
		select {
		case c.events <- line:
		default: // nobody reads it any more
		}
	})
	exited := make(chan struct{})
	go func() {
		<-out
		close(c.events)
		close(exited)
	}()
	// Before Start's own cleanup, which then finds the worker gone and
	// its exit put back by Collect.
	t.Cleanup(func() {
		resume(p.cmd.Process)
		_ = p.cmd.Process.Kill()
		<-exited
	})
	return c
}

// expect returns the candidate's next event, failing t unless it starts
// with prefix within d.
func (c *candidate) expect(t testing.TB, prefix string, d time.Duration) string {
	t.Helper()
	select {
	case line, ok := <-c.events:
		if !ok {
			t.Fatalf("the candidate exited; want %q", prefix)
		}
		if !strings.HasPrefix(line, prefix) {
			t.Fatalf("the candidate said %q; want %q", line, prefix)
		}
		return line
	case <-time.After(d):
		t.Fatalf("the candidate did not say %q within %v", prefix, d)
	}
	return ""
}

// expectAll returns once the candidate has said one line starting with
// each of prefixes, in any order, failing t if it says anything else or
// not within d.
func (c *candidate) expectAll(t testing.TB, d time.Duration, prefixes ...string) {
	t.Helper()
	timeout := time.After(d)
	left := append([]string(nil), prefixes...)
	for len(left) > 0 {
		select {
		case line, ok := <-c.events:
			if !ok {
				t.Fatalf("the candidate exited; want %q", left)
			}
			i := slices.IndexFunc(left, func(p string) bool { return strings.HasPrefix(line, p) })
			if i < 0 {
				t.Fatalf("the candidate said %q; want %q", line, left)
			}
			left = slices.Delete(left, i, i+1)
		case <-timeout:
			t.Fatalf("the candidate did not say %q within %v", left, d)
		}
	}
}

// leads returns the token of the candidate's term once it says it leads,
// failing t if it does not within d.
func (c *candidate) leads(t testing.TB, d time.Duration) uint64 {
	t.Helper()
	f := strings.Fields(c.expect(t, "leader ", d))
	tok, _ := strconv.ParseUint(f[1], 10, 64)
	return tok
}

// ElectPausedLeader checks that a paused leader never acts after its
// Deadline. The leader process is stopped (SIGSTOP) past its TTL while
// acting every 5 ms, and the next candidate, in another process, takes
// over and acts; resumed (SIGCONT), the old leader says its term ended
// and acts no more: the fenced store in this process never sees an
// action of the old term after one of the new. A process that does not
// campaign (a Locker of b.New) reads each leader's value, token and pid.
// The election is on the key "leader" under prefix. It is skipped where
// a process cannot be stopped (not a Unix system).
func ElectPausedLeader(t *testing.T, b Backend, prefix string) {
	if !canStop {
		t.Skip("disttest: stopping a process needs a Unix system")
	}
	store := &fencedActs{}
	observer := elect.New(b.New(t, prefix), "leader")
	ctx := context.Background()
	a := startCandidate(t, b, prefix, "leader", "a", store)
	a.p.Send(t, "campaign")
	ta := a.leads(t, 30*time.Second)
	store.await(t, ta, 3)
	bc := startCandidate(t, b, prefix, "leader", "b", store)
	bc.p.Send(t, "campaign")
	b.AwaitCalls(t, prefix, "leader", 2, 30*time.Second)
	if got, err := observer.Leader(ctx); err != nil || got.Value != "a" || got.Token != ta || got.Process.PID != a.p.Pid() {
		t.Fatalf("the leader read from a non-candidate: %+v, %v; want a, token %d, pid %d", got, err, ta, a.p.Pid())
	}
	a.p.Stop(t)
	stopped := time.Now()
	tb := bc.leads(t, b.TTL+10*time.Second)
	t.Logf("b leads %v after a was stopped (TTL %v)", time.Since(stopped), b.TTL)
	if tb <= ta {
		t.Fatalf("token %d after %d", tb, ta)
	}
	store.await(t, tb, 3)
	if got, err := observer.Leader(ctx); err != nil || got.Value != "b" || got.Token != tb || got.Process.PID != bc.p.Pid() {
		t.Fatalf("the leader read from a non-candidate: %+v, %v; want b, token %d", got, err, tb)
	}
	before := store.count(ta)
	a.p.Cont(t)
	a.expect(t, "ended lost", 30*time.Second)
	a.p.Send(t, "sync")
	a.expect(t, "synced", 10*time.Second)
	if after := store.count(ta); after != before {
		t.Errorf("the resumed leader acted %d times after its deadline", after-before)
	}
	store.check(t)
}

// ElectKilledLeader checks that a killed leader is replaced: the leader
// process is killed (SIGKILL) with another candidate queued, which leads
// within bound of the kill, with a larger token. The bound is the
// backend's: its TTL, the time its Lockers take to see the grant gone,
// and a margin for a loaded machine. The election is on the key
// "leader" under prefix.
func ElectKilledLeader(t *testing.T, b Backend, prefix string, bound time.Duration) {
	store := &fencedActs{}
	a := startCandidate(t, b, prefix, "leader", "a", store)
	a.p.Send(t, "campaign")
	ta := a.leads(t, 30*time.Second)
	bc := startCandidate(t, b, prefix, "leader", "b", store)
	bc.p.Send(t, "campaign")
	b.AwaitCalls(t, prefix, "leader", 2, 30*time.Second)
	killed := time.Now()
	a.p.Kill(t)
	tb := bc.leads(t, b.TTL+10*time.Second)
	took := time.Since(killed)
	t.Logf("b leads %v after a was killed (TTL %v)", took, b.TTL)
	if took > bound || tb <= ta {
		t.Errorf("b leads %v after the kill (bound %v), token %d after %d", took, bound, tb, ta)
	}
}

// ElectResignAndObserve checks Resign and Observe across processes: a
// process that does not campaign (a Locker of b.New) observes the
// election while candidates in worker processes lead, resign with a
// candidate queued (who leads at once: within a third of the TTL, the
// hand-over pushed rather than found by a re-read), resign with none (a
// vacancy), and campaign again; its stream shows every one of those
// states, in order, with growing tokens, and the fenced store never sees
// an old term act after a newer one. The election is on the key
// "leader" under prefix.
func ElectResignAndObserve(t *testing.T, b Backend, prefix string) {
	store := &fencedActs{}
	observer := elect.New(b.New(t, prefix), "leader", elect.WithInterval(20*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := observer.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	next := func(value string, token uint64, pid int) {
		t.Helper()
		var got elect.Leader
		select {
		case got = <-stream:
		case <-time.After(30 * time.Second):
			t.Fatal("no change observed within 30 s")
		}
		if got.Value != value || got.Token != token || (pid != 0 && got.Process.PID != pid) {
			t.Fatalf("Observe: %+v; want %q token %d pid %d", got, value, token, pid)
		}
	}
	next("", 0, 0)
	a := startCandidate(t, b, prefix, "leader", "a", store)
	a.p.Send(t, "campaign")
	ta := a.leads(t, 30*time.Second)
	next("a", ta, a.p.Pid())
	bc := startCandidate(t, b, prefix, "leader", "b", store)
	bc.p.Send(t, "campaign")
	b.AwaitCalls(t, prefix, "leader", 2, 30*time.Second)
	resigned := time.Now()
	a.p.Send(t, "resign")
	tb := bc.leads(t, 30*time.Second)
	took := time.Since(resigned)
	t.Logf("b leads %v after a was told to resign", took)
	if took > b.TTL/3 {
		t.Errorf("the hand-over took %v: not pushed (a third of the TTL, a re-read period, is %v)", took, b.TTL/3)
	}
	a.expectAll(t, 10*time.Second, "ended resigned", "resigned <nil>")
	next("b", tb, bc.p.Pid())
	bc.p.Send(t, "resign")
	bc.expectAll(t, 10*time.Second, "ended resigned", "resigned <nil>")
	next("", 0, 0)
	a.p.Send(t, "campaign")
	ta2 := a.leads(t, 30*time.Second)
	next("a", ta2, a.p.Pid())
	if ta2 <= tb || tb <= ta {
		t.Errorf("tokens %d, %d, %d: not growing", ta, tb, ta2)
	}
	store.check(t)
}
