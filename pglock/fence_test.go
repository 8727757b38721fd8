package pglock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// guarded makes a table a test writes under the lock.
func guarded(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	name := pgx.Identifier{"guarded_" + newSpace(t.Name()).channel + "_" + itoa64(prefixes.Add(1))}.Sanitize()
	if _, err := pool.Exec(context.Background(), "CREATE TABLE "+name+" (token bigint, writer text)"); err != nil {
		t.Fatal(err)
	}
	return name
}

// fencedWrite writes (token, writer) into table in a transaction fenced
// with the grant (session, token), and returns fence's error (the write
// is committed only if it is nil).
func fencedWrite(t testing.TB, pool *pgxpool.Pool, table string, session, token int64, writer string) error {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := fence(ctx, tx, session, token); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, $2)", token, writer); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return nil
}

// writers returns the writers in table, in order of token.
func writers(t testing.TB, pool *pgxpool.Pool, table string) []string {
	t.Helper()
	rows, _ := pool.Query(context.Background(), "SELECT writer FROM "+table+" ORDER BY token")
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestFenceRefusesAfterTakeover is a holder paused past its TTL: its
// session expires, another process's call is granted and writes under
// the lock, and the paused holder, resumed, tries its write fenced with
// its grant inside its own transaction: refused with ErrLost, and nothing
// of it is committed.
func TestFenceRefusesAfterTakeover(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 0)
	table := guarded(t, pool)
	paused := newSession(t, pool, s, testTTL)
	other := newSession(t, pool, s, testTTL)
	_, _, tp := mustEnqueue(t, pool, s, "k", paused, modeExclusive, 0, 0, false)
	if err := fencedWrite(t, pool, table, paused, tp, "paused, before"); err != nil {
		t.Fatalf("fenced write of the holder: %v", err)
	}
	_, _, to := mustEnqueue(t, pool, s, "k", other, modeExclusive, 0, 0, false)

	expire(t, pool, paused) // the pause outlasts the TTL
	if _, mine, err := readKey(ctx, pool, s, "k", other); err != nil || len(mine) != 1 || !mine[0].Granted {
		t.Fatalf("the other call after the holder expired: %v %v", mine, err)
	}
	if err := fencedWrite(t, pool, table, other, to, "other"); err != nil {
		t.Fatalf("fenced write of the new holder: %v", err)
	}
	err := fencedWrite(t, pool, table, paused, tp, "paused, after")
	if !errors.Is(err, fairlock.ErrLost) {
		t.Errorf("fenced write of the paused holder after the takeover: %v, want ErrLost", err)
	}
	if got := writers(t, pool, table); len(got) != 2 || got[1] != "other" {
		t.Errorf("writes %q, want [paused, before; other]", got)
	}
}

// TestFenceHoldsUntilTransactionEnds checks that a fenced grant stays
// current until the fenced transaction ends, past its session's expiry:
// the purge skips its row, so the next call is not granted while the
// transaction is open, and is granted (and told) once it commits.
func TestFenceHoldsUntilTransactionEnds(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 0)
	n := listenTo(t, pool, s, testTTL)
	holder := newSession(t, pool, s, testTTL)
	waiter := newSession(t, pool, s, testTTL)
	_, _, th := mustEnqueue(t, pool, s, "k", holder, modeExclusive, 0, 0, false)
	w, _, _ := mustEnqueue(t, pool, s, "k", waiter, modeExclusive, 0, 0, false)

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := fence(ctx, tx, holder, th); err != nil {
		t.Fatal(err)
	}
	expire(t, pool, holder)
	for _, by := range []string{"read", "enqueue"} {
		if by == "read" {
			if _, mine, err := readKey(ctx, pool, s, "k", waiter); err != nil || len(mine) != 1 || mine[0].Granted {
				t.Fatalf("while the fenced transaction is open, the waiter: %v %v; want queued", mine, err)
			}
		} else if _, out, _ := mustEnqueue(t, pool, s, "k", waiter, modeExclusive, 0, 0, false); out != queued {
			t.Fatalf("an enqueue while the fenced transaction is open: %v, want queued", out)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, mine, err := readKey(ctx, pool, s, "k", waiter); err != nil || len(mine) != 2 || !mine[0].Granted {
		t.Fatalf("after the fenced transaction committed, the waiter: %v %v; want granted", mine, err)
	}
	n.await(t, w)
}

// TestFenceReadsTheStatementClock checks that fence judges the session
// by the clock at its statement, not the transaction's start: in a
// transaction begun while the session was alive, a fence after the
// session expired is refused. (With now() in fenceSQL instead of
// clock_timestamp(), tried, the fence passed.)
func TestFenceReadsTheStatementClock(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 0)
	sess := newSession(t, pool, s, testTTL)
	_, _, token := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
	var expiry time.Time
	err := pool.QueryRow(ctx, `UPDATE fairlock_sessions SET expires_at = clock_timestamp() + interval '200 milliseconds'
		WHERE id = $1 RETURNING expires_at`, sess).Scan(&expiry)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var start time.Time
	if err := tx.QueryRow(ctx, "SELECT now()").Scan(&start); err != nil {
		t.Fatal(err)
	}
	if !start.Before(expiry) {
		t.Fatalf("the transaction began at %v, after the expiry %v", start, expiry)
	}
	// Wait, by the server's clock, until the session has expired.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var past bool
		if err := pool.QueryRow(ctx, "SELECT clock_timestamp() > $1", expiry).Scan(&past); err != nil {
			t.Fatal(err)
		}
		if past {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server's clock did not pass the expiry")
		}
	}
	if err := fence(ctx, tx, sess, token); !errors.Is(err, fairlock.ErrLost) {
		t.Errorf("fence after the session expired, in a transaction begun before: %v, want ErrLost", err)
	}
}

// TestFenceOldSnapshot checks the documented limit: a REPEATABLE READ
// transaction whose snapshot predates the grant does not see it, and its
// fence says the grant is lost rather than pass.
func TestFenceOldSnapshot(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 0)
	sess := newSession(t, pool, s, testTTL)
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1"); err != nil { // takes the snapshot
		t.Fatal(err)
	}
	_, _, token := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
	if err := fence(ctx, tx, sess, token); !errors.Is(err, fairlock.ErrLost) {
		t.Errorf("fence in a snapshot older than the grant: %v, want ErrLost", err)
	}
}

// TestReleaseWaitsForFence checks that a release of a fenced grant waits
// until the fenced transaction ends (the grant stays current until then)
// and then removes the row, and that the wait holds no lock of the key:
// other calls on the key enqueue and release meanwhile.
func TestReleaseWaitsForFence(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 4)
	sess := newSession(t, pool, s, testTTL)
	ref, _, token := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := fence(ctx, tx, sess, token); err != nil {
		t.Fatal(err)
	}
	var txPID int32
	if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&txPID); err != nil {
		t.Fatal(err)
	}
	type result struct {
		removed, alive bool
		err            error
	}
	done := make(chan result, 1)
	go func() {
		removed, alive, err := release(ctx, pool, s, "k", ref)
		done <- result{removed, alive, err}
	}()
	// Wait until the release is blocked by the fenced transaction.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var blocked bool
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int4 = ANY (pg_blocking_pids(pid)))`, txPID).Scan(&blocked)
		if err != nil {
			t.Fatal(err)
		}
		if blocked {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the release returned while the fenced transaction was open: %+v", r)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the release never waited for the fenced transaction")
		}
	}
	// Meanwhile the key's queue is not locked.
	other, out, _ := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
	if out != queued {
		t.Errorf("an enqueue while a release waits: %v, want queued", out)
	}
	mustRelease(t, pool, s, "k", other)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-done; !r.removed || !r.alive || r.err != nil {
		t.Errorf("the release after the fenced transaction: %+v", r)
	}
}
