package pglock

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Schema is the SQL that creates the two tables pglock keeps its state
// in, in the first schema of the connection's search_path, if they are
// missing. New runs it when they are missing; a role that may not create
// them (it needs CREATE on that schema) fails there with an error that
// quotes this and names the privileges. To set the database up once as
// another role, run Schema as a role with CREATE, then grant the roles
// that lock
//
//	GRANT SELECT, INSERT, UPDATE, DELETE ON fairlock_sessions, fairlock_calls TO role;
//
// (UPDATE on fairlock_calls is for the row locks of the grant walk and of
// Guard.Fence: PostgreSQL asks for it of SELECT … FOR SHARE and FOR
// UPDATE; pglock never updates a call's row).
//
// The tables are logged, as they must be: an UNLOGGED table is emptied by
// a crash and its identity sequence starts over, so tokens would go back
// and grants would vanish. Every Locker and Semaphore, whatever its
// prefix, shares them.
//
//   - fairlock_sessions: one row per Locker (a session), with its TTL and
//     its expiry by the server's clock, renewed while the Locker is open;
//     its name, host and pid say who holds a key. A call whose session
//     has expired (clock_timestamp() past expires_at) or whose session
//     row is gone is dead.
//   - fairlock_calls: one row per call queued or holding, under its
//     Locker's prefix and its key (both bytea, so a key is any Go
//     string); its id, from the table's identity sequence, is both its
//     place in the key's queue and its fencing token. The session and
//     the session's call number (seq) name it for the Locker that made
//     it; mode is x (exclusive), r (shared), u (units of a semaphore of
//     size units) or w (a Wait), and label is the caller's owner label.
const Schema = `CREATE TABLE IF NOT EXISTS fairlock_sessions (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    prefix     bytea NOT NULL,
    name       text NOT NULL,
    host       text NOT NULL,
    pid        integer NOT NULL,
    ttl        interval NOT NULL,
    expires_at timestamptz NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS fairlock_calls (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    prefix     bytea NOT NULL,
    key        bytea NOT NULL,
    session    bigint NOT NULL,
    seq        bigint NOT NULL,
    mode       text NOT NULL CHECK (mode IN ('x', 'r', 'u', 'w')),
    weight     bigint NOT NULL,
    size       bigint NOT NULL,
    label      text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    UNIQUE (session, seq)
);
CREATE INDEX IF NOT EXISTS fairlock_calls_queue ON fairlock_calls (prefix, key, id);
`

// lockClass is the first half of every advisory lock pglock takes (the
// two-int4 form, pg_advisory_xact_lock(int4, int4), whose locks never
// meet the one-bigint form's): a constant, "fLk1" in ASCII. The second
// half is 0 for the schema's creation and a key's hash (keyLock) for a
// key's queue. An application that takes two-int4 advisory locks with
// this first half would only wait on pglock, and pglock on it.
const lockClass = 0x664c6b31

// tablesSQL reports whether both tables exist, and whether this role has
// the privileges pglock needs on them.
const tablesSQL = `SELECT to_regclass('fairlock_sessions') IS NOT NULL AND to_regclass('fairlock_calls') IS NOT NULL,
    current_schema(), current_user`

const privilegesSQL = `SELECT has_table_privilege('fairlock_sessions', 'SELECT, INSERT, UPDATE, DELETE')
    AND has_table_privilege('fairlock_calls', 'SELECT, INSERT, UPDATE, DELETE')`

// ensureSchema makes sure the tables exist and this role may use them.
// If both exist it checks the privileges (one round trip, two if that
// check fails); else it runs Schema in a transaction that holds the
// advisory lock (lockClass, 0), so that processes starting together do
// not race on the catalog (CREATE TABLE IF NOT EXISTS is not safe against
// itself), and checks again. It returns an error naming Schema and the
// grants when the tables are missing and cannot be created or this role
// lacks a privilege on them, and the database's error otherwise.
func ensureSchema(ctx context.Context, pool *pgxpool.Pool) error {
	var exists bool
	var schema, role *string // NULL when the search_path names no existing schema
	if err := pool.QueryRow(ctx, tablesSQL).Scan(&exists, &schema, &role); err != nil {
		return fmt.Errorf("pglock: look for tables fairlock_sessions and fairlock_calls: %w", err)
	}
	where, who := "the search_path's first schema (none exists)", "this role"
	if schema != nil {
		where = "schema " + *schema
	}
	if role != nil {
		who = "role " + *role
	}
	if !exists {
		_, err := pool.Exec(ctx, "BEGIN; SELECT pg_advisory_xact_lock("+strconv.Itoa(lockClass)+", 0);\n"+Schema+"COMMIT;")
		if err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && (pe.Code == "42501" || pe.Code == "3F000") { // insufficient_privilege, invalid_schema_name
				return fmt.Errorf("pglock: tables fairlock_sessions and fairlock_calls are missing from %s, and %s cannot create them: %w; "+
					"run pglock.Schema as a role with CREATE on the schema:\n%s\nthen GRANT SELECT, INSERT, UPDATE, DELETE ON fairlock_sessions, fairlock_calls TO the roles that lock",
					where, who, err, Schema)
			}
			return fmt.Errorf("pglock: create tables fairlock_sessions and fairlock_calls in %s (pglock.Schema): %w", where, err)
		}
	}
	var ok bool
	if err := pool.QueryRow(ctx, privilegesSQL).Scan(&ok); err != nil {
		return fmt.Errorf("pglock: check privileges on fairlock_sessions and fairlock_calls: %w", err)
	}
	if !ok {
		return fmt.Errorf("pglock: %s lacks privileges on tables fairlock_sessions and fairlock_calls in %s: "+
			"GRANT SELECT, INSERT, UPDATE, DELETE ON fairlock_sessions, fairlock_calls TO it", who, where)
	}
	return nil
}
