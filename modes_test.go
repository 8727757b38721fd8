// End-to-end tests of shared holds, the keyed Semaphore, fencing tokens
// and Wait: docs/guarantees.md, "Modes, order, tokens and Wait".
package fairlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
	"github.com/google/go-cmp/cmp"
)

// flowCall is one call made by its own flow in its own goroutine.
type flowCall struct {
	done <-chan result
	stop context.CancelFunc
}

// startCall runs call with a new flow (and a context the test can cancel)
// in its own goroutine.
func startCall(call func(ctx context.Context) (fairlock.Guard[string], error)) flowCall {
	ctx, cancel := context.WithCancel(owner.NewContext(context.Background()))
	out := make(chan result, 1)
	go func() {
		g, err := call(ctx)
		out <- result{g: g, err: err}
	}()
	return flowCall{out, cancel}
}

// queue starts call and waits until it is queued on key: the key's
// waiters (counted by waiters) reach n.
func queue(t *testing.T, waiters func() int, n int, call func(ctx context.Context) (fairlock.Guard[string], error)) flowCall {
	t.Helper()
	c := startCall(call)
	waitFor(t, "the call is queued", func() bool { return waiters() == n })
	return c
}

// granted receives c's result and fails unless it is a grant.
func granted(t *testing.T, c flowCall, what string) fairlock.Guard[string] {
	t.Helper()
	r := recv(t, c.done)
	if r.err != nil {
		t.Fatalf("%s: %v", what, r.err)
	}
	return r.g
}

func rlock(l *fairlock.Locker[string], key string) func(context.Context) (fairlock.Guard[string], error) {
	return func(ctx context.Context) (fairlock.Guard[string], error) { return l.RLock(ctx, key) }
}

func lock(l *fairlock.Locker[string], key string) func(context.Context) (fairlock.Guard[string], error) {
	return func(ctx context.Context) (fairlock.Guard[string], error) { return l.Lock(ctx, key) }
}

func wait(l *fairlock.Locker[string], key string) func(context.Context) (fairlock.Guard[string], error) {
	return func(ctx context.Context) (fairlock.Guard[string], error) {
		return fairlock.Guard[string]{}, l.Wait(ctx, key)
	}
}

func acquire(s *fairlock.Semaphore[string], key string, w int64) func(context.Context) (fairlock.Guard[string], error) {
	return func(ctx context.Context) (fairlock.Guard[string], error) { return s.Acquire(ctx, key, w) }
}

// newSemaphore builds a Semaphore under c, closed at the end of the test.
func newSemaphore(t testing.TB, c lockerConfig, n int64, extra ...fairlock.Option) (*fairlock.Semaphore[string], *tally) {
	t.Helper()
	o := new(tally)
	s := fairlock.NewSemaphore[string](n, append(c.opts(o), extra...)...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Errorf("Close at the end of the test: %v", err)
		}
	})
	return s, o
}

// TestTaskFairOrder: readers share a key; a writer queued behind them
// waits for all of them; a reader that arrives behind the writer waits
// even while readers hold the key (TryRLock refused); when the writer
// unlocks, the readers directly behind it are granted together, up to the
// next writer; and tokens grow in grant order.
func TestTaskFairOrder(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		l, _ := newLocker[string](t, c)
		ctx := owner.NewContext(context.Background())
		waiters := func() int { return l.Waiters("k") }
		var tokens []uint64
		grant := func(g fairlock.Guard[string]) fairlock.Guard[string] {
			tokens = append(tokens, g.Token())
			return g
		}

		r1 := grant(granted(t, startCall(rlock(l, "k")), "first reader"))
		r2 := grant(granted(t, startCall(rlock(l, "k")), "second reader, beside the first"))
		if _, err := l.TryLock(ctx, "k"); !errors.Is(err, fairlock.ErrWouldBlock) {
			t.Fatalf("TryLock while readers hold: %v, want ErrWouldBlock", err)
		}
		w := queue(t, waiters, 1, lock(l, "k"))
		if _, err := l.TryRLock(ctx, "k"); !errors.Is(err, fairlock.ErrWouldBlock) {
			t.Fatalf("TryRLock behind a queued writer: %v, want ErrWouldBlock", err)
		}
		r3 := queue(t, waiters, 2, rlock(l, "k"))
		r1.Unlock()
		mustNotReceive(t, w.done, "the writer was granted beside a reader")
		r2.Unlock()
		wg := grant(granted(t, w, "the writer, once both readers left"))
		mustNotReceive(t, r3.done, "a reader was granted beside the writer")

		r4 := queue(t, waiters, 2, rlock(l, "k"))
		w2 := queue(t, waiters, 3, lock(l, "k"))
		r5 := queue(t, waiters, 4, rlock(l, "k"))
		wg.Unlock()
		g3 := grant(granted(t, r3, "reader behind the writer"))
		g4 := grant(granted(t, r4, "second reader of the same batch"))
		if n := l.Waiters("k"); n != 2 {
			t.Fatalf("after the batch: %d waiters, want 2 (the writer and the reader behind it)", n)
		}
		mustNotReceive(t, r5.done, "a reader overtook the queued writer")
		g3.Unlock()
		mustNotReceive(t, w2.done, "the writer was granted beside a reader")
		g4.Unlock()
		g := grant(granted(t, w2, "second writer"))
		g.Unlock()
		grant(granted(t, r5, "last reader")).Unlock()
		for i := 1; i < len(tokens); i++ {
			if tokens[i] <= tokens[i-1] {
				t.Fatalf("tokens do not grow in grant order: %v", tokens)
			}
		}
		if l.Len() != 0 {
			t.Fatalf("Len = %d when idle", l.Len())
		}
	})
}

// TestCancellationRerunsGrant: a waiter that leaves the queue wakes those
// behind it that it was blocking (golang/go#63615 in x/sync), a Wait
// too: it holds nothing, but it kept its turn.
func TestCancellationRerunsGrant(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		t.Run("reader behind a cancelled writer", func(t *testing.T) {
			l, _ := newLocker[string](t, c)
			waiters := func() int { return l.Waiters("k") }
			r1 := granted(t, startCall(rlock(l, "k")), "reader")
			w := queue(t, waiters, 1, lock(l, "k"))
			r := queue(t, waiters, 2, rlock(l, "k"))
			w.stop()
			if err := recv(t, w.done).err; !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled writer: %v", err)
			}
			granted(t, r, "the reader behind the cancelled writer").Unlock()
			r1.Unlock()
		})
		t.Run("reader behind a cancelled Wait", func(t *testing.T) {
			l, _ := newLocker[string](t, c)
			waiters := func() int { return l.Waiters("k") }
			r1 := granted(t, startCall(rlock(l, "k")), "reader")
			w := queue(t, waiters, 1, wait(l, "k"))
			r := queue(t, waiters, 2, rlock(l, "k"))
			w.stop()
			if err := recv(t, w.done).err; !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled Wait: %v", err)
			}
			granted(t, r, "the reader behind the cancelled Wait, beside the first").Unlock()
			r1.Unlock()
		})
		t.Run("small request behind a cancelled large one", func(t *testing.T) {
			s, _ := newSemaphore(t, c, 2)
			waiters := func() int { return s.Waiters("k") }
			h := granted(t, startCall(acquire(s, "k", 1)), "holder of 1 unit")
			a := queue(t, waiters, 1, acquire(s, "k", 2))
			b := queue(t, waiters, 2, acquire(s, "k", 1))
			mustNotReceive(t, b.done, "a request overtook the head of the queue")
			a.stop()
			if err := recv(t, a.done).err; !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled request: %v", err)
			}
			granted(t, b, "the 1-unit request behind the cancelled 2-unit one").Unlock()
			h.Unlock()
			if s.Len() != 0 {
				t.Fatalf("Len = %d when idle", s.Len())
			}
		})
	})
}

// TestReentrantInEveryMode: an owner that holds a key in any mode gets
// ErrReentrant at once from every call on it, and nothing is queued.
func TestReentrantInEveryMode(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		l, _ := newLocker[string](t, c)
		ctx := owner.NewContext(context.Background())
		calls := map[string]func() error{
			"Lock":     func() error { _, err := l.Lock(ctx, "k"); return err },
			"TryLock":  func() error { _, err := l.TryLock(ctx, "k"); return err },
			"RLock":    func() error { _, err := l.RLock(ctx, "k"); return err },
			"TryRLock": func() error { _, err := l.TryRLock(ctx, "k"); return err },
			"Wait":     func() error { return l.Wait(ctx, "k") },
		}
		for mode, take := range map[string]func() (fairlock.Guard[string], error){
			"exclusive": func() (fairlock.Guard[string], error) { return l.Lock(ctx, "k") },
			"shared":    func() (fairlock.Guard[string], error) { return l.RLock(ctx, "k") },
		} {
			g, err := take()
			if err != nil {
				t.Fatal(err)
			}
			for name, call := range calls {
				err := call()
				if !errors.Is(err, fairlock.ErrReentrant) || !strings.Contains(err.Error(), name+` "k"`) {
					t.Errorf("%s while holding %s: %v, want ErrReentrant naming %s and the key", name, mode, err, name)
				}
			}
			if n := l.Waiters("k"); n != 0 {
				t.Fatalf("%d waiters queued by reentrant calls", n)
			}
			g.Unlock()
		}

		s, _ := newSemaphore(t, c, 3)
		g, err := s.Acquire(ctx, "k", 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Acquire(ctx, "k", 1); !errors.Is(err, fairlock.ErrReentrant) {
			t.Errorf("Acquire of a key the owner holds units of: %v", err)
		}
		if _, err := s.TryAcquire(ctx, "k", 1); !errors.Is(err, fairlock.ErrReentrant) {
			t.Errorf("TryAcquire of a key the owner holds units of: %v", err)
		}
		other, err := s.Acquire(ctx, "other", 3)
		if err != nil {
			t.Fatalf("Acquire of another key: %v", err)
		}
		other.Unlock()
		g.Unlock()
	})
}

// TestDeadlockSeesSharedHolders: flow A holds k1 shared, flow B holds k2;
// A waits for k2; B's Lock (or Wait) on k1 would close the cycle through
// A's shared hold and is refused. B's RLock of k1 shares A's hold and is
// granted: no wait, no cycle.
func TestDeadlockSeesSharedHolders(t *testing.T) {
	l := fairlock.New[string](fairlock.WithDeadlockDetection(), quiet())
	defer l.Close(context.Background())
	a, b := owner.NewContext(context.Background()), owner.NewContext(context.Background())
	ak1, err := l.RLock(a, "k1")
	if err != nil {
		t.Fatal(err)
	}
	bk2, err := l.Lock(b, "k2")
	if err != nil {
		t.Fatal(err)
	}
	aWaits := make(chan result, 1)
	go func() {
		g, err := l.Lock(a, "k2")
		aWaits <- result{g: g, err: err}
	}()
	waitWaiters(t, l, "k2", 1)
	for name, call := range map[string]func() error{
		"Lock": func() error { _, err := l.Lock(b, "k1"); return err },
		"Wait": func() error { return l.Wait(b, "k1") },
	} {
		err := call()
		var de *fairlock.DeadlockError
		if !errors.Is(err, fairlock.ErrDeadlock) || !errors.As(err, &de) || len(de.Cycle) != 2 {
			t.Fatalf("B's %s of k1, held shared by A who waits for B: %v, want ErrDeadlock with a 2-edge cycle", name, err)
		}
	}
	bk1, err := l.RLock(b, "k1")
	if err != nil {
		t.Fatalf("B's RLock of k1, compatible with A's shared hold: %v", err)
	}
	bk1.Unlock()
	bk2.Unlock()
	r := recv(t, aWaits)
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.g.Unlock()
	ak1.Unlock()
}

// TestSemaphoreDeadlockOnlyWhenCertain: a Semaphore waiter may be served
// by any holder's release, so a wait is refused only when every holder of
// the key waits for the requester.
func TestSemaphoreDeadlockOnlyWhenCertain(t *testing.T) {
	s := fairlock.NewSemaphore[string](2, fairlock.WithDeadlockDetection(), quiet())
	defer s.Close(context.Background())
	ctx := context.Background()
	a, b, c := owner.NewContext(ctx), owner.NewContext(ctx), owner.NewContext(ctx)
	must := func(g fairlock.Guard[string], err error) fairlock.Guard[string] {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}

	bY := must(s.Acquire(b, "y", 2))
	aX := must(s.Acquire(a, "x", 1))
	cX := must(s.Acquire(c, "x", 1))
	aWaits := make(chan result, 1)
	go func() { g, err := s.Acquire(a, "y", 1); aWaits <- result{g: g, err: err} }()
	waitFor(t, "A waits for y", func() bool { return s.Waiters("y") == 1 })
	// x is full (A and C); A waits for B; C is free and may release.
	bWaits := make(chan result, 1)
	go func() { g, err := s.Acquire(b, "x", 1); bWaits <- result{g: g, err: err} }()
	waitFor(t, "B waits for x", func() bool { return s.Waiters("x") == 1 })
	mustNotReceive(t, bWaits, "B refused or granted while C could still release x")
	cX.Unlock()
	r := recv(t, bWaits)
	if r.err != nil {
		t.Fatalf("B once C released a unit of x: %v", r.err)
	}
	r.g.Unlock()
	bY.Unlock()
	aY := recv(t, aWaits)
	if aY.err != nil {
		t.Fatal(aY.err)
	}
	aY.g.Unlock()
	aX.Unlock()

	// A holds all of x2 and waits for y2, all held by B: B asking for x2
	// would wait for A alone, a certain deadlock.
	bY2 := must(s.Acquire(b, "y2", 2))
	aX2 := must(s.Acquire(a, "x2", 2))
	go func() { g, err := s.Acquire(a, "y2", 1); aWaits <- result{g: g, err: err} }()
	waitFor(t, "A waits for y2", func() bool { return s.Waiters("y2") == 1 })
	if _, err := s.Acquire(b, "x2", 1); !errors.Is(err, fairlock.ErrDeadlock) {
		t.Fatalf("B asks for x2, all held by A who waits for B: %v, want ErrDeadlock", err)
	}
	bY2.Unlock()
	r = recv(t, aWaits)
	if r.err != nil {
		t.Fatal(r.err)
	}
	r.g.Unlock()
	aX2.Unlock()
}

// TestTokensGrowPerKey: every grant of a key, in any mode, on the
// lock-free path and under the mutex, after the key went idle and came
// back, gets a token above every earlier grant's; shared holders granted
// together get distinct ones; the zero Guard's is 0.
func TestTokensGrowPerKey(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		l, _ := newLocker[string](t, c, fairlock.WithShards(1))
		s, _ := newSemaphore(t, c, 3, fairlock.WithShards(1))
		ctx := context.Background()
		var last uint64
		check := func(what string, g fairlock.Guard[string], err error) fairlock.Guard[string] {
			t.Helper()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if g.Token() <= last {
				t.Fatalf("%s: token %d, not above the last grant's %d", what, g.Token(), last)
			}
			last = g.Token()
			return g
		}
		if tok := (fairlock.Guard[string]{}).Token(); tok != 0 {
			t.Fatalf("zero Guard's token = %d", tok)
		}
		for round := range 3 { // each round starts from an idle key, fast path first
			g, err := l.Lock(ctx, "k")
			check("Lock on an idle shard", g, err).Unlock()
			g, err = l.RLock(ctx, "k")
			g = check("RLock on an idle shard", g, err)
			r2, err := l.RLock(owner.NewContext(ctx), "k")
			r2 = check("second reader (inflates the first)", r2, err)
			other, err := l.Lock(ctx, "other") // a second key: the shard stays under its mutex
			check("Lock of another key", other, err)
			g.Unlock()
			r2.Unlock()
			g, err = l.TryLock(ctx, "k")
			check("TryLock under the mutex", g, err).Unlock()
			other.Unlock()
			if l.Len() != 0 {
				t.Fatalf("round %d: Len = %d", round, l.Len())
			}
		}
		last = 0
		for range 3 {
			g, err := s.Acquire(ctx, "k", 2)
			g = check("Acquire on an idle shard", g, err)
			g2, err := s.TryAcquire(owner.NewContext(ctx), "k", 1)
			check("TryAcquire beside it", g2, err).Unlock()
			g.Unlock()
		}
	})
}

// TestWaitIsAZeroLengthTurn: Wait on a free key returns at once; behind
// holders it queues like a Lock, with later calls (readers too) queued
// behind it; it returns, holding nothing, when the grants before it are
// released, and the calls behind it go on in the same grant pass.
func TestWaitIsAZeroLengthTurn(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		l, o := newLocker[string](t, c)
		ctx := context.Background()
		waiters := func() int { return l.Waiters("k") }
		if err := l.Wait(ctx, "k"); err != nil {
			t.Fatalf("Wait on a free key: %v", err)
		}
		if l.Len() != 0 || l.Locked("k") {
			t.Fatal("Wait on a free key left the key live")
		}

		r1 := granted(t, startCall(rlock(l, "k")), "reader")
		w := queue(t, waiters, 1, wait(l, "k"))
		if _, err := l.TryRLock(owner.NewContext(ctx), "k"); !errors.Is(err, fairlock.ErrWouldBlock) {
			t.Fatalf("TryRLock behind a queued Wait: %v, want ErrWouldBlock", err)
		}
		r2 := queue(t, waiters, 2, rlock(l, "k"))
		mustNotReceive(t, w.done, "Wait returned while a grant before it was held")
		r1.Unlock()
		if err := recv(t, w.done).err; err != nil {
			t.Fatalf("Wait after the reader left: %v", err)
		}
		g2 := granted(t, r2, "the reader behind the Wait, in the same pass")
		if !l.Locked("k") || l.Waiters("k") != 0 {
			t.Fatal("the Wait holds something or is still queued")
		}

		// Behind a writer: Wait returns when it unlocks, the writer behind
		// the Wait is granted at that instant.
		g2.Unlock()
		w1 := granted(t, startCall(lock(l, "k")), "writer")
		w = queue(t, waiters, 1, wait(l, "k"))
		w2 := queue(t, waiters, 2, lock(l, "k"))
		w1.Unlock()
		if err := recv(t, w.done).err; err != nil {
			t.Fatal(err)
		}
		granted(t, w2, "the writer behind the Wait").Unlock()

		// A Wait whose context ends leaves the queue.
		w1 = granted(t, startCall(lock(l, "k")), "writer")
		w = queue(t, waiters, 1, wait(l, "k"))
		w.stop()
		if err := recv(t, w.done).err; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Wait: %v", err)
		}
		if n := l.Waiters("k"); n != 0 {
			t.Fatalf("%d waiters after the Wait left", n)
		}
		w1.Unlock()
		if l.Len() != 0 {
			t.Fatalf("Len = %d when idle", l.Len())
		}
		// Waits acquire nothing: the observer heard only the grants (and the
		// refused TryRLock).
		checkTally(t, o, map[fairlock.Result]int{fairlock.Acquired: 5, fairlock.WouldBlock: 1}, 5)
	})
}

// TestWaitWaitsForEveryHolder: a Wait by another flow does not pass while
// the key is held, exclusive or shared, even by a grant that took the
// lock-free path (a fresh Locker's first grant, nothing else on its shard).
func TestWaitWaitsForEveryHolder(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		l, _ := newLocker[string](t, c)
		ctx := context.Background()
		for mode, take := range map[string]func(context.Context, string) (fairlock.Guard[string], error){
			"exclusive": l.Lock, "shared": l.RLock,
		} {
			g, err := take(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			tctx, cancel := context.WithTimeout(owner.NewContext(ctx), 10*time.Millisecond)
			err = l.Wait(tctx, "k")
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Wait while the key is held %s: %v, want it to wait and time out", mode, err)
			}
			g.Unlock()
		}
	})
}

// TestDoubleUnlockOfAReader: a second Unlock of a reader's Guard changes
// nothing while other readers hold the key: they keep it, and a writer is
// still refused.
func TestDoubleUnlockOfAReader(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		l, o := newLocker[string](t, c)
		ctx := owner.NewContext(context.Background())
		r1 := granted(t, startCall(rlock(l, "k")), "first reader")
		r2 := granted(t, startCall(rlock(l, "k")), "second reader")
		r1.Unlock()
		r1.Unlock()
		if !l.Locked("k") {
			t.Fatal("a second Unlock of one reader released the other")
		}
		if _, err := l.TryLock(ctx, "k"); !errors.Is(err, fairlock.ErrWouldBlock) {
			t.Fatalf("TryLock while a reader holds: %v, want ErrWouldBlock", err)
		}
		r2.Unlock()
		if l.Locked("k") || l.Len() != 0 {
			t.Fatalf("after both readers left: Locked = %v, Len = %d", l.Locked("k"), l.Len())
		}
		checkTally(t, o, map[fairlock.Result]int{fairlock.Acquired: 2, fairlock.WouldBlock: 1}, 2)
	})
}

// TestKeyIdleAfterTheLastWait: a Wait whose turn comes with nobody
// behind it, as the last holder leaves, leaves the key idle: free, and not
// counted by Len.
func TestKeyIdleAfterTheLastWait(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		l, _ := newLocker[string](t, c)
		waiters := func() int { return l.Waiters("k") }
		g := granted(t, startCall(lock(l, "k")), "writer")
		w := queue(t, waiters, 1, wait(l, "k"))
		g.Unlock()
		if err := recv(t, w.done).err; err != nil {
			t.Fatalf("Wait after the writer left: %v", err)
		}
		if l.Len() != 0 || l.Locked("k") {
			t.Fatalf("after the last Wait's turn: Len = %d, Locked = %v; want 0, false", l.Len(), l.Locked("k"))
		}
	})
}

// TestCloseWakesEveryKindOfWaiter: Close wakes queued Lock, RLock, Wait
// and Acquire calls with ErrClosed, and waits for the holders.
func TestCloseWakesEveryKindOfWaiter(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		l := fairlock.New[string](c.opts(new(tally))...)
		s := fairlock.NewSemaphore[string](2, c.opts(new(tally))...)
		ctx := context.Background()
		lw := func() int { return l.Waiters("k") }
		h := granted(t, startCall(lock(l, "k")), "holder")
		calls := []flowCall{
			queue(t, lw, 1, lock(l, "k")),
			queue(t, lw, 2, rlock(l, "k")),
			queue(t, lw, 3, wait(l, "k")),
		}
		sh := granted(t, startCall(acquire(s, "k", 2)), "semaphore holder")
		calls = append(calls, queue(t, func() int { return s.Waiters("k") }, 1, acquire(s, "k", 1)))

		closed := make(chan error, 2)
		go func() { closed <- l.Close(ctx) }()
		go func() { closed <- s.Close(ctx) }()
		for i, c := range calls {
			if err := recv(t, c.done).err; !errors.Is(err, fairlock.ErrClosed) {
				t.Fatalf("waiter %d: %v, want ErrClosed", i, err)
			}
		}
		mustNotReceive(t, closed, "Close returned while holders held")
		h.Unlock()
		sh.Unlock()
		for range 2 {
			if err := recv(t, closed); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := l.RLock(ctx, "k"); !errors.Is(err, fairlock.ErrClosed) {
			t.Fatalf("RLock after Close: %v", err)
		}
		if err := l.Wait(ctx, "k"); !errors.Is(err, fairlock.ErrClosed) {
			t.Fatalf("Wait after Close: %v", err)
		}
		if _, err := s.Acquire(ctx, "k", 1); !errors.Is(err, fairlock.ErrClosed) {
			t.Fatalf("Acquire after Close: %v", err)
		}
	})
}

// TestSemaphoreHeadOfLine: a request at the head that does not fit blocks
// smaller ones behind it (as in x/sync/semaphore), and a release grants
// the head and every request behind it that fits.
func TestSemaphoreHeadOfLine(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		s, o := newSemaphore(t, c, 3)
		ctx := owner.NewContext(context.Background())
		waiters := func() int { return s.Waiters("k") }
		h := granted(t, startCall(acquire(s, "k", 2)), "holder of 2 of 3")
		a := queue(t, waiters, 1, acquire(s, "k", 2))
		b := queue(t, waiters, 2, acquire(s, "k", 1))
		if _, err := s.TryAcquire(ctx, "k", 1); !errors.Is(err, fairlock.ErrWouldBlock) {
			t.Fatalf("TryAcquire(1) with 1 unit free but a request queued: %v", err)
		}
		mustNotReceive(t, b.done, "a 1-unit request overtook the 2-unit head")
		h.Unlock()
		ga := granted(t, a, "head")
		gb := granted(t, b, "the request behind it, which fits beside it")
		ga.Unlock()
		gb.Unlock()
		if s.Len() != 0 {
			t.Fatalf("Len = %d", s.Len())
		}
		checkTally(t, o, map[fairlock.Result]int{fairlock.Acquired: 3, fairlock.WouldBlock: 1}, 3)
	})
}

// TestInvalidWeight: a request that no grant could satisfy is refused at
// once, naming the key, the weight asked for and the units per key; a
// Semaphore of no units cannot be made.
func TestInvalidWeight(t *testing.T) {
	s := fairlock.NewSemaphore[string](3)
	defer s.Close(context.Background())
	ctx := context.Background()
	for _, w := range []int64{0, -1, 4} {
		_, err := s.Acquire(ctx, "k", w)
		detail := fmt.Sprintf("(asked for %d; the semaphore has 3 units per key)", w)
		if !errors.Is(err, fairlock.ErrInvalidWeight) || !strings.Contains(err.Error(), `Acquire "k"`) || !strings.HasSuffix(err.Error(), detail) {
			t.Errorf("Acquire(%d) of 3 units: %v, want ErrInvalidWeight naming the key and ending %q", w, err, detail)
		}
		if _, err := s.TryAcquire(ctx, "k", w); !errors.Is(err, fairlock.ErrInvalidWeight) || !strings.HasSuffix(err.Error(), detail) {
			t.Errorf("TryAcquire(%d): %v, want ErrInvalidWeight ending %q", w, err, detail)
		}
	}
	if s.Len() != 0 {
		t.Fatalf("Len = %d after refusals", s.Len())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("NewSemaphore(0) did not panic")
		}
	}()
	fairlock.NewSemaphore[string](0)
}

// TestSemaphoreKnotRefused: a Semaphore deadlock in which every holder of
// every awaited key waits, though no single path of holders leads back to
// the requester through each holder (A and B wait for each other's keys
// as well), is refused: graph reduction, not a walk, decides. (A
// depth-first walk that stopped at owners on its current path let T's
// Acquire hang here.)
//
//	A holds K(1), K2(2)  and waits for K1(1)   K1 is full: B 1 + T 1
//	B holds K(1), K1(1)  and waits for K2(1)   K2 is full: A 2
//	T holds K1(1)        and asks for K(1)     K is full: A 1 + B 1
func TestSemaphoreKnotRefused(t *testing.T) {
	s := fairlock.NewSemaphore[string](2, fairlock.WithDeadlockDetection(), quiet())
	defer s.Close(context.Background())
	var held []fairlock.Guard[string]
	defer func() {
		for _, g := range held {
			g.Unlock()
		}
	}()
	ctx := context.Background()
	a, b, tt := owner.NewContext(ctx), owner.NewContext(ctx), owner.NewContext(ctx)
	take := func(ctx context.Context, key string, w int64) {
		t.Helper()
		g, err := s.Acquire(ctx, key, w)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, g)
	}
	take(a, "K", 1)
	take(a, "K2", 2)
	take(b, "K", 1)
	take(b, "K1", 1)
	take(tt, "K1", 1)
	aCtx, aCancel := context.WithCancel(a)
	bCtx, bCancel := context.WithCancel(b)
	aWaits := queue(t, func() int { return s.Waiters("K1") }, 1, func(context.Context) (fairlock.Guard[string], error) { return s.Acquire(aCtx, "K1", 1) })
	bWaits := queue(t, func() int { return s.Waiters("K2") }, 1, func(context.Context) (fairlock.Guard[string], error) { return s.Acquire(bCtx, "K2", 1) })
	tCtx, tCancel := context.WithTimeout(tt, time.Minute) // fail, not hang, if it is missed
	defer tCancel()
	_, err := s.Acquire(tCtx, "K", 1)
	var de *fairlock.DeadlockError
	if !errors.Is(err, fairlock.ErrDeadlock) || !errors.As(err, &de) || de.Cycle[0].Owner != owner.Of(tt) {
		t.Fatalf("T closes a knot no release can undo: %v, want ErrDeadlock starting with T", err)
	}
	if last := de.Cycle[len(de.Cycle)-1]; len(de.Cycle) < 2 || last.Key != "K1" {
		t.Fatalf("the cycle %v does not lead back to T through K1, the key T holds", de.Cycle)
	}
	aCancel()
	bCancel()
	for _, c := range []flowCall{aWaits, bWaits} {
		if err := recv(t, c.done).err; !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	}
}

// TestSemaphoreKnotBehind: a Semaphore lets a wait in while a holder that
// can finish may still give units back; if that holder then releases and
// leaves a knot, a flow that holds nothing and would wait behind it is
// refused (its wait could never end), and the error names the path into
// the knot and the knot's cycle, not a cycle through the refused flow.
//
//	A holds k(1)          and waits for j(1)   j is full: C 2
//	C holds j(2)          and waits for k(2)   k: A 1 (B's unit released)
//	D holds nothing       and asks for k(1)    queued behind C for good
func TestSemaphoreKnotBehind(t *testing.T) {
	s := fairlock.NewSemaphore[string](2, fairlock.WithDeadlockDetection(), fairlock.WithShards(1), quiet())
	defer s.Close(context.Background())
	ctx := context.Background()
	a, b, c, d := owner.NewContext(ctx), owner.NewContext(ctx), owner.NewContext(ctx), owner.NewContext(ctx)
	var held []fairlock.Guard[string]
	defer func() {
		for _, g := range held {
			g.Unlock()
		}
	}()
	take := func(ctx context.Context, key string, w int64) fairlock.Guard[string] {
		t.Helper()
		g, err := s.Acquire(ctx, key, w)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, g)
		return g
	}
	take(a, "k", 1)
	gb := take(b, "k", 1)
	take(c, "j", 2)
	cCtx, cCancel := context.WithCancel(c)
	aCtx, aCancel := context.WithCancel(a)
	cWaits := queue(t, func() int { return s.Waiters("k") }, 1, func(context.Context) (fairlock.Guard[string], error) { return s.Acquire(cCtx, "k", 2) })
	// B can finish and give k back to C, so A's wait is let in.
	aWaits := queue(t, func() int { return s.Waiters("j") }, 1, func(context.Context) (fairlock.Guard[string], error) { return s.Acquire(aCtx, "j", 1) })
	gb.Unlock()

	dCtx, dCancel := context.WithTimeout(d, time.Minute) // fail, not hang, if it is missed
	defer dCancel()
	_, err := s.Acquire(dCtx, "k", 1)
	var de *fairlock.DeadlockError
	if !errors.Is(err, fairlock.ErrDeadlock) || !errors.As(err, &de) {
		t.Fatalf("D would wait behind a knot for good: %v, want ErrDeadlock", err)
	}
	want := []fairlock.WaitEdge{
		{Owner: owner.Of(d), Key: "k"},
		{Owner: owner.Of(a), Key: "j"},
		{Owner: owner.Of(c), Key: "k"},
	}
	if diff := cmp.Diff(want, de.Cycle); diff != "" {
		t.Errorf("Cycle (-want +got):\n%s", diff)
	}
	wantText := fmt.Sprintf(`fairlock: deadlock: %v waits for "k" held by %v, %v waits for "j" held by %v, %v waits for "k" held by %v`,
		owner.Of(d), owner.Of(a), owner.Of(a), owner.Of(c), owner.Of(c), owner.Of(a))
	if got := de.Error(); got != wantText {
		t.Errorf("Error() = %s\nwant      %s", got, wantText)
	}
	cCancel()
	aCancel()
	for _, w := range []flowCall{cWaits, aWaits} {
		if err := recv(t, w.done).err; !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	}
}
