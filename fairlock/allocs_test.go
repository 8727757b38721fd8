//go:build !race

package fairlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
)

// TestUncontendedAllocatesNothing holds the promise of docs/guarantees.md's Costs
// section: Lock+Unlock of a free key, TryLock+Unlock, Locked and Waiters
// allocate nothing with debug and observer off. (Built without -race: the
// race detector's instrumentation allocates on its own.)
func TestUncontendedAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	for name, l := range map[string]*fairlock.Locker[string]{
		"plain":              fairlock.New[string](),
		"deadlock-detection": fairlock.New[string](fairlock.WithDeadlockDetection()),
	} {
		keys := benchKeys(64)
		i := 0
		allocs := testing.AllocsPerRun(10000, func() {
			k := keys[i%len(keys)]
			i++
			g, err := l.Lock(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			g.Unlock()
			g, err = l.TryLock(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			_ = l.Locked(k)
			_ = l.Waiters(k)
			g.Unlock()
		})
		if allocs != 0 {
			t.Errorf("%s: uncontended Lock/TryLock/Unlock allocates %v times per run, want 0", name, allocs)
		}
	}
	// Shared holds and semaphore units, on the lock-free path and under
	// the mutex (two readers at once, a second key's units beside them).
	l := fairlock.New[string]()
	s := fairlock.NewSemaphore[string](3)
	other := owner.NewContext(ctx)
	keys := benchKeys(64)
	i := 0
	allocs := testing.AllocsPerRun(10000, func() {
		k := keys[i%len(keys)]
		i++
		r1, err1 := l.RLock(ctx, k)
		r2, err2 := l.TryRLock(other, k)
		u1, err3 := s.Acquire(ctx, k, 2)
		u2, err4 := s.TryAcquire(other, k, 1)
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			t.Fatal(err)
		}
		if err := l.Wait(other, keys[(i+1)%len(keys)]); err != nil {
			t.Fatal(err)
		}
		_ = r1.Token() + r2.Token() + u1.Token() + u2.Token()
		r1.Unlock()
		r2.Unlock()
		u1.Unlock()
		u2.Unlock()
	})
	if allocs != 0 {
		t.Errorf("uncontended RLock/TryRLock/Acquire/TryAcquire/Wait/Unlock allocate %v times per run, want 0", allocs)
	}
}

// TestRefusedTryLockAllocatesOnlyItsError holds TryLock's documented cost
// of a refusal: the *LockError and the key boxed in it, nothing more.
func TestRefusedTryLockAllocatesOnlyItsError(t *testing.T) {
	ctx := context.Background()
	l := fairlock.New[string]()
	g, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Unlock()
	other := owner.NewContext(ctx)
	allocs := testing.AllocsPerRun(10000, func() {
		if _, err := l.TryLock(other, "k"); !errors.Is(err, fairlock.ErrWouldBlock) {
			t.Fatalf("TryLock of a held key = %v, want ErrWouldBlock", err)
		}
	})
	if allocs > 2 {
		t.Errorf("a refused TryLock allocates %v times, want at most 2 (its *LockError and the boxed key)", allocs)
	}
}

// TestStatsAllocatesNothing holds Stats's promise, on a Locker with a
// held key and a waiter and on a Semaphore.
func TestStatsAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	l := fairlock.New[string]()
	defer l.Close(ctx)
	s := fairlock.NewSemaphore[string](2)
	defer s.Close(ctx)
	g, err := l.Lock(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Unlock()
	u, err := s.Acquire(ctx, "held", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Unlock()
	allocs := testing.AllocsPerRun(1000, func() {
		if st := l.Stats(); st.Keys != 1 {
			t.Fatalf("Locker.Stats = %+v, want 1 key", st)
		}
		if st := s.Stats(); st.Keys != 1 {
			t.Fatalf("Semaphore.Stats = %+v, want 1 key", st)
		}
	})
	if allocs != 0 {
		t.Errorf("Stats allocates %v times per run, want 0", allocs)
	}
}
