package flight_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/flight"
)

// await polls cond until it holds, failing t after 10 s: a poll, not an
// ordering; cond decides.
func await(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// recv returns the next value from ch, failing t if none comes within
// 10 s.
func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing within 10 s", what)
	}
	var zero T
	return zero
}

// doAsync calls g.Do on a goroutine and returns the channel its results
// come on.
func doAsync[V any](ctx context.Context, g *flight.Group[string, V], key string, fn func(context.Context) (V, error)) <-chan flight.Result[V] {
	ch := make(chan flight.Result[V], 1)
	go func() {
		v, shared, err := g.Do(ctx, key, fn)
		ch <- flight.Result[V]{Val: v, Err: err, Shared: shared}
	}()
	return ch
}

// TestDoCollapses: concurrent calls for a key share one run, and each
// gets its value with shared true; once the run has returned, the next
// call starts another, alone (shared false). Other keys run apart.
func TestDoCollapses(t *testing.T) {
	var g flight.Group[string, int]
	ctx := context.Background()
	var runs atomic.Int32
	release := make(chan struct{})
	fn := func(context.Context) (int, error) {
		n := runs.Add(1)
		<-release
		return int(n) * 10, nil
	}
	const n = 20
	var results []<-chan flight.Result[int]
	for range n {
		results = append(results, doAsync(ctx, &g, "k", fn))
	}
	await(t, "every call joins the run", func() bool { return flight.Waiting(&g, "k") == n })
	// Another key does not wait for k's run.
	if v, shared, err := g.Do(ctx, "other", func(context.Context) (int, error) { return 7, nil }); v != 7 || shared || err != nil {
		t.Errorf("Do of another key during k's run: (%v, %v, %v), want (7, false, nil)", v, shared, err)
	}
	close(release)
	for i, ch := range results {
		r := recv(t, ch, "a caller's result")
		if r.Val != 10 || r.Err != nil || !r.Shared {
			t.Errorf("caller %d: %+v, want 10, shared, no error", i, r)
		}
	}
	if runs.Load() != 1 {
		t.Errorf("fn ran %d times for %d concurrent calls, want once", runs.Load(), n)
	}
	v, shared, err := g.Do(ctx, "k", fn)
	if v != 20 || shared || err != nil {
		t.Errorf("a call after the run returned: (%v, %v, %v), want a run of its own (20, false, nil)", v, shared, err)
	}
	if flight.Len(&g) != 0 {
		t.Errorf("%d runs left in the Group", flight.Len(&g))
	}
}

type ctxKey struct{}

// TestCallerLeavesEarly: a caller whose context ends returns at once with
// its context's error while fn goes on for the caller that remains; fn's
// context keeps the first caller's values and none of its deadline, and
// ends (cause ErrAbandoned) only when the last caller has left.
func TestCallerLeavesEarly(t *testing.T) {
	var g flight.Group[string, string]
	first, cancelFirst := context.WithTimeout(context.WithValue(context.Background(), ctxKey{}, "first"), time.Hour)
	defer cancelFirst()
	second, cancelSecond := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "second"))
	defer cancelSecond()
	fnCtx := make(chan context.Context, 1)
	ended := make(chan error, 1)
	fn := func(ctx context.Context) (string, error) {
		fnCtx <- ctx
		<-ctx.Done()
		ended <- context.Cause(ctx)
		return "", ctx.Err()
	}
	a := doAsync(first, &g, "k", fn)
	fctx := recv(t, fnCtx, "fn starts")
	b := g.DoChan(second, "k", fn)
	await(t, "the second call joins", func() bool { return flight.Waiting(&g, "k") == 2 })

	if got := fctx.Value(ctxKey{}); got != "first" {
		t.Errorf("fn's context has value %v, want the first caller's", got)
	}
	if d, ok := fctx.Deadline(); ok {
		t.Errorf("fn's context has the deadline %v: a caller's deadline bounds its own wait, not fn", d)
	}

	cancelFirst()
	r := recv(t, a, "the first caller, once its context ended")
	if !errors.Is(r.Err, context.Canceled) || r.Val != "" || r.Shared {
		t.Errorf("the first caller: %+v, want its context's error", r)
	}
	// The first caller has left (its Do returned); one remains.
	if err := fctx.Err(); err != nil {
		t.Fatalf("fn's context ended (%v) while a caller still waits", err)
	}
	if flight.Waiting(&g, "k") != 1 {
		t.Errorf("%d callers waiting, want 1", flight.Waiting(&g, "k"))
	}

	cancelSecond()
	r = recv(t, b, "the second caller, once its context ended")
	if !errors.Is(r.Err, context.Canceled) {
		t.Errorf("the second caller: %+v, want its context's error", r)
	}
	if cause := recv(t, ended, "fn's context ends once no caller is left"); cause != flight.ErrAbandoned {
		t.Errorf("fn's context's cause: %v, want ErrAbandoned", cause)
	}
	if !errors.Is(fctx.Err(), context.Canceled) {
		t.Errorf("fn's context's Err: %v, want context.Canceled", fctx.Err())
	}
}

// TestAbandonedRunLeavesTheGroup: once every caller has left, a new call
// starts a run of its own, even while the abandoned fn has not returned.
func TestAbandonedRunLeavesTheGroup(t *testing.T) {
	var g flight.Group[string, int]
	ctx, cancel := context.WithCancel(context.Background())
	started, release := make(chan struct{}), make(chan struct{})
	old := doAsync(ctx, &g, "k", func(context.Context) (int, error) {
		close(started)
		<-release // ignores its context
		return 1, nil
	})
	<-started
	cancel()
	if r := recv(t, old, "the caller that left"); !errors.Is(r.Err, context.Canceled) {
		t.Errorf("the caller that left: %+v", r)
	}
	v, shared, err := g.Do(context.Background(), "k", func(context.Context) (int, error) { return 2, nil })
	if v != 2 || shared || err != nil {
		t.Errorf("a call after the run was abandoned: (%v, %v, %v), want a run of its own", v, shared, err)
	}
	close(release)
	await(t, "the abandoned run ends", func() bool { return flight.Len(&g) == 0 })
}

// TestContextAlreadyDone: a call whose context is done fails at once with
// its error and cause, and starts nothing.
func TestContextAlreadyDone(t *testing.T) {
	var g flight.Group[string, int]
	cause := errors.New("the request was cancelled")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	fn := func(context.Context) (int, error) {
		t.Error("fn ran for a call whose context was done")
		return 0, nil
	}
	_, _, err := g.Do(ctx, "k", fn)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
		t.Errorf("Do: %v, want context.Canceled wrapping the cause", err)
	}
	r := recv(t, g.DoChan(ctx, "k", fn), "DoChan's result")
	if !errors.Is(r.Err, context.Canceled) || !errors.Is(r.Err, cause) {
		t.Errorf("DoChan: %v, want context.Canceled wrapping the cause", r.Err)
	}
	if flight.Len(&g) != 0 {
		t.Error("a run was started")
	}
}

// panicValue is an error a test's fn panics with.
type panicValue struct{ n int }

func (p *panicValue) Error() string { return fmt.Sprintf("panic value %d", p.n) }

// TestPanicReachesEveryCaller: a panic in fn reaches every caller, of Do
// and of DoChan, as a *PanicError with the value and a stack that shows
// fn; the process goes on (x/sync re-raises DoChan's panic on a
// goroutine of its own, which ends the process).
func TestPanicReachesEveryCaller(t *testing.T) {
	var g flight.Group[string, int]
	ctx := context.Background()
	value := &panicValue{7}
	release := make(chan struct{})
	fn := func(context.Context) (int, error) {
		<-release
		panic(value)
	}
	var results []<-chan flight.Result[int]
	for i := range 6 {
		if i%2 == 0 {
			results = append(results, doAsync(ctx, &g, "k", fn))
		} else {
			results = append(results, g.DoChan(ctx, "k", fn))
		}
	}
	await(t, "every call joins", func() bool { return flight.Waiting(&g, "k") == 6 })
	close(release)
	for i, ch := range results {
		r := recv(t, ch, "a caller's result")
		var pe *flight.PanicError
		if !errors.As(r.Err, &pe) || pe.Value != value || !errors.Is(r.Err, value) {
			t.Errorf("caller %d: %v, want a *PanicError with fn's value", i, r.Err)
			continue
		}
		if !bytes.Contains(pe.Stack, []byte("TestPanicReachesEveryCaller")) {
			t.Errorf("caller %d: the stack does not show fn:\n%s", i, pe.Stack)
		}
	}
	// panic(nil) is a panic too.
	_, _, err := g.Do(ctx, "k", func(context.Context) (int, error) { panic(nil) })
	var pe *flight.PanicError
	var pn *runtime.PanicNilError
	if !errors.As(err, &pe) || !errors.As(err, &pn) {
		t.Errorf("panic(nil): %v, want a *PanicError with a *runtime.PanicNilError", err)
	}
}

// TestGoexitReachesEveryCaller: runtime.Goexit in fn (t.FailNow in a
// test helper, say) reaches every caller as a *PanicError that is
// ErrGoexit, with fn's stack; nobody waits forever, DoChan's callers
// included (x/sync's wait: golang/go#52557).
func TestGoexitReachesEveryCaller(t *testing.T) {
	var g flight.Group[string, int]
	ctx := context.Background()
	release := make(chan struct{})
	fn := func(context.Context) (int, error) {
		<-release
		runtime.Goexit()
		return 1, nil
	}
	a, b := doAsync(ctx, &g, "k", fn), g.DoChan(ctx, "k", fn)
	await(t, "both calls join", func() bool { return flight.Waiting(&g, "k") == 2 })
	close(release)
	for _, ch := range []<-chan flight.Result[int]{a, b} {
		r := recv(t, ch, "a caller's result")
		var pe *flight.PanicError
		if !errors.As(r.Err, &pe) || !errors.Is(r.Err, flight.ErrGoexit) || r.Val != 0 {
			t.Errorf("%+v, want a *PanicError that is ErrGoexit", r)
			continue
		}
		if !bytes.Contains(pe.Stack, []byte("runtime.Goexit")) || !bytes.Contains(pe.Stack, []byte("TestGoexitReachesEveryCaller")) {
			t.Errorf("the stack does not show fn calling Goexit:\n%s", pe.Stack)
		}
	}
	if flight.Len(&g) != 0 {
		t.Error("the run is still in the Group")
	}
}

// TestForget: after Forget, a call starts a run of its own while the
// forgotten run goes on for its callers; the forgotten run, returning,
// does not remove the new one.
func TestForget(t *testing.T) {
	var g flight.Group[string, int]
	ctx := context.Background()
	release := make(chan struct{})
	old := doAsync(ctx, &g, "k", func(context.Context) (int, error) {
		<-release
		return 1, nil
	})
	await(t, "the first run starts", func() bool { return flight.Waiting(&g, "k") == 1 })
	g.Forget("k")
	g.Forget("never") // no run: nothing happens
	release2 := make(chan struct{})
	second := doAsync(ctx, &g, "k", func(context.Context) (int, error) {
		<-release2
		return 2, nil
	})
	await(t, "the second run starts", func() bool { return flight.Waiting(&g, "k") == 1 })
	close(release)
	if r := recv(t, old, "the forgotten run's caller"); r.Val != 1 || r.Err != nil {
		t.Errorf("the forgotten run's caller: %+v, want 1", r)
	}
	// The second run is still the key's: a new call joins it.
	third := doAsync(ctx, &g, "k", func(context.Context) (int, error) { return 3, nil })
	await(t, "a call joins the second run", func() bool { return flight.Waiting(&g, "k") == 2 })
	close(release2)
	for _, ch := range []<-chan flight.Result[int]{second, third} {
		if r := recv(t, ch, "the second run's callers"); r.Val != 2 || !r.Shared {
			t.Errorf("%+v, want 2, shared", r)
		}
	}
}

// TestErrorIsShared: fn's error reaches every caller as it is.
func TestErrorIsShared(t *testing.T) {
	var g flight.Group[int, string]
	errFn := errors.New("fn failed")
	v, shared, err := g.Do(context.Background(), 1, func(context.Context) (string, error) { return "partial", errFn })
	if err != errFn || v != "partial" || shared {
		t.Errorf("Do: (%q, %v, %v), want fn's results as they are", v, shared, err)
	}
}

// TestHammer: many goroutines on a few keys, a third of them leaving at
// a random moment, some runs panicking: every call gets a run's value,
// a *PanicError or its context's error; the Group ends empty and no
// goroutine is left (goleak).
func TestHammer(t *testing.T) {
	var g flight.Group[int, int]
	var wg sync.WaitGroup
	var runs, bad atomic.Int32
	for i := range 400 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 1))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if r.IntN(3) == 0 {
				time.AfterFunc(time.Duration(r.IntN(200))*time.Microsecond, cancel)
			}
			key := r.IntN(4)
			v, _, err := g.Do(ctx, key, func(ctx context.Context) (int, error) {
				n := runs.Add(1)
				select {
				case <-ctx.Done():
				case <-time.After(time.Duration(r.IntN(100)) * time.Microsecond):
				}
				if n%17 == 0 {
					panic(n)
				}
				return key, nil
			})
			var pe *flight.PanicError
			switch {
			case err == nil && v == key:
			case errors.Is(err, context.Canceled), errors.As(err, &pe):
			default:
				bad.Add(1)
				t.Errorf("Do(%d): (%v, %v)", key, v, err)
			}
		}()
	}
	wg.Wait()
	await(t, "every run ends", func() bool { return flight.Len(&g) == 0 })
	t.Logf("%d runs for 400 calls", runs.Load())
}
