package pgtest_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock/pglock/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStart checks that Start's pool reaches a server that runs queries
// and writes, as the superuser.
func TestStart(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Start(t)
	var super bool
	if err := pool.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super); err != nil {
		t.Fatal(err)
	}
	if !super {
		t.Error("Start's pool does not connect as a superuser")
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE t (v int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
}

// TestRestartKeepsCommitted checks that every Shutdown mode, Kill
// included, keeps each committed row across Restart, that the server
// answers on the same port afterwards, and that a sequence never goes
// back (what pglock's tokens rely on).
func TestRestartKeepsCommitted(t *testing.T) {
	ctx := context.Background()
	s := pgtest.StartServer(t)
	pool := s.NewPool(t)
	if _, err := pool.Exec(ctx, "CREATE TABLE t (id bigint GENERATED ALWAYS AS IDENTITY, mode text)"); err != nil {
		t.Fatal(err)
	}
	var last int64
	for _, how := range []pgtest.Shutdown{pgtest.Fast, pgtest.Immediate, pgtest.Kill} {
		if err := pool.QueryRow(ctx, "INSERT INTO t (mode) VALUES ($1) RETURNING id", how.String()).Scan(&last); err != nil {
			t.Fatalf("before %v: %v", how, err)
		}
		port, pid := s.Port(), s.PID()
		if err := s.Restart(how); err != nil {
			t.Fatal(err)
		}
		if s.Port() != port || s.PID() == pid || s.PID() == 0 {
			t.Fatalf("after %v restart: port %d (was %d), pid %d (was %d)", how, s.Port(), port, s.PID(), pid)
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("after %v restart: the old postmaster %d still exists (kill 0: %v)", how, pid, err)
		}
		var n int
		var modes []string
		err := retry(ctx, func() error {
			return pool.QueryRow(ctx, "SELECT count(*), array_agg(mode ORDER BY id) FROM t").Scan(&n, &modes)
		})
		if err != nil {
			t.Fatalf("after %v restart: %v", how, err)
		}
		if n != int(how)+1 {
			t.Errorf("after %v restart: %d rows %v, want %d", how, n, modes, int(how)+1)
		}
		var next int64
		if err := pool.QueryRow(ctx, "INSERT INTO t (mode) VALUES ('probe') RETURNING id").Scan(&next); err != nil {
			t.Fatal(err)
		}
		if next <= last {
			t.Errorf("after %v restart: the identity sequence gave %d after %d", how, next, last)
		}
		if _, err := pool.Exec(ctx, "DELETE FROM t WHERE mode = 'probe'"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStopStart checks that a stopped server refuses connections and
// that Start brings it back with its data.
func TestStopStart(t *testing.T) {
	ctx := context.Background()
	s := pgtest.StartServer(t)
	pool := s.NewPool(t, func(c *pgxpool.Config) { c.MaxConns = 2 })
	if pool.Config().MaxConns != 2 {
		t.Errorf("NewPool's configure did not apply: MaxConns %d", pool.Config().MaxConns)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE kept (v int)"); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(pgtest.Fast); err != nil {
		t.Fatal(err)
	}
	if s.PID() != 0 {
		t.Errorf("PID %d after Stop", s.PID())
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := pool.Exec(short, "SELECT 1"); err == nil {
		t.Error("a query succeeded on a stopped server")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := retry(ctx, func() error { _, err := pool.Exec(ctx, "SELECT * FROM kept"); return err }); err != nil {
		t.Fatalf("after Start: %v", err)
	}
}

// TestCleanupLeavesNothing checks that a test's cleanup ends every
// process of its server, in each state it may be left in: running,
// killed, and stopped.
func TestCleanupLeavesNothing(t *testing.T) {
	for _, how := range []string{"running", "killed", "stopped"} {
		var pid int
		t.Run(how, func(t *testing.T) {
			s := pgtest.StartServer(t)
			pid = s.PID()
			pool := s.NewPool(t)
			if _, err := pool.Exec(context.Background(), "SELECT 1"); err != nil {
				t.Fatal(err)
			}
			switch how {
			case "killed":
				if err := s.Stop(pgtest.Kill); err != nil {
					t.Fatal(err)
				}
			case "stopped":
				if err := s.Stop(pgtest.Immediate); err != nil {
					t.Fatal(err)
				}
			}
		})
		if pid == 0 {
			t.Fatal("no postmaster pid")
		}
		// Every process of the server is in the postmaster's process
		// group; those killed may be zombies until their new parent
		// reaps them.
		deadline := time.Now().Add(5 * time.Second)
		for !pgtest.GroupGone(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: a process of the server's group %d is left after cleanup", how, pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// retry runs f until it succeeds or 10 s pass: the first queries after a
// restart may meet connections the restart broke.
func retry(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestPgBouncer checks that a PgBouncer started in front of a server
// passes queries through in each pool mode.
func TestPgBouncer(t *testing.T) {
	ctx := context.Background()
	s := pgtest.StartServer(t)
	for _, mode := range []string{"session", "transaction"} {
		url := s.StartPgBouncer(t, mode)
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = pool.QueryRow(ctx, "SELECT $1::text", mode).Scan(&got)
		pool.Close()
		if err != nil || got != mode {
			t.Errorf("%s: %q, %v", mode, got, err)
		}
	}
}
