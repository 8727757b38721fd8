package pglock

import (
	"context"
	"testing"
	"time"

	"github.com/fairlock/fairlock/keylock"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Helpers of the tests of the public API (Locker, Semaphore, Guard), on
// the shared server or one of a test's own.

// lockTTL is the session TTL of the tests' Lockers: short, so that tests
// of lost sessions run fast, yet long enough that a renewal (every TTL/3)
// delayed by the race detector and a loaded machine still lands in time.
const lockTTL = 2 * time.Second

// newLocker returns a Locker on pool under prefix with TTL lockTTL (opts
// may change it), closed by t.Cleanup (which fails the test if Close
// fails).
func newLocker(t testing.TB, pool *pgxpool.Pool, prefix string, opts ...Option) *Locker {
	t.Helper()
	l, err := New(pool, prefix, append([]Option{WithTTL(lockTTL)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}

// rowsOf returns the number of rows (calls, live or dead) of key under
// the prefixes.
func rowsOf(t testing.TB, pool *pgxpool.Pool, key string, prefixes ...string) int {
	t.Helper()
	bs := make([][]byte, len(prefixes))
	for i, p := range prefixes {
		bs[i] = []byte(p)
	}
	var n int
	err := pool.QueryRow(context.Background(), `SELECT count(*) FROM fairlock_calls WHERE prefix = ANY($1) AND key = $2`, bs, []byte(key)).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// awaitRows polls until key under prefix has n rows, failing t after d.
// A poll, not an ordering: the count decides.
func awaitRows(t testing.TB, pool *pgxpool.Pool, prefix, key string, n int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := rowsOf(t, pool, key, prefix)
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %q under %q: %d rows, want %d within %v", key, prefix, got, n, d)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// refOfLease returns the name of a grant's row.
func refOfLease(l keylock.Lease) callRef { return refOf(l.(*Guard).call().ID()) }

// deleteRow deletes a grant's row, as an administrator (or a bug) might:
// its Locker learns it at its next renewal.
func deleteRow(t testing.TB, pool *pgxpool.Pool, l keylock.Lease) {
	t.Helper()
	ref := refOfLease(l)
	tag, err := pool.Exec(context.Background(), `DELETE FROM fairlock_calls WHERE session = $1 AND seq = $2`, ref.Session, ref.Seq)
	if err != nil {
		t.Fatal(err)
	}
	if tag.RowsAffected() != 1 {
		t.Fatalf("deleting the row of %v: %d rows", ref, tag.RowsAffected())
	}
}

// isClosed reports whether ch is closed (a Lease's Lost, say), without
// waiting.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// recvWithin returns the next value received from ch, failing t with msg
// (and the time waited) if none comes within d.
func recvWithin[T any](t testing.TB, ch <-chan T, d time.Duration, msg string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s (waited %v)", msg, d)
	}
	var zero T
	return zero
}
