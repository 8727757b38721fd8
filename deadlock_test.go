package fairlock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/debug"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
	"github.com/google/go-cmp/cmp"
)

func quiet() fairlock.Option {
	return fairlock.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
}

type flow struct {
	ctx context.Context
	id  owner.ID
}

func newFlows(n int) []flow {
	fs := make([]flow, n)
	for i := range fs {
		fs[i].ctx = owner.NewContext(context.Background())
		fs[i].id, _ = owner.FromContext(fs[i].ctx)
	}
	return fs
}

// ring builds an n-party cycle minus its last edge: flow i holds key i and
// waits for key i+1 (for i < n-1). It returns the guards and the channel the
// waiting flows report on.
func ring(t *testing.T, l *fairlock.Locker[string], fs []flow) ([]fairlock.Guard[string], chan result) {
	t.Helper()
	n := len(fs)
	guards := make([]fairlock.Guard[string], n)
	for i := range n {
		g, err := l.Lock(fs[i].ctx, fmt.Sprint("k", i))
		if err != nil {
			t.Fatal(err)
		}
		guards[i] = g
	}
	waits := make(chan result, n)
	for i := range n - 1 {
		go func() {
			g, err := l.Lock(fs[i].ctx, fmt.Sprint("k", i+1))
			waits <- result{i, g, err}
		}()
		waitWaiters(t, l, fmt.Sprint("k", i+1), 1)
	}
	return guards, waits
}

// TestCycleRefusedAtOnce: closing an n-party cycle is refused immediately
// with the cycle in order, nothing else changes, and the refused flow can
// release, let the others finish, and retry successfully.
func TestCycleRefusedAtOnce(t *testing.T) {
	for _, n := range []int{2, 3, 10} {
		t.Run(fmt.Sprintf("%d-party", n), func(t *testing.T) {
			var logs bytes.Buffer
			name := fmt.Sprintf("ring-%d", n)
			l := fairlock.New[string](fairlock.WithName(name), fairlock.WithDeadlockDetection(), fairlock.WithDebug(),
				fairlock.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			defer l.Close(context.Background())
			fs := newFlows(n)
			guards, waits := ring(t, l, fs)

			last := fs[n-1]
			_, err := l.Lock(last.ctx, "k0") // would close the cycle
			if !errors.Is(err, fairlock.ErrDeadlock) {
				t.Fatalf("closing the cycle: %v, want ErrDeadlock", err)
			}
			var de *fairlock.DeadlockError
			if !errors.As(err, &de) {
				t.Fatalf("%v is not a *DeadlockError", err)
			}
			want := []fairlock.WaitEdge{{Owner: last.id, Key: "k0"}}
			for i := range n - 1 {
				want = append(want, fairlock.WaitEdge{Owner: fs[i].id, Key: fmt.Sprint("k", i+1)})
			}
			if diff := cmp.Diff(want, de.Cycle); diff != "" {
				t.Fatalf("cycle (-want +got):\n%s", diff)
			}
			// Logged at warn level with the cycle, and counted for debug.
			if log := logs.String(); !strings.Contains(log, "level=WARN") || !strings.Contains(log, "fairlock: deadlock refused") ||
				!strings.Contains(log, last.id.String()+` waits for \"k0\" held by `+fs[0].id.String()) {
				t.Errorf("refusal log %q lacks the warning or the cycle", log)
			}
			refused := int64(-1)
			for _, st := range debug.Snapshot() {
				if st.Name == name {
					refused = st.DeadlocksRefused
				}
			}
			if refused != 1 {
				t.Errorf("debug DeadlocksRefused = %d, want 1 (-1: locker not in the debug registry)", refused)
			}
			// Nothing else changed: every other flow still waits, no one
			// queued on k0.
			if l.Waiters("k0") != 0 {
				t.Fatal("the refused Lock was queued")
			}
			for i := 1; i < n; i++ {
				if l.Waiters(fmt.Sprint("k", i)) != 1 {
					t.Fatalf("k%d lost its waiter", i)
				}
			}
			// The refused flow releases its key; the chain unwinds from the
			// end, and the refused flow retries successfully.
			guards[n-1].Unlock()
			for i := n - 2; i >= 0; i-- {
				r := recv(t, waits)
				if r.err != nil || r.id != i {
					t.Fatalf("unwinding: flow %d got %v (want flow %d)", r.id, r.err, i)
				}
				r.g.Unlock()
				guards[i].Unlock()
			}
			g, err := l.Lock(last.ctx, "k0")
			if err != nil {
				t.Fatalf("retry after releasing: %v", err)
			}
			g.Unlock()
			if l.Len() != 0 {
				t.Fatalf("Len = %d", l.Len())
			}
		})
	}
}

// TestChainIsNotACycle: A waits for B's key, B waits for C's key; C asks for
// a key nobody holds, and then for another held by D: all wait normally.
func TestChainIsNotACycle(t *testing.T) {
	l := fairlock.New[string](fairlock.WithDeadlockDetection(), quiet())
	defer l.Close(context.Background())
	fs := newFlows(4) // A B C D
	guards, waits := ring(t, l, fs[:3])
	g, err := l.Lock(fs[2].ctx, "free") // C takes a free key
	if err != nil {
		t.Fatal(err)
	}
	d, _ := l.Lock(fs[3].ctx, "d")
	go func() { g, err := l.Lock(fs[2].ctx, "d"); waits <- result{2, g, err} }() // C waits for D: still no cycle
	waitWaiters(t, l, "d", 1)
	d.Unlock()
	r := recv(t, waits)
	if r.err != nil || r.id != 2 {
		t.Fatalf("C waiting for D: %v", r.err)
	}
	r.g.Unlock()
	g.Unlock()
	guards[2].Unlock()
	for range 2 {
		r := recv(t, waits)
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.g.Unlock()
		guards[r.id].Unlock()
	}
	if l.Len() != 0 {
		t.Fatalf("Len = %d", l.Len())
	}
}

// TestCancelledWaitLeavesNoEdge: a wait that timed out must not make a
// later, cycle-free wait look like a deadlock.
func TestCancelledWaitLeavesNoEdge(t *testing.T) {
	l := fairlock.New[string](fairlock.WithDeadlockDetection(), quiet())
	defer l.Close(context.Background())
	fs := newFlows(2)
	a, _ := l.Lock(fs[0].ctx, "k1")
	b, _ := l.Lock(fs[1].ctx, "k2")
	tctx, cancel := context.WithTimeout(fs[0].ctx, 5*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(tctx, "k2"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	done := make(chan result, 1)
	go func() { g, err := l.Lock(fs[1].ctx, "k1"); done <- result{1, g, err} }()
	waitWaiters(t, l, "k1", 1)
	a.Unlock()
	r := recv(t, done)
	if r.err != nil {
		t.Fatalf("B waiting for k1 after A gave up on k2: %v", r.err)
	}
	r.g.Unlock()
	b.Unlock()
}

// TestDeadlockStress: flows lock random key sequences in random order with
// detection on. Every ErrDeadlock is checked against a model of who holds
// and who waits: each edge of the reported cycle must be real when the
// refused flow gets it (its members cannot move while the refused flow
// holds its keys). No Lock may hang: a missed cycle would, and its timeout
// fails the test.
func TestDeadlockStress(t *testing.T) {
	l := fairlock.New[int](fairlock.WithDeadlockDetection(), quiet())
	const flows, keys, rounds = 8, 5, 150
	var (
		mu      sync.Mutex
		holder  = map[int]owner.ID{}
		waiting = map[owner.ID]int{}
	)
	refused := 0
	var wg sync.WaitGroup
	for f := range flows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(f), 7))
			ctx := owner.NewContext(context.Background())
			me, _ := owner.FromContext(ctx)
			for range rounds {
				var held []fairlock.Guard[int]
				for _, k := range rng.Perm(keys)[:1+rng.IntN(3)] {
					mu.Lock()
					waiting[me] = k
					mu.Unlock()
					lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					g, err := l.Lock(lctx, k)
					cancel()
					mu.Lock()
					delete(waiting, me)
					if err == nil {
						holder[k] = me
						mu.Unlock()
						held = append(held, g)
						continue
					}
					var de *fairlock.DeadlockError
					if !errors.As(err, &de) {
						mu.Unlock()
						t.Errorf("flow %v: %v (a hang here is a missed cycle)", me, err)
						return
					}
					refused++
					for i, e := range de.Cycle {
						next := de.Cycle[(i+1)%len(de.Cycle)].Owner
						if i > 0 && waiting[e.Owner] != e.Key.(int) {
							t.Errorf("cycle %v: %v is not waiting for %v", de, e.Owner, e.Key)
						}
						if holder[e.Key.(int)] != next {
							t.Errorf("cycle %v: %v is not held by %v", de, e.Key, next)
						}
					}
					mu.Unlock()
					break
				}
				for i := len(held) - 1; i >= 0; i-- {
					mu.Lock()
					delete(holder, held[i].Key())
					mu.Unlock()
					held[i].Unlock()
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d deadlocks refused over %d rounds", refused, flows*rounds)
	if l.Len() != 0 {
		t.Fatalf("Len = %d", l.Len())
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// ctxHandler is a slog.Handler at a fixed level that keeps each record's
// context value under ctxKey.
type ctxHandler struct {
	level slog.Level
	seen  *[]any
}

type ctxKey struct{}

func (h ctxHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }
func (h ctxHandler) Handle(ctx context.Context, _ slog.Record) error {
	*h.seen = append(*h.seen, ctx.Value(ctxKey{}))
	return nil
}
func (h ctxHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h ctxHandler) WithGroup(string) slog.Handler      { return h }

// TestRefusalLogIsLazyAndCarriesContext: a refused cycle renders no key
// for a logger that drops warnings (rendering may run the user's
// formatter), and a logger that takes them gets the caller's context.
func TestRefusalLogIsLazyAndCarriesContext(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelError, slog.LevelWarn} {
		var seen []any
		formatted := 0
		l := fairlock.New[int](fairlock.WithDeadlockDetection(),
			fairlock.WithLogger(slog.New(ctxHandler{level, &seen})),
			fairlock.WithKeyFormatter(func(k int) string { formatted++; return fmt.Sprint("account-", k) }))
		fs := newFlows(2)
		a, _ := l.Lock(fs[0].ctx, 1)
		b, _ := l.Lock(fs[1].ctx, 2)
		type grant struct {
			g   fairlock.Guard[int]
			err error
		}
		done := make(chan grant, 1)
		go func() { g, err := l.Lock(fs[0].ctx, 2); done <- grant{g, err} }()
		waitWaiters(t, l, 2, 1)
		_, err := l.Lock(context.WithValue(fs[1].ctx, ctxKey{}, "caller"), 1)
		if !errors.Is(err, fairlock.ErrDeadlock) {
			t.Fatalf("closing the cycle: %v", err)
		}
		switch level {
		case slog.LevelError:
			if formatted != 0 || len(seen) != 0 {
				t.Errorf("logger at error level: %d keys formatted, %d records; want none", formatted, len(seen))
			}
		case slog.LevelWarn:
			if diff := cmp.Diff([]any{"caller"}, seen); diff != "" {
				t.Errorf("the record's context value (-want +got):\n%s", diff)
			}
		}
		if !strings.Contains(err.Error(), "account-1") {
			t.Errorf("the error %q does not render the key with the formatter", err)
		}
		b.Unlock()
		r := <-done
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.g.Unlock()
		a.Unlock()
		if err := l.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
