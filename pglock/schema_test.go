package pglock

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// freshDB makes a new database and a role that may connect to it but
// create nothing in it (PostgreSQL 15 and later give CREATE on schema
// public to its owner only; it is revoked for older ones), and returns a
// pool of the superuser and one of the role, both on that database.
func freshDB(t *testing.T) (super, role *pgxpool.Pool, roleName string) {
	t.Helper()
	ctx := context.Background()
	srv := server(t)
	admin := srv.NewPool(t)
	n := prefixes.Add(1)
	db := pgx.Identifier{"db_" + strings.ToLower(strings.TrimPrefix(newSpace(t.Name()).channel, "fairlock_")) + "_" + itoa64(n)}.Sanitize()
	roleName = "locker_" + itoa64(n)
	for _, q := range []string{"CREATE DATABASE " + db, "CREATE ROLE " + roleName + " LOGIN"} {
		if _, err := admin.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	on := func(user string) func(*pgxpool.Config) {
		return func(c *pgxpool.Config) {
			c.ConnConfig.Database = strings.Trim(db, `"`)
			c.ConnConfig.User = user
		}
	}
	super = srv.NewPool(t, on("postgres"))
	if _, err := super.Exec(ctx, "REVOKE CREATE ON SCHEMA public FROM PUBLIC"); err != nil {
		t.Fatal(err)
	}
	return super, srv.NewPool(t, on(roleName)), roleName
}

func itoa64(n int64) string { return strconv.FormatInt(n, 10) }

// TestSchemaCreated checks that ensureSchema creates the tables in a
// database that lacks them, from many processes at once (here pools),
// and that a second run changes nothing.
func TestSchemaCreated(t *testing.T) {
	ctx := context.Background()
	super, _, _ := freshDB(t)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := ensureSchema(ctx, super); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	var logged int
	err := super.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname IN ('fairlock_sessions', 'fairlock_calls') AND relpersistence = 'p'`).Scan(&logged)
	if err != nil || logged != 2 {
		t.Errorf("%d logged tables (%v), want 2", logged, err)
	}
	if err := ensureSchema(ctx, super); err != nil {
		t.Error(err)
	}
}

// TestSchemaPrivileges checks the errors of a role that cannot create
// the tables (naming Schema and the grants) and of one that lacks
// privileges on tables that exist, and that the grants Schema's doc
// names are enough to lock, release and fence.
func TestSchemaPrivileges(t *testing.T) {
	ctx := context.Background()
	super, role, roleName := freshDB(t)
	err := ensureSchema(ctx, role)
	if err == nil {
		t.Fatal("a role without CREATE made the tables")
	}
	for _, want := range []string{"cannot create them", "permission denied", "CREATE TABLE IF NOT EXISTS fairlock_sessions", "GRANT SELECT, INSERT, UPDATE, DELETE ON fairlock_sessions, fairlock_calls"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error lacks %q:\n%v", want, err)
		}
	}
	if _, err := super.Exec(ctx, Schema); err != nil {
		t.Fatal(err)
	}
	err = ensureSchema(ctx, role)
	if err == nil || !strings.Contains(err.Error(), "lacks privileges") || !strings.Contains(err.Error(), "GRANT SELECT, INSERT, UPDATE, DELETE ON fairlock_sessions, fairlock_calls") {
		t.Errorf("a role without privileges on the tables: %v", err)
	}
	if _, err := super.Exec(ctx, "GRANT SELECT, INSERT, UPDATE, DELETE ON fairlock_sessions, fairlock_calls TO "+roleName); err != nil {
		t.Fatal(err)
	}
	if err := ensureSchema(ctx, role); err != nil {
		t.Fatalf("after the grants: %v", err)
	}
	s := newSpace(t.Name())
	sess := newSession(t, role, s, testTTL)
	ref, out, token := mustEnqueue(t, role, s, "k", sess, modeExclusive, 0, 0, false)
	if out != granted {
		t.Fatalf("enqueue: %v", out)
	}
	tx, err := role.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := fence(ctx, tx, sess, token); err != nil {
		t.Errorf("fence with the granted privileges: %v", err)
	}
	tx.Rollback(ctx)
	if !mustRelease(t, role, s, "k", ref) {
		t.Error("release found no row")
	}
	if _, _, err := readKey(ctx, role, s, "k", sess); err != nil {
		t.Error(err)
	}
	if _, err := sweep(ctx, role, s, 10); err != nil {
		t.Error(err)
	}
	if err := endSession(ctx, role, sess); err != nil {
		t.Error(err)
	}
}
