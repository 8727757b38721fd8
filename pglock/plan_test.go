package pglock

import (
	"context"
	"encoding/hex"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestStatementsReadOnlyTheirRows checks the plans of a release, a
// releaseAll and an enqueue on a key with 3000 calls queued, among 30000
// keys of two calls each (tables of the test's own, analyzed), as a
// pooled connection runs them once its prepared statements have settled
// on a plan (generic plans, forced and chosen by PostgreSQL's default
// after the first executions): no node of them may read through the
// key's queue to find the rows it wants (a scan that discards more than
// 100 rows). A generic plan cannot know that a key is long; a statement
// that asked for the key's rows beside their ids read all 3000 to delete
// one.
func TestStatementsReadOnlyTheirRows(t *testing.T) {
	for _, mode := range []string{"force_generic_plan", "auto"} {
		t.Run(mode, func(t *testing.T) { statementPlans(t, mode) })
	}
}

// statementPlans is TestStatementsReadOnlyTheirRows with plan_cache_mode
// mode.
func statementPlans(t *testing.T, mode string) {
	ctx := context.Background()
	pool, s := setup(t, 0)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	c := conn.Conn()
	schema := "plans" + strconv.FormatInt(prefixes.Add(1), 10)
	for _, q := range []string{"CREATE SCHEMA " + schema, "SET search_path = " + schema, Schema} {
		if _, err := c.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	defer c.Exec(ctx, "RESET search_path; RESET plan_cache_mode; DROP SCHEMA "+schema+" CASCADE")
	var sess int64
	if err := c.QueryRow(ctx, `INSERT INTO fairlock_sessions (prefix, name, host, pid, ttl, expires_at)
		VALUES ($1, 'plans', 'testhost', 1, '1 minute', clock_timestamp() + interval '1 hour') RETURNING id`, s.prefix).Scan(&sess); err != nil {
		t.Fatal(err)
	}
	// The calls 1 to 3000 on "k" (1 holds it), two on each other key.
	if _, err := c.Exec(ctx, `INSERT INTO fairlock_calls (prefix, key, session, seq, mode, weight, size, label)
		SELECT $1, convert_to(CASE WHEN g <= 3000 THEN 'k' ELSE 'o' || (g % 30000) END, 'UTF8'), $2, g, 'x', 0, 0, ''
		FROM generate_series(1, 63000) g`, s.prefix, sess); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, "ANALYZE fairlock_calls; ANALYZE fairlock_sessions; SET plan_cache_mode = "+mode); err != nil {
		t.Fatal(err)
	}
	prefix, key, session := "'\\x"+hex.EncodeToString(s.prefix)+"'::bytea", "'\\x"+hex.EncodeToString([]byte("k"))+"'::bytea", strconv.FormatInt(sess, 10)
	channel := "'" + s.channel + "'"
	discards := regexp.MustCompile(`Rows Removed by Filter: (\d+)`)
	for _, st := range []struct{ name, sql, args string }{
		{"release", releaseSQL, strings.Join([]string{prefix, key, channel, session, "1"}, ", ")},
		{"releaseAll", releaseAllSQL, strings.Join([]string{prefix, key, channel, "ARRAY[" + session + ", " + session + "]::bigint[]", "ARRAY[1, 2]::bigint[]"}, ", ")},
		{"enqueue", enqueueSQL, strings.Join([]string{prefix, key, channel, session, "999999", "'x'", "0", "0", "''", "false"}, ", ")},
	} {
		if _, err := c.Exec(ctx, "PREPARE "+st.name+" AS "+st.sql); err != nil {
			t.Fatal(err)
		}
		exec := "EXECUTE " + st.name + "(" + st.args + ")"
		// Six runs, rolled back: the plan cache chooses after five.
		for range 6 {
			tx, err := c.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, exec, pgx.QueryExecModeSimpleProtocol); err != nil {
				t.Fatal(err)
			}
			tx.Rollback(ctx)
		}
		tx, err := c.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+exec, pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		tx.Rollback(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range plan {
			if m := discards.FindStringSubmatch(line); m != nil {
				if n, _ := strconv.Atoi(m[1]); n > 100 {
					t.Errorf("%s reads rows it does not want (%s):\n%s", st.name, strings.TrimSpace(line), strings.Join(plan, "\n"))
					break
				}
			}
		}
	}
}
