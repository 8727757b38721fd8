// End-to-end tests of the public API: one test per rule in
// docs/guarantees.md.
package fairlock_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/debug"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type result struct {
	id  int
	g   fairlock.Guard[string]
	err error
}

// queueLockers starts n goroutines that Lock key one after another, each
// joining the queue only once the previous one has, and returns the channel
// their results arrive on, tagged with their arrival position.
func queueLockers(t *testing.T, ctx context.Context, l *fairlock.Locker[string], key string, n int) <-chan result {
	t.Helper()
	out := make(chan result, n)
	base := l.Waiters(key)
	for i := range n {
		go func() {
			g, err := l.Lock(ctx, key)
			out <- result{i, g, err}
		}()
		waitWaiters(t, l, key, base+i+1)
	}
	return out
}

func TestMutualExclusionAndFIFOHandOff(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		ctx := context.Background()
		l, o := newLocker[string](t, c)
		first, err := l.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		const n = 20
		results := queueLockers(t, ctx, l, "k", n)
		mustNotReceive(t, results, "a waiter ran while the key was held")

		var order []int
		g := first
		for range n {
			g.Unlock()
			r := recv(t, results)
			if r.err != nil {
				t.Fatalf("waiter %d: %v", r.id, r.err)
			}
			mustNotReceive(t, results, "two holders at once")
			order = append(order, r.id)
			g = r.g
		}
		g.Unlock()
		want := make([]int, n)
		for i := range want {
			want[i] = i
		}
		if diff := cmp.Diff(want, order); diff != "" {
			t.Fatalf("grant order differs from arrival order (-want +got):\n%s", diff)
		}
		if l.Len() != 0 {
			t.Fatalf("Len = %d after all unlocked", l.Len())
		}
		checkTally(t, o, map[fairlock.Result]int{fairlock.Acquired: n + 1}, n+1)
	})
}

// TestNoBarging: a TryLock or Lock arriving right after Unlock, before the
// head waiter has run, must not take the key.
func TestNoBarging(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		ctx := context.Background()
		l, o := newLocker[string](t, c)
		g, _ := l.Lock(ctx, "k")
		results := queueLockers(t, ctx, l, "k", 1)
		g.Unlock()
		// The hand-off happened inside Unlock: the key is held by the waiter
		// now, whether or not its goroutine has run yet.
		if !l.Locked("k") {
			t.Fatal("key free between Unlock and the head waiter running")
		}
		if _, err := l.TryLock(ctx, "k"); !errors.Is(err, fairlock.ErrWouldBlock) {
			t.Fatalf("TryLock right after hand-off = %v, want ErrWouldBlock", err)
		}
		late := queueLockers(t, ctx, l, "k", 1)
		r := recv(t, results)
		if r.err != nil {
			t.Fatal(r.err)
		}
		mustNotReceive(t, late, "the late Lock overtook or joined the holder")
		r.g.Unlock()
		r = recv(t, late)
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.g.Unlock()
		checkTally(t, o, map[fairlock.Result]int{fairlock.Acquired: 3, fairlock.WouldBlock: 1}, 3)
	})
}

func TestTryLockBehindWaiters(t *testing.T) {
	ctx := context.Background()
	l := fairlock.New[string]()
	if _, err := l.TryLock(ctx, "free"); err != nil {
		t.Fatalf("TryLock of a free key: %v", err)
	}
	g, _ := l.Lock(ctx, "k")
	if _, err := l.TryLock(ctx, "k"); !errors.Is(err, fairlock.ErrReentrant) {
		t.Fatalf("TryLock by the holder = %v, want ErrReentrant", err)
	}
	other := owner.NewContext(ctx)
	if _, err := l.TryLock(other, "k"); !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatalf("TryLock of a held key = %v, want ErrWouldBlock", err)
	}
	g.Unlock()
}

func TestDifferentKeysDoNotWait(t *testing.T) {
	ctx := context.Background()
	l := fairlock.New[int](fairlock.WithShards(1)) // even in one shard
	var guards []fairlock.Guard[int]
	for k := range 100 {
		g, err := l.TryLock(ctx, k)
		if err != nil {
			t.Fatalf("key %d: %v", k, err)
		}
		guards = append(guards, g)
	}
	if l.Len() != 100 {
		t.Fatalf("Len = %d, want 100", l.Len())
	}
	for _, g := range guards {
		g.Unlock()
	}
	if l.Len() != 0 {
		t.Fatalf("Len = %d, want 0", l.Len())
	}
}

func TestReentrant(t *testing.T) {
	ctx := context.Background()
	l := fairlock.New[string]()

	t.Run("same goroutine", func(t *testing.T) {
		g, _ := l.Lock(ctx, "k")
		defer g.Unlock()
		_, err := l.Lock(ctx, "k")
		if !errors.Is(err, fairlock.ErrReentrant) {
			t.Fatalf("second Lock = %v, want ErrReentrant", err)
		}
		if l.Waiters("k") != 0 {
			t.Fatal("a reentrant Lock was queued")
		}
	})

	t.Run("same flow on another goroutine", func(t *testing.T) {
		flow := owner.NewContext(ctx)
		g, _ := l.Lock(flow, "k")
		defer g.Unlock()
		errc := make(chan error)
		go func() { _, err := l.Lock(flow, "k"); errc <- err }()
		if err := recv(t, errc); !errors.Is(err, fairlock.ErrReentrant) {
			t.Fatalf("Lock by the same flow elsewhere = %v, want ErrReentrant", err)
		}
	})

	t.Run("another flow on the same goroutine waits", func(t *testing.T) {
		g, _ := l.Lock(owner.NewContext(ctx), "k")
		tctx, cancel := context.WithTimeout(owner.NewContext(ctx), time.Millisecond)
		defer cancel()
		_, err := l.Lock(tctx, "k")
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock by another flow = %v, want it to wait and time out", err)
		}
		g.Unlock()
	})
	if l.Len() != 0 {
		t.Fatalf("Len = %d", l.Len())
	}
}

// TestContextAlreadyDoneFailsOnFreeKey: a done context fails even when the
// key is free (x/sync/semaphore's golang/go#63615).
func TestContextAlreadyDoneFailsOnFreeKey(t *testing.T) {
	l := fairlock.New[string]()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for name, lock := range map[string]func(context.Context, string) (fairlock.Guard[string], error){
		"Lock": l.Lock, "TryLock": l.TryLock,
	} {
		g, err := lock(ctx, "free")
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("%s with a done ctx = %v, want context.Canceled", name, err)
		}
		g.Unlock() // the zero Guard: a no-op
		if l.Locked("free") || l.Len() != 0 {
			t.Fatalf("%s with a done ctx left the key held", name)
		}
	}
}

func TestCancelledWaiterLeavesQueue(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		ctx := context.Background()
		l, o := newLocker[string](t, c)
		g, _ := l.Lock(ctx, "k")
		first := queueLockers(t, ctx, l, "k", 1)
		cctx, cancel := context.WithCancelCause(ctx)
		victim := queueLockers(t, cctx, l, "k", 1)
		last := queueLockers(t, ctx, l, "k", 1)
		cause := errors.New("client went away")
		cancel(cause)
		r := recv(t, victim)
		if !errors.Is(r.err, context.Canceled) || !errors.Is(r.err, cause) {
			t.Fatalf("cancelled waiter got %v, want context.Canceled and its cause", r.err)
		}
		waitWaiters(t, l, "k", 2)
		g.Unlock()
		r = recv(t, first)
		mustNotReceive(t, last, "FIFO broken after a cancellation")
		r.g.Unlock()
		r = recv(t, last)
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.g.Unlock()
		if l.Len() != 0 {
			t.Fatalf("Len = %d after cancellations", l.Len())
		}
		checkTally(t, o, map[fairlock.Result]int{fairlock.Acquired: 3, fairlock.Canceled: 1}, 3)
	})
}

func TestWaitTimeout(t *testing.T) {
	ctx := context.Background()
	l := fairlock.New[string]()
	g, _ := l.Lock(ctx, "k")
	defer g.Unlock()
	tctx, cancel := context.WithTimeout(owner.NewContext(ctx), 5*time.Millisecond)
	defer cancel()
	_, err := l.Lock(tctx, "k")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	var le *fairlock.LockError
	if !errors.As(err, &le) || le.Key != "k" || le.Op != "Lock" {
		t.Fatalf("err = %#v, want a *LockError for Lock of \"k\"", err)
	}
	if l.Waiters("k") != 0 {
		t.Fatal("timed-out waiter still queued")
	}
}

// TestCancelGrantRace races a cancellation against the hand-off to the same
// waiter, many times. Each time the waiter either holds the lock with a nil
// error or holds nothing with an error, and the grant is never lost: the
// next waiter always gets the key. golang.org/x/sync's semaphore lost
// wake-ups on this path (golang/go#37852); this is our regression test for
// the same race, synchronised by polling Waiters, not by sleeping.
func TestCancelGrantRace(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		ctx := context.Background()
		l, o := newLocker[string](t, c)
		granted, refused := 0, 0
		const rounds = 500
		for range rounds {
			g, _ := l.Lock(ctx, "k")
			cctx, cancel := context.WithCancel(ctx)
			racer := queueLockers(t, cctx, l, "k", 1)
			next := queueLockers(t, ctx, l, "k", 1)
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); g.Unlock() }()
			go func() { defer wg.Done(); cancel() }()
			wg.Wait()
			r := recv(t, racer)
			switch {
			case r.err == nil:
				granted++
				if !l.Locked("k") {
					t.Fatal("racer got a nil error but the key is free")
				}
				mustNotReceive(t, next, "next waiter ran while racer holds")
				r.g.Unlock()
			case errors.Is(r.err, context.Canceled):
				refused++
				if r.g != (fairlock.Guard[string]{}) {
					t.Fatal("racer got an error and a non-zero Guard")
				}
			default:
				t.Fatalf("racer: unexpected error %v", r.err)
			}
			n := recv(t, next) // never lost: the grant passes on
			if n.err != nil {
				t.Fatal(n.err)
			}
			n.g.Unlock()
			if l.Len() != 0 {
				t.Fatalf("Len = %d after a round", l.Len())
			}
		}
		t.Logf("racer granted %d times, cancelled %d times", granted, refused)
		// A grant the racer gave back unused is reported as its cancellation,
		// and its release is not reported.
		checkTally(t, o, map[fairlock.Result]int{fairlock.Acquired: 2*rounds + granted, fairlock.Canceled: refused}, 2*rounds+granted)
	})
}

func TestUnlockIsIdempotentAndStaleSafe(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		ctx := context.Background()
		l, o := newLocker[string](t, c)
		g, _ := l.Lock(ctx, "k")
		copied := g
		g.Unlock()
		g.Unlock() // double
		h, err := l.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		copied.Unlock() // a stale copy must not release h's grant
		g.Unlock()
		if !l.Locked("k") {
			t.Fatal("a stale Unlock released a later grant")
		}
		// Any goroutine may unlock.
		done := make(chan struct{})
		go func() { h.Unlock(); close(done) }()
		recv(t, done)
		if l.Locked("k") {
			t.Fatal("Unlock from another goroutine did not release")
		}
		var zero fairlock.Guard[string]
		zero.Unlock()
		if zero.Key() != "" || h.Key() != "k" {
			t.Fatalf("Key() = %q / %q", zero.Key(), h.Key())
		}
		if l.Len() != 0 {
			t.Fatalf("Len = %d", l.Len())
		}
		checkTally(t, o, map[fairlock.Result]int{fairlock.Acquired: 2}, 2) // stale Unlocks report nothing
	})
}

// TestCloseErrorNamesTheLockerSafely: the error of a Close that gave up
// names the Locker quoted, as debug output does, so a name cannot forge a
// log line.
func TestCloseErrorNamesTheLockerSafely(t *testing.T) {
	l := fairlock.New[string](fairlock.WithName("orders\nfake: line"))
	g, err := l.Lock(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	err = l.Close(short)
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), `Close of "orders\nfake: line": 1 key still held`) {
		t.Fatalf("Close = %q, want the name escaped and 1 key still held", err)
	}
	g.Unlock()
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestClose(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		ctx := context.Background()
		l, o := newLocker[string](t, c)
		g, _ := l.Lock(ctx, "k")
		waiters := queueLockers(t, ctx, l, "k", 3)

		// Close waits for the holder: with a short ctx it reports the held key.
		short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer cancel()
		err := l.Close(short)
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "1 key still held") {
			t.Fatalf("Close while held = %v, want DeadlineExceeded naming 1 held key", err)
		}
		for range 3 {
			if r := recv(t, waiters); !errors.Is(r.err, fairlock.ErrClosed) {
				t.Fatalf("queued waiter got %v, want ErrClosed", r.err)
			}
		}
		if _, err := l.Lock(ctx, "other"); !errors.Is(err, fairlock.ErrClosed) {
			t.Fatalf("Lock after Close = %v", err)
		}
		if _, err := l.TryLock(ctx, "other"); !errors.Is(err, fairlock.ErrClosed) {
			t.Fatalf("TryLock after Close = %v", err)
		}
		if _, err := l.Lock(owner.NewContext(ctx), "k"); !errors.Is(err, fairlock.ErrClosed) {
			t.Fatalf("Lock of a held key after Close = %v", err)
		}
		closed := make(chan error, 1)
		go func() { closed <- l.Close(ctx) }() // a second Close waits too
		mustNotReceive(t, closed, "Close returned while a key was held")
		g.Unlock()
		if err := recv(t, closed); err != nil {
			t.Fatalf("Close after the last Unlock = %v", err)
		}
		if err := l.Close(ctx); err != nil {
			t.Fatalf("third Close = %v", err)
		}
		if l.Len() != 0 {
			t.Fatalf("Len = %d after Close", l.Len())
		}
		checkTally(t, o, map[fairlock.Result]int{fairlock.Acquired: 1, fairlock.Closed: 6}, 1)
	})
}

// TestCloseWakesWaitersOfEveryKey: Close wakes the waiters of every key
// with ErrClosed, also when one shard has more live keys than it keeps
// inline (the rest spill into its map).
func TestCloseWakesWaitersOfEveryKey(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		ctx := context.Background()
		l, o := newLocker[int](t, c, fairlock.WithShards(1))
		const n = 20 // keys on the one shard, more than its inline slots
		var held []fairlock.Guard[int]
		for k := range n {
			g, err := l.Lock(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, g)
		}
		waits := make(chan error, n)
		for k := range n {
			go func() { _, err := l.Lock(owner.NewContext(ctx), k); waits <- err }()
			waitWaiters(t, l, k, 1)
		}
		closed := make(chan error, 1)
		go func() { closed <- l.Close(ctx) }()
		for range n {
			if err := recv(t, waits); !errors.Is(err, fairlock.ErrClosed) {
				t.Fatalf("queued waiter got %v, want ErrClosed", err)
			}
		}
		for _, g := range held {
			g.Unlock()
		}
		if err := recv(t, closed); err != nil {
			t.Fatalf("Close after the last Unlock = %v", err)
		}
		checkTally(t, o, map[fairlock.Result]int{fairlock.Acquired: n, fairlock.Closed: n}, n)
	})
}

// TestCloseStaysVisibleUntilDrained: a Close that gives up on a holder
// leaves the Locker in debug output and its observer registered, so the
// stuck holder can be seen; the last Unlock then releases both, after the
// observer heard that Unlock.
func TestCloseStaysVisibleUntilDrained(t *testing.T) {
	ctx := context.Background()
	o := new(tally)
	l := fairlock.New[string](fairlock.WithName("closing-with-a-holder"), fairlock.WithDebug(), fairlock.WithObserver(o))
	listed := func() bool {
		for _, st := range debug.Snapshot() {
			if st.Name == "closing-with-a-holder" {
				return true
			}
		}
		return false
	}
	g, _ := l.Lock(ctx, "stuck")
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := l.Close(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a holder: %v", err)
	}
	o.mu.Lock()
	unregistered := o.unregistered
	o.mu.Unlock()
	if !listed() || unregistered != 0 {
		t.Fatalf("after a Close that gave up: listed in debug %v, observer unregistered %d times; want listed, 0", listed(), unregistered)
	}
	g.Unlock()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		o.mu.Lock()
		unregistered, releases := o.unregistered, o.releases
		o.mu.Unlock()
		if unregistered == 1 && !listed() {
			if releases != 1 {
				t.Fatalf("the observer heard %d releases before Unregister, want 1", releases)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the last Unlock: listed in debug %v, observer unregistered %d times", listed(), unregistered)
		}
	}
	if err := l.Close(ctx); err != nil {
		t.Fatalf("Close after the last Unlock: %v", err)
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.unregistered != 1 {
		t.Fatalf("observer unregistered %d times after a second Close, want once", o.unregistered)
	}
}

// slowObserver records, after a pause, whether each report came after
// Unregister: a recorder slower than Close must still hear every Release
// first.
type slowObserver struct {
	mu           sync.Mutex
	unregistered bool
	late         []string
}

func (o *slowObserver) Register(string, func() fairlock.Stats) fairlock.LockerObserver { return o }
func (o *slowObserver) Acquire(fairlock.Result, time.Duration)                         {}
func (o *slowObserver) Release(time.Duration) {
	time.Sleep(2 * time.Millisecond)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.unregistered {
		o.late = append(o.late, "Release")
	}
}
func (o *slowObserver) Unregister() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.unregistered = true
}
func (o *slowObserver) state() (unregistered bool, late []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.unregistered, o.late
}

// TestObserverHearsEveryReleaseBeforeUnregister: the last Unlock's Release
// reaches the observer before Unregister, whether Close is still waiting
// for it or gave up before it.
func TestObserverHearsEveryReleaseBeforeUnregister(t *testing.T) {
	for _, gaveUp := range []bool{false, true} {
		o := &slowObserver{}
		l := fairlock.New[int](fairlock.WithObserver(o))
		ctx := context.Background()
		g, _ := l.Lock(ctx, 1)
		closed := make(chan error, 1)
		if gaveUp {
			short, cancel := context.WithTimeout(ctx, time.Millisecond)
			if err := l.Close(short); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Close with a holder: %v", err)
			}
			cancel()
		} else {
			go func() { closed <- l.Close(ctx) }()
			for { // until Close has begun
				g2, err := l.TryLock(ctx, 2)
				if err != nil {
					break
				}
				g2.Unlock()
			}
		}
		g.Unlock()
		if !gaveUp {
			if err := <-closed; err != nil {
				t.Fatal(err)
			}
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			unregistered, late := o.state()
			if unregistered {
				if len(late) > 0 {
					t.Errorf("Close gave up %v: after Unregister the observer heard %v", gaveUp, late)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("Close gave up %v: not unregistered 10 s after the last Unlock", gaveUp)
			}
		}
	}
}

// TestCloseThatGivesUpStopsTheWatchdog: Close stops the goroutine the
// Locker started even when it gives up waiting for a holder.
func TestCloseThatGivesUpStopsTheWatchdog(t *testing.T) {
	before := goleak.IgnoreCurrent()
	l := fairlock.New[int](fairlock.WithLongHeld(time.Hour))
	g, _ := l.Lock(context.Background(), 1)
	defer g.Unlock()
	short, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := l.Close(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a holder: %v", err)
	}
	if err := goleak.Find(before); err != nil {
		t.Errorf("after a Close that gave up: %v", err)
	}
}

func TestErrorsNameTheKey(t *testing.T) {
	ctx := context.Background()
	l := fairlock.New[string]()
	g, _ := l.Lock(ctx, "order-7")
	defer g.Unlock()
	_, err := l.Lock(ctx, "order-7")
	msg := err.Error()
	if !strings.HasPrefix(msg, "fairlock: ") || !strings.Contains(msg, `"order-7"`) {
		t.Fatalf("error %q does not start with fairlock: and name the key", msg)
	}
	li := fairlock.New[int]()
	gi, _ := li.Lock(ctx, 42)
	defer gi.Unlock()
	_, err = li.TryLock(owner.NewContext(ctx), 42)
	if !strings.Contains(err.Error(), "42") || !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatalf("error %q does not name key 42", err)
	}
}

// TestNilContextPanics: every call that asks for a key panics on a nil
// ctx, naming itself, and leaves no state behind.
func TestNilContextPanics(t *testing.T) {
	l := fairlock.New[string]()
	s := fairlock.NewSemaphore[string](2)
	var nilCtx context.Context // the misuse under test
	calls := map[string]func(){
		"Lock":               func() { l.Lock(nilCtx, "k") },
		"TryLock":            func() { l.TryLock(nilCtx, "k") },
		"RLock":              func() { l.RLock(nilCtx, "k") },
		"TryRLock":           func() { l.TryRLock(nilCtx, "k") },
		"Wait":               func() { l.Wait(nilCtx, "k") },
		"LockMany":           func() { fairlock.LockMany(nilCtx, l, "a", "b") },
		"LockMany (no keys)": func() { fairlock.LockMany[string](nilCtx, l) },
		"Acquire":            func() { s.Acquire(nilCtx, "k", 1) },
		"TryAcquire":         func() { s.TryAcquire(nilCtx, "k", 1) },
	}
	for name, call := range calls {
		op, _, _ := strings.Cut(name, " ")
		func() {
			defer func() {
				r := recover()
				if msg, _ := r.(string); msg != "fairlock: "+op+" with a nil context" {
					t.Errorf("%s(nil) recovered %v, want the panic %q", name, r, "fairlock: "+op+" with a nil context")
				}
			}()
			call()
		}()
	}
	if l.Len() != 0 || s.Len() != 0 {
		t.Fatal("a panicking call left state behind")
	}
}

// TestZeroValuePanicsClearly: the zero Locker and Semaphore are not
// usable, and a call on one says so instead of failing on an index or a
// nil pointer.
func TestZeroValuePanicsClearly(t *testing.T) {
	var l fairlock.Locker[string]
	var s fairlock.Semaphore[string]
	ctx := context.Background()
	calls := map[string]func(){
		"Lock":              func() { l.Lock(ctx, "k") },
		"TryLock":           func() { l.TryLock(ctx, "k") },
		"Locked":            func() { l.Locked("k") },
		"Close":             func() { l.Close(ctx) },
		"Semaphore.Acquire": func() { s.Acquire(ctx, "k", 1) },
		"Semaphore.Close":   func() { s.Close(ctx) },
	}
	for name, call := range calls {
		func() {
			defer func() {
				if msg, _ := recover().(string); !strings.Contains(msg, "not made by New or NewSemaphore") {
					t.Errorf("%s on the zero value recovered %q, want a panic saying it was not made by New", name, msg)
				}
			}()
			call()
		}()
	}
}

// TestMutualExclusionUnderLoad hammers a few keys with Lock and TryLock
// while another goroutine keeps reading Locked, Waiters and Len; the race
// detector checks the memory-model promise (each Unlock happens before the
// next grant), and the counters check that no two holders overlapped. On
// one shard every key shares the fast path's state word, so grants keep
// passing between the lock-free path and the shard mutex.
func TestMutualExclusionUnderLoad(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		for _, shards := range []int{1, 64} {
			t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
				hammer(t, c, shards)
			})
		}
	})
}

func hammer(t *testing.T, c lockerConfig, shards int) {
	l, o := newLocker[int](t, c, fairlock.WithShards(shards))
	const keys, workers, rounds = 3, 16, 300
	var counts [keys]int // plain ints: guarded only by the fairlock
	var refused atomic.Int64
	var inside [keys]int
	var wg sync.WaitGroup
	stop := make(chan struct{})
	readerDone := make(chan struct{})
	go func() { // readers inflate fast grants at random moments
		defer close(readerDone)
		for k := 0; ; k = (k + 1) % keys {
			select {
			case <-stop:
				return
			default:
			}
			_, _, _ = l.Locked(k), l.Waiters(k), l.Len()
		}
	}()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			for i := range rounds {
				k := (w + i) % keys
				lock := l.Lock
				if i%3 == 0 {
					lock = l.TryLock
				}
				g, err := lock(ctx, k)
				if errors.Is(err, fairlock.ErrWouldBlock) {
					refused.Add(1)
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				inside[k]++
				if inside[k] != 1 {
					t.Errorf("key %d has %d holders", k, inside[k])
				}
				counts[k]++
				inside[k]--
				g.Unlock()
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-readerDone
	total := 0
	for _, c := range counts {
		total += c
	}
	if least := workers * rounds * 2 / 3; total < least {
		t.Fatalf("counted %d grants, want at least the %d Locks", total, least)
	}
	if l.Len() != 0 {
		t.Fatalf("Len = %d", l.Len())
	}
	checkTally(t, o, map[fairlock.Result]int{fairlock.Acquired: total, fairlock.WouldBlock: int(refused.Load())}, total)
}

// TestStaleGuardAcrossModes: a Guard from an earlier grant never releases
// a later one, whichever path either grant took: the lock-free fast path,
// a fast grant later moved under the shard mutex, or the mutex from the
// start (another key held on the one shard forces that).
func TestStaleGuardAcrossModes(t *testing.T) {
	ctx := context.Background()
	l := fairlock.New[string](fairlock.WithShards(1))
	lock := func(key string) fairlock.Guard[string] {
		t.Helper()
		g, err := l.Lock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	var stale []fairlock.Guard[string]
	g := lock("k") // fast, released fast
	g.Unlock()
	stale = append(stale, g)
	g = lock("k") // fast, moved under the mutex by Locked
	_ = l.Locked("k")
	g.Unlock()
	stale = append(stale, g)
	other := lock("other") // under the mutex from the start
	g = lock("k")
	g.Unlock()
	other.Unlock()
	other = fairlock.Guard[string]{}
	stale = append(stale, g)

	for _, busy := range []bool{false, true} {
		if busy {
			other = lock("other")
		}
		current := lock("k")
		for _, s := range stale {
			s.Unlock()
		}
		if !l.Locked("k") {
			t.Fatalf("other key held %v: a stale Unlock released a later grant", busy)
		}
		current.Unlock()
		other.Unlock()
		if l.Locked("k") {
			t.Fatalf("other key held %v: the current Guard did not release", busy)
		}
		stale = append(stale, current)
	}
	if l.Len() != 0 {
		t.Fatalf("Len = %d", l.Len())
	}
}

func TestLenTracksLiveKeys(t *testing.T) {
	ctx := context.Background()
	l := fairlock.New[string]()
	a, _ := l.Lock(ctx, "a")
	b, _ := l.Lock(ctx, "b")
	w := queueLockers(t, ctx, l, "a", 1)
	if l.Len() != 2 || l.Waiters("a") != 1 || l.Waiters("b") != 0 {
		t.Fatalf("Len %d Waiters(a) %d Waiters(b) %d; want 2 1 0", l.Len(), l.Waiters("a"), l.Waiters("b"))
	}
	a.Unlock()
	r := recv(t, w)
	if l.Len() != 2 {
		t.Fatalf("Len = %d after hand-off, want 2", l.Len())
	}
	r.g.Unlock()
	b.Unlock()
	if l.Len() != 0 || l.Locked("a") || l.Locked("b") {
		t.Fatalf("Len = %d when idle", l.Len())
	}
}

// TestStatsCountQueuedWaiters: the live counts an Observer reads (the
// otelmetrics waiters gauge) count a queued call until it leaves the
// queue, cancelled or granted, and are zero once all work is done.
func TestStatsCountQueuedWaiters(t *testing.T) {
	ctx := context.Background()
	o := new(tally)
	l, _ := newLocker[string](t, lockerConfigs[0], fairlock.WithObserver(o)) // plain, with o to read the counts
	want := func(when string, keys, waiters int) {
		t.Helper()
		if got := o.live(); got != (fairlock.Stats{Keys: keys, Waiters: waiters}) {
			t.Fatalf("%s: Stats = %+v, want %d keys and %d waiters", when, got, keys, waiters)
		}
	}
	g, _ := l.Lock(ctx, "k")
	cctx, cancel := context.WithCancel(ctx)
	victim := queueLockers(t, cctx, l, "k", 1)
	next := queueLockers(t, ctx, l, "k", 1)
	want("two queued", 1, 2)
	cancel()
	if r := recv(t, victim); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled waiter got %v", r.err)
	}
	want("one of two cancelled", 1, 1)
	g.Unlock()
	r := recv(t, next)
	if r.err != nil {
		t.Fatal(r.err)
	}
	want("the other granted", 1, 0)
	r.g.Unlock()
	want("idle", 0, 0)
}

// TestManyLiveKeysInOneShard drives one shard far past its inline slots
// (into its overflow map, and past the size at which that map is dropped
// once empty), releasing in a scrambled order, then reuses it.
func TestManyLiveKeysInOneShard(t *testing.T) {
	ctx := context.Background()
	l := fairlock.New[int](fairlock.WithShards(1))
	for round := range 2 {
		const n = 3000
		guards := make([]fairlock.Guard[int], n)
		for k := range n {
			g, err := l.TryLock(ctx, k)
			if err != nil {
				t.Fatalf("round %d, key %d: %v", round, k, err)
			}
			guards[k] = g
		}
		if l.Len() != n {
			t.Fatalf("Len = %d, want %d", l.Len(), n)
		}
		for k := range n {
			if !l.Locked(k) {
				t.Fatalf("key %d not locked", k)
			}
		}
		for i := range n {
			k := (i * 7919) % n // a permutation: 7919 is prime and does not divide n
			guards[k].Unlock()
			if l.Locked(k) || l.Len() != n-i-1 {
				t.Fatalf("after unlocking %d keys: Locked(%d) = %v, Len = %d", i+1, k, l.Locked(k), l.Len())
			}
		}
	}
}

// TestKeyNotEqualToItselfIsRefused: a NaN key, or a key holding one, is
// refused with ErrInvalidKey by Lock, TryLock and LockMany, on the fast
// path and under the shard mutex alike, and leaves nothing behind. Before
// the check, Lock granted it and Unlock could not find it again: Len stayed
// 1 and Close waited for it forever. Ordinary float keys still lock,
// with +0 and -0 one key since they are equal.
func TestKeyNotEqualToItselfIsRefused(t *testing.T) {
	ctx := context.Background()
	nan := math.NaN()
	wantInvalid := func(t *testing.T, op string, err error) {
		t.Helper()
		var le *fairlock.LockError
		if !errors.Is(err, fairlock.ErrInvalidKey) || !errors.As(err, &le) || le.Op != op {
			t.Fatalf("%s = %v, want a *LockError for %s wrapping ErrInvalidKey", op, err, op)
		}
		if !strings.Contains(err.Error(), "NaN") {
			t.Errorf("%s error %q does not name the key", op, err)
		}
	}

	l := fairlock.New[float64](fairlock.WithShards(1))
	_, err := l.Lock(ctx, nan) // idle shard: the fast path's check
	wantInvalid(t, "Lock", err)
	_, err = l.TryLock(ctx, nan)
	wantInvalid(t, "TryLock", err)
	held, err := l.Lock(ctx, 0.5) // busy shard: the mutex path's check
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Lock(ctx, nan)
	wantInvalid(t, "Lock", err)
	_, err = l.TryLock(ctx, nan)
	wantInvalid(t, "TryLock", err)
	_, err = fairlock.LockMany(ctx, l, 1, nan, 2)
	wantInvalid(t, "LockMany", err)
	if got := l.Len(); got != 1 {
		t.Fatalf("Len = %d after the refusals, want 1 (only 0.5)", got)
	}
	held.Unlock()

	zero, err := l.Lock(ctx, 0.0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryLock(owner.NewContext(ctx), math.Copysign(0, -1)); !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatalf("TryLock(-0) while +0 is held = %v, want ErrWouldBlock: they are equal keys", err)
	}
	zero.Unlock()

	type point struct{ X, Y float64 }
	lp := fairlock.New[point]()
	_, err = lp.Lock(ctx, point{1, nan})
	wantInvalid(t, "Lock", err)
	la := fairlock.New[any]()
	_, err = la.Lock(ctx, any(nan))
	wantInvalid(t, "Lock", err)

	for name, n := range map[string]int{"float64": l.Len(), "struct": lp.Len(), "any": la.Len()} {
		if n != 0 {
			t.Errorf("%s Locker: Len = %d after everything was released or refused, want 0", name, n)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.Close(cctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
}

// TestContextCauseIsNotTheResult: a waiter whose context ends with a cause
// (errgroup cancels with the first error) is reported as canceled, or as
// deadline_exceeded if its deadline passed, whatever the cause says; the
// cause stays in its error. A cause naming ErrDeadlock, ErrClosed or
// ErrWouldBlock is another call's result, not this one's.
func TestContextCauseIsNotTheResult(t *testing.T) {
	peerTimedOut := fmt.Errorf("peer: %w", context.DeadlineExceeded)
	for _, c := range []struct {
		cause error
		timed bool
		want  fairlock.Result
	}{
		{errors.New("plain cause"), false, fairlock.Canceled},
		{fmt.Errorf("sibling: %w", fairlock.ErrDeadlock), false, fairlock.Canceled},
		{fmt.Errorf("sibling: %w", fairlock.ErrWouldBlock), false, fairlock.Canceled},
		{fmt.Errorf("shutting down: %w", fairlock.ErrClosed), false, fairlock.Canceled},
		{peerTimedOut, false, fairlock.Canceled},
		{errors.New("too slow"), true, fairlock.DeadlineExceeded},
	} {
		o := new(tally)
		l := fairlock.New[string](fairlock.WithObserver(o))
		holder, _ := l.Lock(context.Background(), "k")
		var ctx context.Context
		var stop func()
		if c.timed {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeoutCause(owner.NewContext(context.Background()), 20*time.Millisecond, c.cause)
			stop = cancel
		} else {
			var cancel context.CancelCauseFunc
			ctx, cancel = context.WithCancelCause(owner.NewContext(context.Background()))
			stop = func() { cancel(c.cause) }
		}
		done := make(chan error, 1)
		go func() { _, err := l.Lock(ctx, "k"); done <- err }()
		if !c.timed {
			waitWaiters(t, l, "k", 1)
			stop()
		}
		err := <-done
		stop()
		holder.Unlock()
		if err := l.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(err, c.cause) {
			t.Errorf("cause %q: the error %v does not carry the cause", c.cause, err)
		}
		results, _, _ := o.counts()
		delete(results, fairlock.Acquired)
		if diff := cmp.Diff(map[fairlock.Result]int{c.want: 1}, results); diff != "" {
			t.Errorf("cause %q: results (-want +got):\n%s", c.cause, diff)
		}
	}
}
