//go:build !race

package keylock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
)

// TestInProcessAllocatesOnlyTheLease holds InProcess's cost: an
// uncontended Lock+Unlock through the interface allocates the Lease, the
// one object the interface value points to, and nothing more; so do
// TryLock, RLock, TryRLock, Acquire and TryAcquire; Wait allocates
// nothing, and Do with an in-process Lease allocates only the Lease too
// (no context, goroutine or timer). The direct calls allocate nothing
// (fairlock's TestUncontendedAllocatesNothing). Built without -race,
// whose instrumentation allocates on its own.
func TestInProcessAllocatesOnlyTheLease(t *testing.T) {
	// Bounded, so that a grant left held fails the test instead of
	// hanging it; made once, outside the measured runs.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l := fairlock.New[string]()
	defer l.Close(ctx)
	s := fairlock.NewSemaphore[string](3)
	defer s.Close(ctx)
	v, sv := keylock.InProcess(l), keylock.InProcessSemaphore(s)
	other := owner.NewContext(ctx)
	lock, fn := v.Lock, func(context.Context, keylock.Lease) error { return nil }
	for _, c := range []struct {
		name string
		max  float64
		f    func() error
	}{
		{"Lock+Unlock", 1, func() error {
			g, err := v.Lock(ctx, "k")
			if err != nil {
				return err
			}
			return g.Unlock(ctx)
		}},
		{"TryLock+Unlock", 1, func() error {
			g, err := v.TryLock(ctx, "k")
			if err != nil {
				return err
			}
			return g.Unlock(ctx)
		}},
		{"RLock+TryRLock+Unlock", 2, func() error {
			r1, err1 := v.RLock(ctx, "k")
			r2, err2 := v.TryRLock(other, "k")
			if err := errors.Join(err1, err2); err != nil {
				return err
			}
			return errors.Join(r1.Unlock(ctx), r2.Unlock(ctx))
		}},
		{"Acquire+TryAcquire+Unlock", 2, func() error {
			u1, err1 := sv.Acquire(ctx, "k", 2)
			u2, err2 := sv.TryAcquire(other, "k", 1)
			if err := errors.Join(err1, err2); err != nil {
				return err
			}
			return errors.Join(u1.Unlock(ctx), u2.Unlock(ctx))
		}},
		{"Wait", 0, func() error { return v.Wait(ctx, "k") }},
		{"Do", 1, func() error { return keylock.Do(ctx, lock, "k", fn) }},
	} {
		allocs := testing.AllocsPerRun(10000, func() {
			if err := c.f(); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
		})
		if allocs > c.max {
			t.Errorf("uncontended %s through keylock.InProcess allocates %v times per run, want at most %v (the Leases)", c.name, allocs, c.max)
		}
	}
}
