package debug_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/debug"
	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// scene is a debug Locker with one key held by a flow and two waiters
// queued behind it, plus a second held key, and the counters bumped once.
type scene struct {
	l       *fairlock.Locker[string]
	holder  owner.ID // of "hot", a flow
	cold    owner.ID // of "cold", the goroutine that built the scene
	waiters []owner.ID
	release func()
}

func newScene(t *testing.T, name string, opts ...fairlock.Option) *scene {
	t.Helper()
	ctx := context.Background()
	l := fairlock.New[string](append([]fairlock.Option{fairlock.WithName(name), fairlock.WithDebug()}, opts...)...)
	flow := owner.NewContext(ctx)
	s := &scene{l: l}
	s.holder, _ = owner.FromContext(flow)
	hot, err := l.Lock(flow, "hot")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Lock(flow, "hot"); err == nil { // one reentrant attempt
		t.Fatal("reentrant Lock succeeded")
	}
	time.Sleep(2 * time.Millisecond) // so "hot" is held longer than "cold"
	cold, _ := l.Lock(ctx, "cold")
	s.cold = owner.Goroutine()
	stale := cold
	var wg sync.WaitGroup
	for i := range 2 {
		wctx := owner.NewContext(ctx)
		id, _ := owner.FromContext(wctx)
		s.waiters = append(s.waiters, id)
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := l.Lock(wctx, "hot")
			if err == nil {
				g.Unlock()
			}
		}()
		for l.Waiters("hot") != i+1 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	s.release = func() {
		cold.Unlock()
		stale.Unlock() // one double unlock
		hot.Unlock()
		wg.Wait()
		if err := l.Close(ctx); err != nil {
			t.Error(err)
		}
	}
	return s
}

// want is the expected state of a scene, times left out.
func (s *scene) want(name string) debug.LockerState {
	ws := make([]debug.WaiterState, len(s.waiters))
	for i, id := range s.waiters {
		ws[i] = debug.WaiterState{Owner: id.String(), Mode: debug.Exclusive}
	}
	return debug.LockerState{
		Name: name, Kind: "Locker", Keys: 2, Waiters: 2, Reentrant: 1,
		Held: []debug.KeyState{
			{Key: `"hot"`, Mode: debug.Exclusive, Holders: []debug.HolderState{{Owner: s.holder.String()}}, Waiters: ws},
			{Key: `"cold"`, Mode: debug.Exclusive, Holders: []debug.HolderState{{Owner: s.cold.String()}}, Waiters: []debug.WaiterState{}},
		},
	}
}

var ignoreTimes = cmp.Options{
	cmpopts.IgnoreFields(debug.LockerState{}, "Time"),
	cmpopts.IgnoreFields(debug.KeyState{}, "HeldFor"),
	cmpopts.IgnoreFields(debug.HolderState{}, "Since", "For", "Token"),
	cmpopts.IgnoreFields(debug.WaiterState{}, "Since", "For"),
}

func findLocker(t *testing.T, states []debug.LockerState, name string) debug.LockerState {
	t.Helper()
	for _, st := range states {
		if st.Name == name {
			return st
		}
	}
	t.Fatalf("no locker %q in %d states", name, len(states))
	return debug.LockerState{}
}

func TestSnapshot(t *testing.T) {
	s := newScene(t, "snap")
	defer s.release()
	st := findLocker(t, debug.Snapshot(), "snap")
	if diff := cmp.Diff(s.want("snap"), st, ignoreTimes); diff != "" {
		t.Fatalf("Snapshot (-want +got):\n%s", diff)
	}
	hot, cold := st.Held[0], st.Held[1]
	if hot.HeldFor < cold.HeldFor || hot.HeldFor <= 0 {
		t.Errorf("held keys not longest first: hot %v, cold %v", hot.HeldFor, cold.HeldFor)
	}
	if w := hot.Waiters; w[0].For < w[1].For {
		t.Errorf("waiters not in queue order: %v then %v", w[0].For, w[1].For)
	}
	if h := hot.Holders[0]; h.Since.Add(h.For).After(st.Time) || h.For != hot.HeldFor {
		t.Errorf("holder since %v + for %v is after the read's end %v, or not the key's HeldFor %v", h.Since, h.For, st.Time, hot.HeldFor)
	}
}

func TestRegistryNamesAndClose(t *testing.T) {
	a := fairlock.New[int](fairlock.WithName("dup"), fairlock.WithDebug())
	b := fairlock.New[int](fairlock.WithName("dup"), fairlock.WithDebug())
	anon := fairlock.New[int](fairlock.WithDebug())
	names := map[string]bool{}
	for _, st := range debug.Snapshot() {
		names[st.Name] = true
	}
	if !names["dup"] || !names["dup#2"] {
		t.Errorf("duplicate names not suffixed: %v", names)
	}
	found := false
	for n := range names {
		found = found || strings.HasPrefix(n, "fairlock-")
	}
	if !found {
		t.Errorf("unnamed locker has no generated fairlock-N name: %v", names)
	}
	ctx := context.Background()
	for _, l := range []*fairlock.Locker[int]{a, b, anon} {
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range debug.Snapshot() {
		if strings.HasPrefix(st.Name, "dup") {
			t.Errorf("closed locker %q still registered", st.Name)
		}
	}
	plain := fairlock.New[int](fairlock.WithName("no-debug"))
	defer plain.Close(ctx)
	for _, st := range debug.Snapshot() {
		if st.Name == "no-debug" {
			t.Error("a Locker without WithDebug is registered")
		}
	}
}

func TestDumpText(t *testing.T) {
	s := newScene(t, "dump", fairlock.WithLongHeld(time.Millisecond), fairlock.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	defer s.release()
	time.Sleep(3 * time.Millisecond) // past the long-held threshold
	var buf bytes.Buffer
	if err := debug.Dump(&buf); err != nil {
		t.Fatal(err)
	}
	text := buf.String()
	block := text[strings.Index(text, `fairlock "dump"`):]
	lines := strings.Split(block, "\n")
	if !strings.HasSuffix(lines[0], "(Locker): 2 keys, 2 waiters, long-held after 1ms; 0 double unlocks, 1 reentrant") {
		t.Errorf("header line %q: want the counters, and no count of deadlocks refused from a Locker without a detector", lines[0])
	}
	if !strings.HasPrefix(strings.TrimSpace(lines[1]), `"hot" exclusive, held`) || !strings.HasSuffix(lines[1], " LONG") {
		t.Errorf("first key line %q: want the longest-held key first, its mode, LONG", lines[1])
	}
	if want := "holder: " + s.holder.String() + " token "; !strings.Contains(lines[2], want) || !strings.HasSuffix(lines[2], " LONG") {
		t.Errorf("holder line %q lacks %q or LONG", lines[2], want)
	}
	for i, id := range s.waiters {
		if want := fmt.Sprintf("waiter %d: %s exclusive waiting", i+1, id); !strings.Contains(lines[3+i], want) {
			t.Errorf("line %q lacks %q", lines[3+i], want)
		}
	}
	if !strings.HasPrefix(strings.TrimSpace(lines[5]), `"cold" exclusive, held`) {
		t.Errorf("second key line %q", lines[5])
	}
}

// TestDumpDeadlockCount checks that the count of deadlocks refused is
// shown for a locker with a deadlock detector, 0 included, and left out
// for one without: a fairlock Locker built without
// WithDeadlockDetection, or a backend's locker that has no detector (a
// registry.Source that leaves DeadlockDetection false, as redislock's
// does).
func TestDumpDeadlockCount(t *testing.T) {
	detecting := fairlock.New[string](fairlock.WithName("count-detecting"), fairlock.WithDebug(), fairlock.WithDeadlockDetection())
	defer detecting.Close(context.Background())
	plain := fairlock.New[string](fairlock.WithName("count-plain"), fairlock.WithDebug())
	defer plain.Close(context.Background())
	_, unregister := registry.Register("count-backend", stateSource{registry.LockerState{Kind: "redislock.Locker"}})
	defer unregister()

	var buf bytes.Buffer
	if err := debug.Dump(&buf); err != nil {
		t.Fatal(err)
	}
	headers := map[string]string{}
	for _, line := range strings.Split(buf.String(), "\n") {
		if name, _, ok := strings.Cut(strings.TrimPrefix(line, "fairlock "), " ("); ok && strings.HasPrefix(line, `fairlock "count-`) {
			headers[name] = line
		}
	}
	for name, want := range map[string]string{
		`"count-detecting"`: `fairlock "count-detecting" (Locker): 0 keys, 0 waiters; 0 double unlocks, 0 reentrant, 0 deadlocks refused`,
		`"count-plain"`:     `fairlock "count-plain" (Locker): 0 keys, 0 waiters; 0 double unlocks, 0 reentrant`,
		`"count-backend"`:   `fairlock "count-backend" (redislock.Locker): 0 keys, 0 waiters; 0 double unlocks, 0 reentrant`,
	} {
		if got := headers[name]; got != want {
			t.Errorf("header of %s = %q, want %q", name, got, want)
		}
	}
	for _, st := range debug.Snapshot() {
		if strings.HasPrefix(st.Name, "count-") && st.DeadlockDetection != (st.Name == "count-detecting") {
			t.Errorf("%s: DeadlockDetection = %v", st.Name, st.DeadlockDetection)
		}
	}
}

// stateSource is a registry.Source that reports a fixed state, as a
// backend in a module of its own would.
type stateSource struct{ st registry.LockerState }

func (s stateSource) DebugState(int) registry.LockerState { return s.st }

func TestStacks(t *testing.T) {
	s := newScene(t, "stacks", fairlock.WithStacks())
	defer s.release()
	st := findLocker(t, debug.Snapshot(), "stacks")
	if stack := st.Held[0].Holders[0].Stack; len(stack) == 0 || !strings.Contains(stack[0], "newScene") {
		t.Fatalf("holder stack %q does not start at the Lock caller", stack)
	}
	if len(st.Held[0].Waiters[0].Stack) == 0 {
		t.Fatal("waiter stack missing with WithStacks")
	}
	plain := newScene(t, "nostacks")
	defer plain.release()
	if st := findLocker(t, debug.Snapshot(), "nostacks"); st.Held[0].Holders[0].Stack != nil {
		t.Fatal("stack recorded without WithStacks")
	}
}

func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

// TestDumpWhileChurning dumps continuously while goroutines lock, wait,
// cancel and unlock: the race detector checks the debug reads.
func TestDumpWhileChurning(t *testing.T) {
	l := fairlock.New[int](fairlock.WithName("churn"), fairlock.WithStacks(), fairlock.WithLongHeld(time.Millisecond),
		fairlock.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				lctx, cancel := context.WithTimeout(ctx, time.Duration(i%3)*100*time.Microsecond)
				g, err := l.Lock(lctx, (w+i)%4)
				cancel()
				if err == nil {
					g.Unlock()
				}
			}
		}()
	}
	dumps := 0
	for deadline := time.Now().Add(200 * time.Millisecond); time.Now().Before(deadline); dumps++ {
		if err := debug.Dump(io.Discard); err != nil {
			t.Fatal(err)
		}
		_ = debug.Snapshot()
	}
	stop()
	wg.Wait()
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if l.Len() != 0 {
		t.Fatalf("Len = %d after churn", l.Len())
	}
	t.Logf("%d dumps during churn", dumps)
}

// TestSnapshotWhileLockersComeAndGo: a dump may run while debug Lockers are
// being built and closed; under -race this checks that a Locker is complete
// before it is registered and stays readable until it leaves.
func TestSnapshotWhileLockersComeAndGo(t *testing.T) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				_ = debug.Dump(io.Discard)
			}
		}
	}()
	for i := range 200 {
		l := fairlock.New[int](fairlock.WithName(fmt.Sprint("transient-", i%3)), fairlock.WithLongHeld(time.Hour))
		g, _ := l.Lock(context.Background(), i)
		g.Unlock()
		if err := l.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	<-done
}
