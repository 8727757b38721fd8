package keylocktest_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest"
	"github.com/fairlock/fairlock/owner"
)

// wrappedHarness is the in-process harness with shared holds and the
// semaphore (one fairlock.Locker per test, one fairlock.Semaphore per
// test and size, handed out as views), each view passed through wrapL or
// wrapS, which break one promise for TestRunFailsOnBrokenLockers.
func wrappedHarness(wrapL func(keylock.RWLocker) keylock.Locker, wrapS func(keylock.Semaphore, int64) keylock.Semaphore) keylocktest.Harness {
	lockers := &perTest[*fairlock.Locker[string]]{make: func(t testing.TB) *fairlock.Locker[string] {
		l := fairlock.New[string]()
		t.Cleanup(func() { closeLocker(t, l) })
		return l
	}}
	var mu sync.Mutex // protects the maps in semaphores
	semaphores := &perTest[map[int64]*fairlock.Semaphore[string]]{make: func(testing.TB) map[int64]*fairlock.Semaphore[string] {
		return map[int64]*fairlock.Semaphore[string]{}
	}}
	return keylocktest.Harness{
		New: func(t testing.TB) keylock.Locker { return wrapL(keylock.InProcess(lockers.get(t))) },
		Waiters: func(t testing.TB, key string) int {
			n := lockers.get(t).Waiters(key)
			ss := semaphores.get(t)
			mu.Lock()
			defer mu.Unlock()
			for _, s := range ss {
				n += s.Waiters(key)
			}
			return n
		},
		NewSemaphore: func(t testing.TB, n int64) keylock.Semaphore {
			ss := semaphores.get(t)
			mu.Lock()
			defer mu.Unlock()
			s, ok := ss[n]
			if !ok {
				s = fairlock.NewSemaphore[string](n)
				ss[n] = s
				t.Cleanup(func() { closeLocker(t, s) })
			}
			return wrapS(keylock.InProcessSemaphore(s), n)
		},
	}
}

// tryRLockExclusive is an RWLocker whose TryRLock takes the key
// exclusively: readers do not share.
type tryRLockExclusive struct{ keylock.RWLocker }

func (l tryRLockExclusive) TryRLock(ctx context.Context, key string) (keylock.Lease, error) {
	return l.TryLock(ctx, key)
}

// anyWeight is a Semaphore that takes a weight outside 1..n as the
// nearest one inside instead of refusing it with ErrInvalidWeight.
type anyWeight struct {
	keylock.Semaphore
	n int64
}

func (s anyWeight) Acquire(ctx context.Context, key string, w int64) (keylock.Lease, error) {
	return s.Semaphore.Acquire(ctx, key, min(max(w, 1), s.n))
}

func (s anyWeight) TryAcquire(ctx context.Context, key string, w int64) (keylock.Lease, error) {
	return s.Semaphore.TryAcquire(ctx, key, min(max(w, 1), s.n))
}

// typedNil is a Locker whose failed calls return a typed nil inside the
// Lease: a non-nil interface, which a caller's `lease != nil` takes for a
// grant.
type typedNil struct{ keylock.RWLocker }

// nilLease is the typed nil's type; its methods work on a nil pointer,
// so that the suite's cleanup can call them.
type nilLease struct{}

func (*nilLease) Unlock(context.Context) error { return nil }
func (*nilLease) Key() string                  { return "" }
func (*nilLease) Token() uint64                { return 0 }
func (*nilLease) Lost() <-chan struct{}        { return nil }
func (*nilLease) Deadline() time.Time          { return time.Time{} }
func (*nilLease) HandOff(owner.ID) bool        { return false }

func typed(l keylock.Lease, err error) (keylock.Lease, error) {
	if err != nil {
		return (*nilLease)(nil), err
	}
	return l, nil
}

func (l typedNil) Lock(ctx context.Context, key string) (keylock.Lease, error) {
	return typed(l.RWLocker.Lock(ctx, key))
}

func (l typedNil) TryLock(ctx context.Context, key string) (keylock.Lease, error) {
	return typed(l.RWLocker.TryLock(ctx, key))
}

func (l typedNil) RLock(ctx context.Context, key string) (keylock.Lease, error) {
	return typed(l.RWLocker.RLock(ctx, key))
}

func (l typedNil) TryRLock(ctx context.Context, key string) (keylock.Lease, error) {
	return typed(l.RWLocker.TryRLock(ctx, key))
}

func unwrappedLocker(l keylock.RWLocker) keylock.Locker                 { return l }
func unwrappedSemaphore(s keylock.Semaphore, _ int64) keylock.Semaphore { return s }
