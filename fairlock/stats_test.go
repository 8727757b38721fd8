package fairlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
)

// statsObserver keeps the stats function an Observer is given.
type statsObserver struct {
	mu    sync.Mutex
	stats func() fairlock.Stats
}

func (o *statsObserver) Register(_ string, stats func() fairlock.Stats) fairlock.LockerObserver {
	o.mu.Lock()
	o.stats = stats
	o.mu.Unlock()
	return nopRecorder{}
}

type nopRecorder struct{}

func (nopRecorder) Acquire(fairlock.Result, time.Duration) {}
func (nopRecorder) Release(time.Duration)                  {}
func (nopRecorder) Unregister()                            {}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestStats checks that Locker.Stats and Semaphore.Stats count the keys
// held and the calls queued, as the Observer's stats function does, and
// are zero again once every call has returned, a cancelled one included.
func TestStats(t *testing.T) {
	ctx := context.Background()
	obs := &statsObserver{}
	l := fairlock.New[string](fairlock.WithObserver(obs))
	defer l.Close(ctx)
	if st := l.Stats(); st != (fairlock.Stats{}) {
		t.Fatalf("new Locker: Stats = %+v, want zero", st)
	}
	a, _ := l.Lock(ctx, "a")
	b, _ := l.RLock(ctx, "b")
	var wg sync.WaitGroup
	cctx, cancel := context.WithCancel(ctx)
	for _, wctx := range []context.Context{owner.NewContext(ctx), owner.NewContext(cctx)} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if g, err := l.Lock(wctx, "a"); err == nil {
				g.Unlock()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := l.Wait(owner.NewContext(ctx), "b"); err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, "3 waiters", func() bool { return l.Waiters("a") == 2 && l.Waiters("b") == 1 })
	want := fairlock.Stats{Keys: 2, Waiters: 3}
	if st := l.Stats(); st != want {
		t.Errorf("Locker.Stats = %+v, want %+v", st, want)
	}
	obs.mu.Lock()
	if st := obs.stats(); st != want {
		t.Errorf("the Observer's stats = %+v, want %+v (Locker.Stats)", st, want)
	}
	obs.mu.Unlock()
	cancel()
	waitFor(t, "the cancelled waiter to leave", func() bool { return l.Waiters("a") == 1 })
	if st, want := l.Stats(), (fairlock.Stats{Keys: 2, Waiters: 2}); st != want {
		t.Errorf("after a cancel: Locker.Stats = %+v, want %+v", st, want)
	}
	a.Unlock()
	b.Unlock()
	wg.Wait()
	if st := l.Stats(); st != (fairlock.Stats{}) {
		t.Errorf("idle Locker: Stats = %+v, want zero", st)
	}

	s := fairlock.NewSemaphore[string](2)
	defer s.Close(ctx)
	u, _ := s.Acquire(ctx, "k", 2)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if g, err := s.Acquire(owner.NewContext(ctx), "k", 1); err == nil {
			g.Unlock()
		}
	}()
	waitFor(t, "a queued Acquire", func() bool { return s.Waiters("k") == 1 })
	if st, want := s.Stats(), (fairlock.Stats{Keys: 1, Waiters: 1}); st != want {
		t.Errorf("Semaphore.Stats = %+v, want %+v", st, want)
	}
	u.Unlock()
	<-done
	if st := s.Stats(); st != (fairlock.Stats{}) {
		t.Errorf("idle Semaphore: Stats = %+v, want zero", st)
	}
}
