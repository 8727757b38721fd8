package pglock

import (
	"context"
	"testing"
	"time"
)

// TestWaitsEndBeforeTheirRowsGo queues twelve Waits and a Lock behind a
// holder and, while the Waits' rows are held (FOR SHARE, as a Fence
// holds a row: their deletion waits for it), releases the holder: every
// Wait returns, the Lock behind them is granted, and once it is unlocked
// the key reads as free (Locked false, a TryLock granted) beside the
// twelve rows of Waits whose turn came. The rows then go, in the
// janitor's batch.
func TestWaitsEndBeforeTheirRowsGo(t *testing.T) {
	pool, _ := setup(t, 0)
	prefix := t.Name()
	const key, n = "k", 12
	holder, waiter, behind := newLocker(t, pool, prefix), newLocker(t, pool, prefix), newLocker(t, pool, prefix)
	ctx := context.Background()
	h, err := holder.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	waits := make(chan error, n)
	for range n {
		go func() { waits <- waiter.Wait(ctx, key) }()
	}
	awaitRows(t, pool, prefix, key, n+1, 10*time.Second)
	lock := lockAsync(t, ctx, behind.Lock, key)
	awaitRows(t, pool, prefix, key, n+2, 10*time.Second)

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var held int
	if err := tx.QueryRow(ctx, `SELECT count(*) FROM (SELECT id FROM fairlock_calls WHERE prefix = $1 AND key = $2 AND mode = 'w' FOR SHARE) r`,
		[]byte(prefix), []byte(key)).Scan(&held); err != nil || held != n {
		t.Fatalf("holding the Waits' rows: %d rows, %v", held, err)
	}

	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for range n {
		select {
		case err := <-waits:
			if err != nil {
				t.Fatalf("Wait: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a Wait did not return at the release, its row's deletion held back")
		}
	}
	g := awaitGrant(t, lock, 10*time.Second, "the Lock behind the Waits, their rows' deletion held back")
	if locked, err := behind.Locked(ctx, key); err != nil || !locked {
		t.Fatalf("Locked while the Lock behind the Waits holds: %v, %v", locked, err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rowsOf(t, pool, key, prefix); got != n {
		t.Fatalf("%d rows after the Lock's Unlock, want the %d Waits' still held back", got, n)
	}
	if locked, err := behind.Locked(ctx, key); err != nil || locked {
		t.Errorf("Locked beside the rows of Waits whose turn came: %v, %v; want false", locked, err)
	}
	tg, err := behind.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock beside the rows of Waits whose turn came: %v", err)
	}
	if err := tg.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	awaitRows(t, pool, prefix, key, 0, 10*time.Second)
}
