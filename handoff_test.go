package fairlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
)

// TestHandedOffGuardIsNotReentry: a goroutine locks a key and hands the
// Guard to a worker that unlocks it later, the sync.Mutex hand-off. Without
// Guard.HandOff the first goroutine's next Lock is re-entry (ErrReentrant
// at once); with it, that Lock waits for the worker's Unlock.
func TestHandedOffGuardIsNotReentry(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		l, _ := newLocker[string](t, c)
		ctx := context.Background()

		// Without a hand-off: re-entry, reported at once.
		g, err := l.Lock(ctx, "user-1")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Lock(ctx, "user-1"); !errors.Is(err, fairlock.ErrReentrant) {
			t.Fatalf("second Lock by the holder without HandOff: %v; want ErrReentrant", err)
		}

		// With it: the grant is the worker's, and the same Lock waits.
		wctx := owner.NewContext(context.Background())
		if !g.HandOff(owner.Of(wctx)) {
			t.Fatal("HandOff of a current grant reported false")
		}
		release := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			<-release
			g.Unlock()
		}()
		locked := make(chan error, 1)
		go func() {
			g2, err := l.Lock(ctx, "user-1") // another goroutine: the same owner only for a flow
			if err == nil {
				g2.Unlock()
			}
			locked <- err
		}()
		waitWaiters(t, l, "user-1", 1)
		// The worker's flow now holds the key: its own Lock is re-entry.
		if _, err := l.TryLock(wctx, "user-1"); !errors.Is(err, fairlock.ErrReentrant) {
			t.Fatalf("TryLock by the flow handed the grant: %v; want ErrReentrant", err)
		}
		close(release)
		if err := recv(t, locked); err != nil {
			t.Fatalf("Lock after the hand-off: %v; want it granted once the worker unlocked", err)
		}
		<-done
		if g.HandOff(owner.Of(wctx)) {
			t.Fatal("HandOff of an unlocked Guard reported true")
		}
	})
}

// TestHandOffByTheLockingGoroutine is the issue's own pattern: one
// goroutine (no flow token in its ctx) locks, hands the Guard off, and
// locks again; its second Lock must wait, not fail.
func TestHandOffByTheLockingGoroutine(t *testing.T) {
	forEachConfig(t, func(t *testing.T, c lockerConfig) {
		l, _ := newLocker[string](t, c)
		ctx := context.Background()
		g, err := l.Lock(ctx, "user-1")
		if err != nil {
			t.Fatal(err)
		}
		wctx := owner.NewLabeledContext(context.Background(), "worker")
		g.HandOff(owner.Of(wctx))
		go func() {
			waitWaiters(t, l, "user-1", 1) // the Lock below has queued
			g.Unlock()
		}()
		g2, err := l.Lock(ctx, "user-1")
		if err != nil {
			t.Fatalf("Lock after handing the Guard off: %v; want a wait, then the grant", err)
		}
		if g2.Token() <= g.Token() {
			t.Fatalf("token after the hand-off %d, not above %d", g2.Token(), g.Token())
		}
		g2.Unlock()
	})
}

// TestHandOffIsSeenByDeadlockDetection: after a hand-off the wait-for
// graph has the new owner as the holder, so a cycle through it is found.
func TestHandOffIsSeenByDeadlockDetection(t *testing.T) {
	l := fairlock.New[string](fairlock.WithDeadlockDetection(), quiet())
	defer l.Close(context.Background())
	a, b := owner.NewContext(context.Background()), owner.NewContext(context.Background())
	ga, err := l.Lock(a, "x")
	if err != nil {
		t.Fatal(err)
	}
	gb, err := l.Lock(b, "y")
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() { // b waits for x, held by a: an edge of the graph
		g, err := l.Lock(b, "x")
		if err == nil {
			g.Unlock()
		}
		waiting <- err
	}()
	waitWaiters(t, l, "x", 1)
	// x is tracked (awaited) now; hand it from a to c.
	c := owner.NewContext(context.Background())
	ga.HandOff(owner.Of(c))
	// c waiting for y (held by b, who waits for x, held by c) closes a cycle.
	if _, err := l.Lock(c, "y"); !errors.Is(err, fairlock.ErrDeadlock) {
		t.Fatalf("Lock closing a cycle through a handed-off grant: %v; want ErrDeadlock", err)
	}
	// a holds nothing now: x is someone else's, and busy.
	if _, err := l.TryLock(a, "x"); !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatalf("TryLock by the owner that handed its grant off: %v; want ErrWouldBlock", err)
	}
	ga.Unlock()
	if err := recv(t, waiting); err != nil {
		t.Fatal(err)
	}
	gb.Unlock()
}

// TestHandOffAmongManyReaders: a key read by many keeps an index of its
// holders' owners for the reentrancy check; a hand-off moves the hold in
// it too.
func TestHandOffAmongManyReaders(t *testing.T) {
	l := fairlock.New[string]()
	defer l.Close(context.Background())
	var guards []fairlock.Guard[string]
	var flows []context.Context
	for range 40 {
		ctx := owner.NewContext(context.Background())
		g, err := l.RLock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		guards, flows = append(guards, g), append(flows, ctx)
	}
	to := owner.NewContext(context.Background())
	if !guards[0].HandOff(owner.Of(to)) {
		t.Fatal("HandOff of a current shared grant reported false")
	}
	if _, err := l.TryRLock(to, "k"); !errors.Is(err, fairlock.ErrReentrant) {
		t.Fatalf("TryRLock by the new owner: %v; want ErrReentrant", err)
	}
	g, err := l.TryRLock(flows[0], "k")
	if err != nil {
		t.Fatalf("TryRLock by the owner that handed its hold off: %v", err)
	}
	g.Unlock()
	for _, g := range guards {
		g.Unlock()
	}
	if n := l.Len(); n != 0 {
		t.Fatalf("Len = %d after every reader unlocked", n)
	}
}

// TestHandOffOfASemaphoreGrant: a Semaphore's Guard hands off the same
// way: the owner that handed its units over may acquire again.
func TestHandOffOfASemaphoreGrant(t *testing.T) {
	s := fairlock.NewSemaphore[string](2)
	defer s.Close(context.Background())
	ctx := owner.NewContext(context.Background())
	g, err := s.Acquire(ctx, "pool", 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire(ctx, "pool", 1); !errors.Is(err, fairlock.ErrReentrant) {
		t.Fatalf("second Acquire by the holder: %v; want ErrReentrant", err)
	}
	if !g.HandOff(owner.Of(owner.NewContext(context.Background()))) {
		t.Fatal("HandOff of a current grant reported false")
	}
	g2, err := s.Acquire(ctx, "pool", 1)
	if err != nil {
		t.Fatalf("Acquire after handing the first grant off: %v", err)
	}
	g2.Unlock()
	g.Unlock()
	if (fairlock.Guard[string]{}).HandOff(owner.Of(ctx)) || g.HandOff(0) {
		t.Fatal("HandOff of the zero Guard, or to owner 0, reported true")
	}
}

// TestHandOffToAQueuedOwnerIsRefused: a holds k and b is queued on k.
// Handing a's grant to b would have b hold k and wait for it, a cycle the
// deadlock detector would then report against every later waiter of k
// ("flow#2 waits for k held by flow#2"). HandOff refuses it and changes
// nothing: a third flow's Lock queues as usual, and the key goes to b,
// then to it, in arrival order.
func TestHandOffToAQueuedOwnerIsRefused(t *testing.T) {
	l := fairlock.New[string](fairlock.WithDeadlockDetection(), quiet())
	defer l.Close(context.Background())
	a := owner.NewContext(context.Background())
	b := owner.NewContext(context.Background())
	c := owner.NewContext(context.Background())
	ga, err := l.Lock(a, "k")
	if err != nil {
		t.Fatal(err)
	}
	lockAndUnlock := func(ctx context.Context, release <-chan struct{}, out chan<- error) {
		g, err := l.Lock(ctx, "k")
		if err == nil {
			<-release
			g.Unlock()
		}
		out <- err
	}
	bErr, bRelease := make(chan error, 1), make(chan struct{})
	go lockAndUnlock(b, bRelease, bErr)
	waitWaiters(t, l, "k", 1)

	// Errorf, not Fatalf, up to ga.Unlock: the grants must end for Close.
	if ga.HandOff(owner.Of(b)) {
		t.Error("HandOff to an owner queued on the key reported true")
	}
	// Nothing changed: the grant is still a's.
	if _, err := l.TryLock(a, "k"); !errors.Is(err, fairlock.ErrReentrant) {
		t.Errorf("TryLock by a after the refused hand-off: %v; want ErrReentrant", err)
	}
	cErr, cRelease := make(chan error, 1), make(chan struct{})
	go lockAndUnlock(c, cRelease, cErr)
	// c queues (two waiters), or fails at once: ErrDeadlock before the fix.
	waitFor(t, "c to queue or fail", func() bool { return l.Waiters("k") == 2 || len(cErr) > 0 })
	if len(cErr) > 0 {
		t.Errorf("Lock by a third flow after the refused hand-off: %v; want it queued", <-cErr)
		cErr <- nil
	}

	ga.Unlock()
	close(bRelease)
	if err := recv(t, bErr); err != nil {
		t.Fatalf("b's Lock: %v", err)
	}
	close(cRelease)
	if err := recv(t, cErr); err != nil {
		t.Fatalf("c's Lock: %v", err)
	}
	// A Wait queued counts as queued too.
	ga, err = l.Lock(a, "k")
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- l.Wait(b, "k") }()
	waitWaiters(t, l, "k", 1)
	if ga.HandOff(owner.Of(b)) {
		t.Error("HandOff to an owner with a Wait queued on the key reported true")
	}
	ga.Unlock()
	if err := recv(t, waited); err != nil {
		t.Fatalf("b's Wait: %v", err)
	}
	if n := l.Len(); n != 0 {
		t.Fatalf("Len = %d after every grant ended", n)
	}
}
