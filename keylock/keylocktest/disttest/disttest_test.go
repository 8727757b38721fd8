package disttest_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	"github.com/fairlock/fairlock/owner"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if w, ok := disttest.IsWorker(); ok {
		os.Exit(runWorker(w))
	}
	goleak.VerifyTestMain(m)
}

// runWorker runs this package's workers: the shared roles on a toy
// Locker of this process alone, and "echo", which says back every cue
// until the cue "quit".
func runWorker(w disttest.Worker) int {
	l := &toyLocker{ttl: w.TTL, broken: w.Args["broken"] != ""}
	return w.Run(disttest.Tools{Locker: l, Store: &toyStore{}}, func(context.Context) error {
		if w.Role != "echo" {
			return nil
		}
		for {
			line, err := w.Cue()
			if err != nil || line == "quit" {
				return err
			}
			w.Say("echo", line)
		}
	})
}

// toyLocker grants every Lock at once with a toyLease: a grant that the
// process's timers lose when its TTL has passed, as the backends' kit
// does when no renewal came, and whose Deadline is that instant; broken,
// its Deadline is zero, as if the grant could not be lost.
type toyLocker struct {
	ttl    time.Duration
	broken bool
}

func (l *toyLocker) Lock(_ context.Context, key string) (keylock.Lease, error) {
	g := &toyLease{key: key, lost: make(chan struct{}), deadline: time.Now().Add(l.ttl), broken: l.broken}
	g.timer = time.AfterFunc(l.ttl, func() { close(g.lost) })
	return g, nil
}
func (l *toyLocker) TryLock(ctx context.Context, key string) (keylock.Lease, error) {
	return l.Lock(ctx, key)
}
func (l *toyLocker) Wait(context.Context, string) error { return nil }
func (l *toyLocker) Close(context.Context) error        { return nil }

type toyLease struct {
	key      string
	lost     chan struct{}
	deadline time.Time
	broken   bool
	timer    *time.Timer
}

func (g *toyLease) Unlock(context.Context) error { g.timer.Stop(); return nil }
func (g *toyLease) Key() string                  { return g.key }
func (g *toyLease) Token() uint64                { return 1 }
func (g *toyLease) Lost() <-chan struct{}        { return g.lost }
func (g *toyLease) HandOff(owner.ID) bool        { return false }
func (g *toyLease) Deadline() time.Time {
	if g.broken {
		return time.Time{}
	}
	return g.deadline
}

// toyStore is a fenced store of one process that refuses every write.
type toyStore struct {
	mu sync.Mutex
	n  map[string]int64
}

func (s *toyStore) Append(context.Context, string, uint64, string) (bool, error) { return false, nil }
func (s *toyStore) Log(context.Context, string) ([]string, error)                { return nil, nil }
func (s *toyStore) Add(_ context.Context, name string, n int64) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil {
		s.n = map[string]int64{}
	}
	s.n[name] += n
	return s.n[name], nil
}

// TestProc: a worker reads its cues and says its lines in order, also
// the cue sent while it was stopped, once resumed; Wait returns the lines
// Line did not; a killed worker's exit is an error.
func TestProc(t *testing.T) {
	p := disttest.Start(t, disttest.Worker{Role: "echo"})
	p.Send(t, "a")
	if l := p.Line(t, 30*time.Second); l != "echo a" {
		t.Fatalf("worker said %q, want echo a", l)
	}
	p.Stop(t)
	p.Send(t, "b")
	p.Cont(t)
	p.Send(t, "c")
	p.Send(t, "quit")
	if lines := p.Wait(t, 30*time.Second); strings.Join(lines, ",") != "echo b,echo c" {
		t.Fatalf("worker said %q, want echo b, echo c", lines)
	}

	q := disttest.Start(t, disttest.Worker{Role: "echo"})
	out := q.Collect(func(string) {})
	q.Kill(t)
	select {
	case o := <-out:
		if o.Err == nil {
			t.Fatal("a killed worker exited with no error")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a killed worker did not exit")
	}
}

// pausedCheck runs the role "paused" on a toy grant of TTL 500 ms (broken
// or not): it stops the worker once it holds, resumes it a second later,
// and returns the worker's first check after resuming.
func pausedCheck(t *testing.T, broken bool) string {
	const ttl = 500 * time.Millisecond
	args := map[string]string{"gap": (ttl / 4).String()}
	if broken {
		args["broken"] = "yes"
	}
	p := disttest.Start(t, disttest.Worker{Role: "paused", Key: "k", TTL: ttl, Args: args})
	if l := p.Line(t, 30*time.Second); l != "held 1" {
		t.Fatalf("worker said %q, want held 1", l)
	}
	p.Stop(t)
	time.Sleep(2 * ttl) // the pause itself: longer than the grant's TTL
	p.Cont(t)
	lines := p.Wait(t, 90*time.Second)
	want := []string{"continued", "lost", "write accepted: false <nil>", "unlock lost: false"}
	if len(lines) != 5 || strings.Join(lines[1:], ",") != strings.Join(want, ",") {
		t.Fatalf("worker said %q, want its check, then %q", lines, want)
	}
	t.Logf("the first check after resuming: %s", lines[0])
	return lines[0]
}

// TestPausedRole: the role "paused" tells its first checks after
// resuming from the rest: on a grant whose Deadline passed during the
// pause they find Valid false, and on a broken one whose Deadline is
// zero they find it true as long as Lost is open (in some run of five:
// the runtime may close Lost first), so the check ProcessPaused fails on a backend
// whose Deadline does not hold.
func TestPausedRole(t *testing.T) {
	if check := pausedCheck(t, false); !strings.HasPrefix(check, "check valid=false ") {
		t.Fatalf("first check after resuming: %q, want valid=false", check)
	}
	for range 5 {
		check := pausedCheck(t, true)
		if strings.HasPrefix(check, "check valid=true lost=false ") {
			return
		}
		if !strings.HasPrefix(check, "check valid=false lost=true ") {
			t.Fatalf("on the broken grant: %q, want valid=true before Lost closed, or Lost closed first", check)
		}
	}
	t.Fatal("on the broken grant, the runtime closed Lost before the first checks in five runs")
}
