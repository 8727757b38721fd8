package disttest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/keylock"
)

// The checks of holders and waiters in other processes: the order of
// their grants, and what happens to the key when one dies or stops.

// processesFIFO: four worker processes queue on one key in a known order
// (each one's call is seen by the engine before the next starts), behind
// a holder in this process, and are granted in that order with strictly
// increasing tokens, as a fenced store logs them; nothing is left queued.
func processesFIFO(t *testing.T, b Backend) {
	const prefix, key, n = "pfifo", "hot", 4
	l := b.New(t, prefix)
	s := b.Store(t, prefix)
	ctx := context.Background()
	g, err := l.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var procs []*Proc
	for i := range n {
		procs = append(procs, b.start(t, "fifo", prefix, key, map[string]string{"id": strconv.Itoa(i)}))
		b.AwaitCalls(t, prefix, key, i+2, 30*time.Second)
	}
	mustUnlock(t, g)
	for i, p := range procs {
		if lines := p.Wait(t, 60*time.Second); len(lines) != 1 || !strings.HasPrefix(lines[0], "granted "+strconv.Itoa(i)+" ") {
			t.Errorf("worker %d said %q, want its grant", i, lines)
		}
	}
	entries, err := s.Log(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("grant log: %q", entries)
	if len(entries) != n {
		t.Fatalf("%d grants logged, want %d", len(entries), n)
	}
	last := g.Token()
	for i, e := range entries {
		id, tok, _ := strings.Cut(e, ":")
		token, _ := strconv.ParseUint(tok, 10, 64)
		if id != strconv.Itoa(i) {
			t.Errorf("grant %d went to worker %s, queued %d-th", i, id, i)
		}
		if token <= last {
			t.Errorf("grant %d: token %d after %d", i, token, last)
		}
		last = token
	}
	b.AwaitCalls(t, prefix, key, 0, 10*time.Second)
}

// heldToken returns the token of a worker's line "held TOKEN", failing t
// on any other line.
func heldToken(t testing.TB, line string) uint64 {
	t.Helper()
	f := strings.Fields(line)
	var tok uint64
	var err error
	if len(f) == 2 && f[0] == "held" {
		tok, err = strconv.ParseUint(f[1], 10, 64)
	}
	if tok == 0 || err != nil {
		t.Fatalf("worker: %q, want held TOKEN", line)
	}
	return tok
}

// processKilled: a holder process killed with SIGKILL stops renewing;
// its grant ends on the engine and the waiter behind it is granted
// within Backend.Expiry of the kill, with a larger token; the next
// holder's fenced write is accepted and one fenced with the dead grant's
// token is refused.
func processKilled(t *testing.T, b Backend) {
	const prefix, key = "kill", "hot"
	p := b.start(t, "hold", prefix, key, nil)
	dead := heldToken(t, p.Line(t, 30*time.Second))
	if b.Held != nil {
		b.Held(t, prefix, key, dead)
	}
	l := b.New(t, prefix)
	granted := lockAsync(context.Background(), l, key)
	b.AwaitCalls(t, prefix, key, 2, 10*time.Second)
	killed := time.Now()
	p.Kill(t)
	gr := awaitGrant(t, granted, b.TTL+10*time.Second, "the waiter was not granted after the holder was killed")
	took := gr.at.Sub(killed)
	t.Logf("granted %v after SIGKILL (TTL %v)", took, b.TTL)
	if took > b.Expiry {
		t.Errorf("granted %v after SIGKILL, more than %v", took, b.Expiry)
	}
	if gr.lease.Token() <= dead {
		t.Errorf("token %d after the dead grant's %d", gr.lease.Token(), dead)
	}
	s := b.Store(t, prefix)
	mustAppend(t, s, key, gr.lease.Token(), "next")
	if ok, err := s.Append(context.Background(), key, dead, "dead"); err != nil || ok {
		t.Fatalf("the dead grant's fenced write: accepted %v, %v; want refused", ok, err)
	}
	mustUnlock(t, gr.lease)
	b.AwaitCalls(t, prefix, key, 0, 10*time.Second)
}

// processPaused: a holder process stopped with SIGSTOP until the waiter
// behind it has been granted (its TTL passed on the engine), and then
// resumed, sees keylock.Valid false in the first check it begins after
// resuming, before its Lost has closed; then it sees Lost close, its
// fenced write is refused (the waiter wrote first), and its Unlock
// returns an error wrapping fairlock.ErrLost. The store holds only the
// waiter's write.
//
// The holder checks Valid in tight loops that keep every P of its
// runtime busy (the role "paused"), so a first check after resuming
// comes before the runtime's timers close Lost in most runs. A run in
// which Lost was already closed when every such check returned proves
// nothing and is repeated, with a fresh key, up to ten runs; the check
// fails if none is conclusive, and at once if a first check after
// resuming finds the grant Valid.
func processPaused(t *testing.T, b Backend) {
	if !canStop {
		t.Skip("disttest: stopping a process needs a Unix system")
	}
	const prefix, runs = "pause", 10
	l := b.New(t, prefix)
	s := b.Store(t, prefix)
	for run := 1; run <= runs; run++ {
		if pausedRun(t, b, l, s, prefix, "hot"+strconv.Itoa(run)) {
			return
		}
	}
	t.Fatalf("in %d runs, the resumed holder's first check never came before Lost closed", runs)
}

// pausedRun is one run of processPaused on key, through l and s on
// prefix: it fails t on a broken promise, and reports whether the run
// was conclusive.
func pausedRun(t *testing.T, b Backend, l keylock.Locker, s Store, prefix, key string) bool {
	t.Helper()
	p := b.start(t, "paused", prefix, key, map[string]string{"gap": (b.TTL / 4).String()})
	heldToken(t, p.Line(t, 30*time.Second))
	granted := lockAsync(context.Background(), l, key)
	b.AwaitCalls(t, prefix, key, 2, 10*time.Second)
	p.Stop(t)
	stopped := time.Now()
	gr := awaitGrant(t, granted, b.TTL+10*time.Second, "the waiter was not granted while the holder was stopped")
	mustAppend(t, s, key, gr.lease.Token(), "waiter")
	p.Cont(t)
	t.Logf("the holder was stopped for %v, until the waiter was granted (TTL %v)", time.Since(stopped), b.TTL)
	lines := p.Wait(t, 90*time.Second)
	mustUnlock(t, gr.lease)
	if len(lines) == 0 {
		t.Fatal("the resumed holder said nothing")
	}
	want := []string{"lost", "write accepted: false <nil>", "unlock lost: true"}
	if len(lines) < 2 || strings.Join(lines[2:], "\n") != strings.Join(want, "\n") {
		t.Errorf("the resumed holder said\n%q\nwant its check, whether it was resumed then, and\n%q", lines, want)
	}
	if log, err := s.Log(context.Background(), key); err != nil || strings.Join(log, " ") != "waiter" {
		t.Errorf("the store's log: %q (%v), want only the waiter's write", log, err)
	}
	check := lines[0]
	t.Logf("the resumed holder's first check: %s", check)
	switch {
	case check == "invalid before the pause":
		t.Log("the grant was not Valid before the pause (a loaded machine): the run proves nothing")
		return false
	case !strings.HasPrefix(check, "check "):
		t.Fatalf("the resumed holder said %q, want its first check", check)
	case len(lines) < 2:
		t.Fatal("the resumed holder did not say whether it saw the SIGCONT")
	case lines[1] == "continued late":
		t.Log("the gap the holder saw was not the test's pause (a loaded machine): the run proves nothing")
		return false
	case lines[1] != "continued":
		t.Fatalf("the resumed holder said %q, want continued", lines[1])
	case !strings.HasPrefix(check, "check valid=false "):
		t.Fatalf("the first check after resuming found the grant Valid, after another process was granted the key: %s", check)
	case strings.HasPrefix(check, "check valid=false lost=true "):
		t.Log("Lost was closed by the time those checks returned: the run proves nothing")
		return false
	}
	return true
}

// deadWaiters: three waiter processes queued in the middle of a key's
// queue are killed, and the holder releases at once, handing the key to
// the first of them. The live waiter behind them is granted within
// Backend.Expiry of the kill: their grants end at about the same time,
// not one TTL after another (redisson/redisson#1353).
func deadWaiters(t *testing.T, b Backend) {
	const prefix, key = "deadwaiters", "hot"
	holder := b.New(t, prefix)
	ctx := context.Background()
	h, err := holder.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var dead []*Proc
	for i := range 3 {
		dead = append(dead, b.start(t, "queue", prefix, key, nil))
		b.AwaitCalls(t, prefix, key, i+2, 30*time.Second)
	}
	granted := lockAsync(ctx, b.New(t, prefix), key)
	b.AwaitCalls(t, prefix, key, 5, 10*time.Second)
	for _, p := range dead {
		p.Kill(t)
	}
	killed := time.Now()
	mustUnlock(t, h)
	gr := awaitGrant(t, granted, 5*b.TTL, "the live waiter was not granted")
	took := gr.at.Sub(killed)
	t.Logf("the live waiter was granted %v after three waiters ahead of it were killed (TTL %v)", took, b.TTL)
	if took > b.Expiry {
		t.Errorf("granted %v after the kill, more than %v", took, b.Expiry)
	}
	mustUnlock(t, gr.lease)
	b.AwaitCalls(t, prefix, key, 0, 10*time.Second)
}
