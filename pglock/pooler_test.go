package pglock

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestPoolerInTransactionMode checks, through a real PgBouncer in front
// of the server, that a listener refuses transaction pooling (where
// LISTEN cannot work) with an error naming it, while the other
// statements work there, and that everything works through session
// pooling, a hand-off heard included.
func TestPoolerInTransactionMode(t *testing.T) {
	ctx := context.Background()
	srv := server(t)
	defer func(d time.Duration) { probeTimeout = d }(probeTimeout)
	probeTimeout = time.Second // what it waits out below, when no notice comes
	for _, mode := range []string{"transaction", "session"} {
		cfg, err := pgxpool.ParseConfig(srv.StartPgBouncer(t, mode))
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec // PgBouncer 1.18 keeps no prepared statements
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		if err := ensureSchema(ctx, pool); err != nil {
			t.Fatal(err)
		}
		conn, err := dialListener(ctx, pool, "fairlock_pooler_"+mode)
		if mode == "transaction" {
			var nn *errNoNotices
			if !errors.As(err, &nn) || !strings.Contains(err.Error(), "PgBouncer's pool_mode=transaction") {
				t.Errorf("LISTEN through transaction pooling: %v, want errNoNotices naming it", err)
			}
			if conn != nil {
				closeConn(conn)
			}
			// Every other statement is one transaction, and works there.
			s := newSpace(t.Name() + "/" + mode + "#" + itoa64(prefixes.Add(1)))
			sess := newSession(t, pool, s, testTTL)
			holder, out1, token := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
			waiter, out2, _ := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
			if out1 != granted || out2 != queued {
				t.Errorf("through transaction pooling: enqueues %v, %v", out1, out2)
			}
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := fence(ctx, tx, sess, token); err != nil {
				t.Errorf("fence through transaction pooling: %v", err)
			}
			tx.Rollback(ctx)
			mustRelease(t, pool, s, "k", holder)
			if _, mine, err := readKey(ctx, pool, s, "k", sess); err != nil || len(mine) != 1 || mine[0].Seq != waiter.Seq || !mine[0].Granted {
				t.Errorf("through transaction pooling: read %v, %v", mine, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("LISTEN through session pooling: %v", err)
		}
		closeConn(conn)
		s := newSpace(t.Name() + "/" + mode + "#" + itoa64(prefixes.Add(1)))
		n := listenTo(t, pool, s, testTTL)
		sess := newSession(t, pool, s, testTTL)
		holder, _, _ := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
		waiter, _, _ := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
		mustRelease(t, pool, s, "k", holder)
		n.await(t, waiter)
		mustRelease(t, pool, s, "k", waiter)
	}
}
