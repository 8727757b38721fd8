package pglock

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestConformance runs the keylock conformance suite on the shared
// server: every Locker and Semaphore of a check shares one pool of at
// most 10 connections (as the Lockers of one service would), each with a
// session and a listening connection of its own; Calls counts the key's
// rows; Lose deletes the grant's row, as another process's purge of a
// dead session would (the Locker learns it at its next renewal, and the
// waiter behind at its next re-read).
func TestConformance(t *testing.T) {
	n := prefixes.Add(1)
	prefix, semPrefix := fmt.Sprintf("conformance#%d", n), fmt.Sprintf("conformance-semaphore#%d", n)
	var mu sync.Mutex
	pools := map[testing.TB]*pgxpool.Pool{} // one per check
	pool := func(t testing.TB) *pgxpool.Pool {
		mu.Lock()
		defer mu.Unlock()
		p, ok := pools[t]
		if !ok {
			p, _ = setup(t, 10)
			pools[t] = p
			t.Cleanup(func() {
				mu.Lock()
				delete(pools, t)
				mu.Unlock()
			})
		}
		return p
	}
	keylocktest.Run(t, keylocktest.Harness{
		New: func(t testing.TB) keylock.Locker {
			return newLocker(t, pool(t), prefix)
		},
		Calls: func(t testing.TB, key string) int {
			return rowsOf(t, pool(t), key, prefix, semPrefix)
		},
		Lose: func(t testing.TB, l keylock.Lease) { deleteRow(t, pool(t), l) },
		NewSemaphore: func(t testing.TB, n int64) keylock.Semaphore {
			s, err := NewSemaphore(pool(t), semPrefix, n, WithTTL(lockTTL))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := s.Close(ctx); err != nil {
					t.Errorf("Semaphore.Close: %v", err)
				}
			})
			return s
		},
	})
}
