package redislock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock/debug"
	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/elect"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// Who holds a key, from any process, and package elect, on Redis: the
// listing (Locker.Calls) and the debug view's calls ahead, read in this
// process of calls made by worker processes (the test binary
// re-executed, process_test.go), and elections among worker processes
// that a fenced store in this process checks.

func init() {
	roles["labelled-hold"] = labelledHoldWorker
	roles["elect"] = electWorker
}

// labelledHoldWorker is a worker's "labelled-hold" role: it locks key
// with a flow labelled REDISLOCK_TEST_LABEL, says "held TOKEN", and stays
// until killed.
func labelledHoldWorker(ctx context.Context, _ *redis.Client, l *redislock.Locker, key string) error {
	g, err := l.Lock(owner.NewLabeledContext(ctx, os.Getenv("REDISLOCK_TEST_LABEL")), key)
	if err != nil {
		return err
	}
	fmt.Println("held", g.Token())
	select {}
}

// electWorker is a worker's "elect" role (runElectWorker).
func electWorker(ctx context.Context, _ *redis.Client, l *redislock.Locker, key string) error {
	return runElectWorker(ctx, l, key, os.Getenv("REDISLOCK_TEST_VALUE"), os.Stdin, os.Stdout)
}

// runElectWorker is a candidate of the election on key, driven by the
// commands it reads, one per line: "campaign" campaigns with value and
// says "leader TOKEN" once it leads; "resign" resigns and says "resigned
// ERR"; "sync" says "synced" (everything it said before has been
// written). While it leads it acts every 5 ms, saying "act TOKEN N",
// each time right after term.Valid() said it leads; when the term ends
// it says "ended lost" or "ended resigned".
func runElectWorker(ctx context.Context, l keylock.Locker, key, value string, in io.Reader, out io.Writer) error {
	var mu sync.Mutex
	say := func(a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintln(out, a...)
	}
	e := elect.New(l, key)
	var term *elect.Term
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		switch sc.Text() {
		case "campaign":
			t, err := e.Campaign(ctx, value)
			if err != nil {
				return err
			}
			term = t
			say("leader", t.Token())
			go act(t, say)
		case "resign":
			say("resigned", term.Resign(ctx))
		case "sync":
			say("synced")
		}
	}
	return sc.Err()
}

// act is a leader's work: an action every 5 ms while the term is valid.
func act(t *elect.Term, say func(...any)) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for n := 1; ; {
		select {
		case <-t.Done():
			why := "resigned"
			if errors.Is(context.Cause(t.Context()), fairlock.ErrLost) {
				why = "lost"
			}
			say("ended", why)
			return
		case <-tick.C:
			if t.Valid() {
				say("act", t.Token(), n)
				n++
			}
		}
	}
}

// fencedActs is the fenced store of the election tests: every action of
// every leader comes to it, in the order its lines arrive, and an action
// whose term's token is below the largest it has seen is a violation: an
// old term acted after a newer one had.
type fencedActs struct {
	mu         sync.Mutex
	max        uint64
	acts       map[uint64]int
	violations []string
}

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

func (s *fencedActs) count(token uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acts[token]
}

// candidate is a worker process of the "elect" role.
type candidate struct {
	p      *disttest.Proc
	events chan string // what it says but its actions, which go to the store
}

// startCandidate starts an "elect" worker with value on key under prefix
// of the server at addr, its actions going to store; t.Cleanup kills it.
func startCandidate(t *testing.T, addr, prefix, key, value string, store *fencedActs) *candidate {
	t.Helper()
	p := disttest.Start(t, disttest.Worker{Role: "elect", Server: addr, Prefix: prefix, Key: key, TTL: testTTL}, "REDISLOCK_TEST_VALUE="+value)
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
	// Before disttest's own cleanup, which then finds the worker gone and
	// its exit put back by Collect.
	t.Cleanup(func() {
		_ = p.Signal(syscall.SIGCONT)
		_ = p.Signal(syscall.SIGKILL)
		<-exited
	})
	return c
}

// send writes a command to the candidate.
func (c *candidate) send(t *testing.T, cmd string) {
	t.Helper()
	c.p.Send(t, cmd)
}

// expect returns the candidate's next event, failing t unless it starts
// with prefix within d.
func (c *candidate) expect(t *testing.T, prefix string, d time.Duration) string {
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
func (c *candidate) expectAll(t *testing.T, d time.Duration, prefixes ...string) {
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

// leads campaigns and returns the term's token once the candidate leads.
func (c *candidate) leads(t *testing.T, d time.Duration) uint64 {
	t.Helper()
	f := strings.Fields(c.expect(t, "leader ", d))
	tok, _ := strconv.ParseUint(f[1], 10, 64)
	return tok
}

// awaitCalls polls l's listing of key until it has n calls.
func awaitCalls(t *testing.T, l *redislock.Locker, key string, n int) []keylock.CallInfo {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		calls, err := l.Calls(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if len(calls) == n {
			return calls
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls on %q, want %d: %+v", len(calls), key, n, calls)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// awaitActs waits until the store has n actions of the term with token.
func awaitActs(t *testing.T, store *fencedActs, token uint64, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for store.count(token) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d actions of term %d, want %d", store.count(token), token, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestHoldersAcrossProcesses: a Locker lists a key's calls in grant order
// across processes: the holder in a worker process with its flow's label,
// its host and pid and its Locker's name, its token and age; then this
// process's waiter with its label and no token. Once the worker is
// killed, its call leaves the listing after its session expires.
func TestHoldersAcrossProcesses(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.NewClient(t)
	const prefix = "holders"
	p := startWorker(t, "labelled-hold", srv.Addr(), prefix, "k", "REDISLOCK_TEST_LABEL=req-42")
	f := strings.Fields(p.Line(t, 30*time.Second))
	if len(f) != 2 || f[0] != "held" {
		t.Fatalf("worker: %q", f)
	}
	token, _ := strconv.ParseUint(f[1], 10, 64)
	l := newLocker(t, c, prefix, redislock.WithName("lister"))
	ctx := context.Background()
	granted := lockAsync(t, owner.NewLabeledContext(ctx, "req-43"), l, "k")
	calls := awaitCalls(t, l, "k", 2)
	host, _ := os.Hostname()
	holder, waiter := calls[0], calls[1]
	if holder.Label != "req-42" || holder.Process != (keylock.Process{Host: host, PID: p.Pid(), Locker: "redislock-1"}) ||
		holder.Mode != keylock.ModeExclusive || !holder.Held || holder.Token != token || holder.Age <= 0 || holder.Age > time.Minute {
		t.Errorf("the holder: %+v; want req-42 in pid %d, token %d", holder, p.Pid(), token)
	}
	if waiter.Label != "req-43" || waiter.Process != keylock.LocalProcess("lister") || waiter.Held || waiter.Token != 0 || waiter.Mode != keylock.ModeExclusive {
		t.Errorf("the waiter: %+v", waiter)
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	g := awaitGrant(t, granted, testTTL+10*time.Second, "the waiter was not granted after the holder was killed")
	calls = awaitCalls(t, l, "k", 1)
	if calls[0].Label != "req-43" || !calls[0].Held || calls[0].Token != g.Token() {
		t.Errorf("after the kill: %+v", calls)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if calls := awaitCalls(t, l, "k", 0); calls != nil {
		t.Fatalf("a free key lists %+v", calls)
	}
	// Labels go with their entries: nothing of the key is left.
	if n, err := c.Exists(ctx, strings.TrimSuffix(redislock.QueueKey(prefix, "k"), "q")+"l").Result(); err != nil || n != 0 {
		t.Fatalf("the label hash: %d, %v; want gone", n, err)
	}
}

// TestHoldersModesAndUnits: shared holds, a queued Wait and a
// Semaphore's units are listed with their modes and units.
func TestHoldersModesAndUnits(t *testing.T) {
	c := redistest.Start(t)
	l := newLocker(t, c, "modes")
	ctx := context.Background()
	r1, err := l.RLock(owner.NewContext(ctx), "k")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.RLock(owner.NewContext(ctx), "k")
	if err != nil {
		t.Fatal(err)
	}
	w := lockAsync(t, owner.NewContext(ctx), l, "k")
	awaitCalls(t, l, "k", 3)
	waited := make(chan error, 1)
	go func() { waited <- l.Wait(owner.NewContext(ctx), "k") }()
	calls := awaitCalls(t, l, "k", 4)
	var modes []string
	for _, c := range calls {
		modes = append(modes, fmt.Sprint(c.Mode, " ", c.Held))
	}
	if got := strings.Join(modes, ", "); got != "shared true, shared true, exclusive false, wait false" {
		t.Errorf("modes: %s", got)
	}
	if calls[0].Token != r1.Token() || calls[1].Token != r2.Token() {
		t.Errorf("tokens %d %d, want %d %d", calls[0].Token, calls[1].Token, r1.Token(), r2.Token())
	}
	r1.Unlock(ctx)
	r2.Unlock(ctx)
	g := awaitGrant(t, w, 10*time.Second, "the writer")
	g.Unlock(ctx)
	if err := recvWithin(t, waited, 10*time.Second, "the Wait"); err != nil {
		t.Fatal(err)
	}

	s, err := redislock.NewSemaphore(c, "units", 5, redislock.WithTTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	a, err := s.Acquire(ctx, "k", 3)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Unlock(ctx)
	calls, err = s.Calls(ctx, "k")
	if err != nil || len(calls) != 1 || calls[0].Mode != keylock.ModeUnits || calls[0].Units != 3 || calls[0].Token != a.Token() {
		t.Fatalf("a Semaphore's listing: %+v, %v", calls, err)
	}
}

// TestDebugNamesHolderInOtherProcess: the debug dump of a Locker whose
// call waits on a key held in a worker process names that holder: its
// label, host:pid and Locker, its token; the JSON form carries the same.
func TestDebugNamesHolderInOtherProcess(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.NewClient(t)
	const prefix = "debug-ahead"
	p := startWorker(t, "labelled-hold", srv.Addr(), prefix, "k", "REDISLOCK_TEST_LABEL=req-42")
	f := strings.Fields(p.Line(t, 30*time.Second))
	token, _ := strconv.ParseUint(f[1], 10, 64)
	l := newLocker(t, c, prefix, redislock.WithDebug(), redislock.WithName("waiting-locker"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := l.Lock(owner.NewLabeledContext(ctx, "req-43"), "k")
		done <- err
	}()
	awaitQueue(t, c, prefix, "k", 2, 10*time.Second)
	var b strings.Builder
	if err := debug.Dump(&b); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	want := fmt.Sprintf(`ahead 1: holder in %s:%d "redislock-1" "req-42" exclusive token %d, queued `, host, p.Pid(), token)
	if !strings.Contains(b.String(), want) {
		t.Errorf("the dump does not name the holder in the other process (%s):\n%s", want, b.String())
	}
	st := registry.Snapshot("waiting-locker", 0)
	if len(st) != 1 || len(st[0].Held) != 1 || len(st[0].Held[0].Ahead) != 1 {
		t.Fatalf("snapshot: %+v", st)
	}
	a := st[0].Held[0].Ahead[0]
	if a.Label != "req-42" || a.PID != p.Pid() || a.Host != host || !a.Held || a.Token != token || st[0].Held[0].Waiters[0].Label != "req-43" {
		t.Errorf("ahead: %+v", st[0].Held[0])
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiter: %v", err)
	}
}

// TestElectPausedLeaderNeverActsAfterDeadline: the leader process is
// stopped (SIGSTOP) past its TTL while acting every 5 ms, and the next
// candidate, in another process, takes over and acts; resumed (SIGCONT),
// the old leader says its term ended and acts no more: the fenced store
// in this process never sees an action of the old term after one of the
// new. A process that does not campaign reads each leader's value,
// token and pid.
func TestElectPausedLeaderNeverActsAfterDeadline(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.NewClient(t)
	const prefix = "elect-pause"
	store := &fencedActs{}
	observer := elect.New(newLocker(t, c, prefix), "leader")
	ctx := context.Background()
	a := startCandidate(t, srv.Addr(), prefix, "leader", "a", store)
	a.send(t, "campaign")
	ta := a.leads(t, 30*time.Second)
	awaitActs(t, store, ta, 3)
	b := startCandidate(t, srv.Addr(), prefix, "leader", "b", store)
	b.send(t, "campaign")
	awaitQueue(t, c, prefix, "leader", 2, 30*time.Second)
	if got, err := observer.Leader(ctx); err != nil || got.Value != "a" || got.Token != ta || got.Process.PID != a.p.Pid() {
		t.Fatalf("the leader read from a non-candidate: %+v, %v; want a, token %d, pid %d", got, err, ta, a.p.Pid())
	}
	if err := a.p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	tb := b.leads(t, testTTL+10*time.Second)
	t.Logf("b leads %v after a was stopped (TTL %v)", time.Since(stopped), testTTL)
	if tb <= ta {
		t.Fatalf("token %d after %d", tb, ta)
	}
	awaitActs(t, store, tb, 3)
	if got, err := observer.Leader(ctx); err != nil || got.Value != "b" || got.Token != tb || got.Process.PID != b.p.Pid() {
		t.Fatalf("the leader read from a non-candidate: %+v, %v; want b, token %d", got, err, tb)
	}
	before := store.count(ta)
	if err := a.p.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	a.expect(t, "ended lost", 30*time.Second)
	a.send(t, "sync")
	a.expect(t, "synced", 10*time.Second)
	if after := store.count(ta); after != before {
		t.Errorf("the resumed leader acted %d times after its deadline", after-before)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if len(store.violations) > 0 {
		t.Errorf("the fenced store saw old terms act after newer ones: %q", store.violations)
	}
}

// TestElectKilledLeaderReplaced: the leader process is killed; the next
// candidate leads within the TTL plus the re-read period (TTL/3) plus a
// margin for a loaded machine, the bound docs/election.md gives.
func TestElectKilledLeaderReplaced(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.NewClient(t)
	const prefix = "elect-kill"
	store := &fencedActs{}
	a := startCandidate(t, srv.Addr(), prefix, "leader", "a", store)
	a.send(t, "campaign")
	ta := a.leads(t, 30*time.Second)
	b := startCandidate(t, srv.Addr(), prefix, "leader", "b", store)
	b.send(t, "campaign")
	awaitQueue(t, c, prefix, "leader", 2, 30*time.Second)
	killed := time.Now()
	if err := a.p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	tb := b.leads(t, testTTL+10*time.Second)
	took := time.Since(killed)
	bound := testTTL + testTTL/3 + 2*time.Second
	t.Logf("b leads %v after a was killed (TTL %v)", took, testTTL)
	if took > bound || tb <= ta {
		t.Errorf("b leads %v after the kill (bound %v), token %d after %d", took, bound, tb, ta)
	}
}

// TestElectResignAndObserve: a process that does not campaign observes
// the election while candidates in worker processes lead, resign with a
// candidate queued (who leads at once, pushed, well within the re-read
// period), resign with none (a vacancy), and campaign again; its stream
// shows every one of those states, in order.
func TestElectResignAndObserve(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.NewClient(t)
	const prefix = "elect-observe"
	store := &fencedActs{}
	observer := elect.New(newLocker(t, c, prefix), "leader", elect.WithInterval(20*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := observer.Observe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	next := func(value string, token uint64, pid int) {
		t.Helper()
		got := recvWithin(t, stream, 30*time.Second, "the next change")
		if got.Value != value || got.Token != token || (pid != 0 && got.Process.PID != pid) {
			t.Fatalf("Observe: %+v; want %q token %d pid %d", got, value, token, pid)
		}
	}
	next("", 0, 0)
	a := startCandidate(t, srv.Addr(), prefix, "leader", "a", store)
	a.send(t, "campaign")
	ta := a.leads(t, 30*time.Second)
	next("a", ta, a.p.Pid())
	b := startCandidate(t, srv.Addr(), prefix, "leader", "b", store)
	b.send(t, "campaign")
	awaitQueue(t, c, prefix, "leader", 2, 30*time.Second)
	resigned := time.Now()
	a.send(t, "resign")
	tb := b.leads(t, 30*time.Second)
	took := time.Since(resigned)
	t.Logf("b leads %v after a was told to resign", took)
	if took > testTTL/3 {
		t.Errorf("the hand-over took %v: not pushed (the re-read period is %v)", took, testTTL/3)
	}
	a.expectAll(t, 10*time.Second, "ended resigned", "resigned <nil>")
	next("b", tb, b.p.Pid())
	b.send(t, "resign")
	b.expectAll(t, 10*time.Second, "ended resigned", "resigned <nil>")
	next("", 0, 0)
	a.send(t, "campaign")
	ta2 := a.leads(t, 30*time.Second)
	next("a", ta2, a.p.Pid())
	if ta2 <= tb || tb <= ta {
		t.Errorf("tokens %d, %d, %d: not growing", ta, tb, ta2)
	}
	store.mu.Lock()
	defer store.mu.Unlock()
	if len(store.violations) > 0 {
		t.Errorf("the fenced store saw old terms act after newer ones: %q", store.violations)
	}
}

// startWorker starts a worker of role on key under prefix of the server
// at addr, with env added to its environment.
func startWorker(t *testing.T, role, addr, prefix, key string, env ...string) *disttest.Proc {
	t.Helper()
	return disttest.Start(t, disttest.Worker{Role: role, Server: addr, Prefix: prefix, Key: key, TTL: testTTL}, env...)
}
