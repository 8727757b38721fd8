package disttest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/debug"
	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
)

// Who holds a key, seen from any process: a Locker's listing
// (keylock.Lister) and its debug views name the calls of other
// processes, with their labels, hosts and pids. The scenarios a
// backend's own tests call.

// awaitCalls polls l's listing of key (l must be a keylock.Lister) until
// it has n calls, failing t after 30 s, and returns them.
func awaitCalls(t testing.TB, l keylock.Locker, key string, n int) []keylock.CallInfo {
	t.Helper()
	ls, ok := l.(keylock.Lister)
	if !ok {
		t.Fatalf("disttest: a %T does not list a key's calls (keylock.Lister)", l)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		calls, err := ls.Calls(context.Background(), key)
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

// needNamed fails t unless b has what the scenarios of named Lockers
// need.
func needNamed(t testing.TB, b Backend) {
	t.Helper()
	if b.Named == nil || b.WorkerName == "" {
		t.Fatal("disttest: the Backend lacks Named or WorkerName")
	}
}

// labelledHolder starts a worker of b that holds the key "k" under
// prefix with a flow labelled "req-42", and returns it once it holds,
// with its grant's token.
func labelledHolder(t testing.TB, b Backend, prefix string) (*Proc, uint64) {
	t.Helper()
	p := b.start(t, "hold", prefix, "k", map[string]string{"label": "req-42"})
	return p, heldToken(t, p.Line(t, 30*time.Second))
}

// HoldersAcrossProcesses checks that a Locker lists a key's calls in
// grant order across processes: the holder in a worker process with its
// flow's label, its host and pid and its Locker's name (b.WorkerName),
// its token and age; then this process's waiter (on a Locker of
// b.Named) with its label and no token. Once the worker is killed, its
// call leaves the listing when its grant ends on the engine (within the
// TTL), the waiter is granted and listed alone, and once it unlocks the
// listing is empty. The key is "k" under prefix.
func HoldersAcrossProcesses(t *testing.T, b Backend, prefix string) {
	needNamed(t, b)
	p, token := labelledHolder(t, b, prefix)
	l := b.Named(t, prefix, "lister", false)
	ctx := context.Background()
	granted := lockAsync(owner.NewLabeledContext(ctx, "req-43"), l, "k")
	calls := awaitCalls(t, l, "k", 2)
	host, _ := os.Hostname()
	h, w := calls[0], calls[1]
	if h.Label != "req-42" || h.Process != (keylock.Process{Host: host, PID: p.Pid(), Locker: b.WorkerName}) ||
		h.Mode != keylock.ModeExclusive || !h.Held || h.Token != token || h.Age <= 0 || h.Age > time.Minute {
		t.Errorf("the holder: %+v; want req-42 in pid %d, token %d", h, p.Pid(), token)
	}
	if w.Label != "req-43" || w.Process != keylock.LocalProcess("lister") || w.Held || w.Token != 0 || w.Mode != keylock.ModeExclusive {
		t.Errorf("the waiter: %+v", w)
	}
	p.Kill(t)
	g := awaitGrant(t, granted, b.TTL+10*time.Second, "the waiter was not granted after the holder was killed")
	calls = awaitCalls(t, l, "k", 1)
	if calls[0].Label != "req-43" || !calls[0].Held || calls[0].Token != g.lease.Token() {
		t.Errorf("after the kill: %+v", calls)
	}
	mustUnlock(t, g.lease)
	if calls := awaitCalls(t, l, "k", 0); calls != nil {
		t.Fatalf("a free key lists %+v", calls)
	}
}

// ListedModes checks the modes of a listing: on l, a keylock.RWLocker
// and keylock.Lister whose key "k" nobody else uses, two shared holds,
// an exclusive Lock queued behind them and a Wait queued behind that
// are listed in that order ("shared true, shared true, exclusive false,
// wait false"), the holds with their tokens; once the holds are
// released the Lock is granted, and once it is released the Wait
// returns.
func ListedModes(t *testing.T, l keylock.Locker) {
	rw, ok := l.(keylock.RWLocker)
	if !ok {
		t.Fatalf("disttest: a %T has no shared mode (keylock.RWLocker)", l)
	}
	ctx := context.Background()
	r1, err := rw.RLock(owner.NewContext(ctx), "k")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := rw.RLock(owner.NewContext(ctx), "k")
	if err != nil {
		t.Fatal(err)
	}
	w := lockAsync(owner.NewContext(ctx), l, "k")
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
	mustUnlock(t, r1)
	mustUnlock(t, r2)
	mustUnlock(t, awaitGrant(t, w, 10*time.Second, "the writer").lease)
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the Wait did not return")
	}
}

// DebugNamesHolderInOtherProcess checks that the debug dump of a Locker
// (of b.Named, with WithDebug) whose call waits on a key held in a
// worker process names that holder: its label, host:pid and Locker
// (b.WorkerName), its token; the JSON form (registry.Snapshot) carries
// the same, and the waiter's label. The key is "k" under prefix.
func DebugNamesHolderInOtherProcess(t *testing.T, b Backend, prefix string) {
	needNamed(t, b)
	p, token := labelledHolder(t, b, prefix)
	l := b.Named(t, prefix, "waiting-locker", true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waiter := lockAsync(owner.NewLabeledContext(ctx, "req-43"), l, "k")
	b.AwaitCalls(t, prefix, "k", 2, 10*time.Second)
	var d strings.Builder
	if err := debug.Dump(&d); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	want := fmt.Sprintf(`ahead 1: holder in %s:%d %q "req-42" exclusive token %d, queued `, host, p.Pid(), b.WorkerName, token)
	if !strings.Contains(d.String(), want) {
		t.Errorf("the dump does not name the holder in the other process (%s):\n%s", want, d.String())
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
	select {
	case g := <-waiter:
		if !errors.Is(g.err, context.Canceled) {
			t.Fatalf("the waiter: %v", g.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled waiter: still waiting after 10s")
	}
}
