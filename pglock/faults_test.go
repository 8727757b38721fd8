package pglock

import (
	"context"
	"testing"
	"time"

	"github.com/fairlock/fairlock/pglock/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// retry runs f until it succeeds or 20 s pass: the first statements after
// a restart meet connections the restart broke.
func retry(t testing.TB, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRestartKeepsGrantsAndTokens restarts the server in each shutdown
// mode (a fast shutdown, an immediate one, a kill of every server
// process) while a call holds a key and another waits, and checks that
// both rows survive (a crash loses no exclusion: the waiter is not
// granted, and a new call queues behind them), that the tokens given
// after it are larger than every token given before (the identity
// sequence never goes back), and that the listener reconnects and hears
// the hand-off.
func TestRestartKeepsGrantsAndTokens(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.StartServer(t)
	pool := srv.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 4 })
	if err := ensureSchema(ctx, pool); err != nil {
		t.Fatal(err)
	}
	s := newSpace(t.Name())
	n := listenTo(t, pool, s, 200*time.Millisecond)
	sess := newSession(t, pool, s, testTTL)
	var last int64
	for _, how := range []pgtest.Shutdown{pgtest.Fast, pgtest.Immediate, pgtest.Kill} {
		// Uncontended grants, more than a sequence logs ahead (32).
		for range 40 {
			ref, out, token := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
			if out != granted || token <= last {
				t.Fatalf("before %v: %v token %d after %d", how, out, token, last)
			}
			last = token
			mustRelease(t, pool, s, "k", ref)
		}
		holder, _, th := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
		waiter, _, tw := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
		last = tw
		ups := n.ups.Load()

		if err := srv.Restart(how); err != nil {
			t.Fatal(err)
		}
		var mine []callState
		retry(t, "read after "+how.String(), func() (err error) {
			_, mine, err = readKey(ctx, pool, s, "k", sess)
			return err
		})
		if len(mine) != 2 || mine[0].Token != th || !mine[0].Granted || mine[1].Token != tw || mine[1].Granted {
			t.Fatalf("after %v: the session's calls %+v, want %d granted and %d queued", how, mine, th, tw)
		}
		ref := callRef{Session: sess, Seq: seqs.Add(1)}
		var out enqueued
		var token int64
		retry(t, "enqueue after "+how.String(), func() (err error) {
			out, token, _, err = enqueue(ctx, pool, s, "k", call{ref: ref, mode: modeExclusive}, false)
			return err
		})
		if out != queued || token <= last {
			t.Errorf("after %v: a new call %v with token %d (the last before: %d), want queued and larger", how, out, token, last)
		}
		last = token
		// The listener is back once it has reconnected (up), and hears
		// the hand-off.
		for deadline := time.Now().Add(20 * time.Second); n.ups.Load() == ups; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after %v: the listener did not reconnect", how)
			}
		}
		n.take()
		mustRelease(t, pool, s, "k", holder)
		n.await(t, waiter)
		mustRelease(t, pool, s, "k", waiter)
		n.await(t, ref)
		mustRelease(t, pool, s, "k", ref)
	}
}

// TestListenerReconnects terminates the listening connection's server
// process (pg_terminate_backend, as an administrator or a failover
// would) and checks that the listener reports it, reconnects, says so,
// and hears the notices sent after.
func TestListenerReconnects(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 0)
	n := listenTo(t, pool, s, testTTL)
	sess := newSession(t, pool, s, testTTL)
	for round := range 3 {
		ups := n.ups.Load()
		var killed int
		err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name = $1 AND query LIKE 'LISTEN%'`, t.Name()).Scan(&killed)
		if err != nil || killed != 1 {
			t.Fatalf("round %d: terminated %d listening backends (%v), want 1", round, killed, err)
		}
		select {
		case err := <-n.errs:
			t.Logf("round %d: the listener reported: %v", round, err)
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: the listener reported no error", round)
		}
		for deadline := time.Now().Add(20 * time.Second); n.ups.Load() == ups; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the listener did not reconnect", round)
			}
		}
		holder, _, _ := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
		waiter, _, _ := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
		mustRelease(t, pool, s, "k", holder)
		n.await(t, waiter)
		mustRelease(t, pool, s, "k", waiter)
	}
}
