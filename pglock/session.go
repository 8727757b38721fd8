package pglock

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Sessions. A Locker has one session row (fairlock_sessions) with a TTL
// and an expiry that only the server's clock judges: its calls live while
// expires_at is ahead of clock_timestamp(). The Locker renews it every
// third of the TTL; a renewal moves expires_at to the server's now plus
// the TTL, and only while the session has not expired: an expired session
// never comes back (its rows may have been purged, their grants given to
// others), and the Locker makes a new one for its next calls.
//
// On the Locker's side, a grant is certain until the send time of the
// last renewal the server confirmed (or of the session's creation) plus
// the TTL, less a margin for clock rates: the server counted from when
// it ran the statement, after the send.

// sessionInfo says who a session is, for listings.
type sessionInfo struct {
	Name string // the Locker's name
	Host string
	PID  int
}

const createSessionSQL = `INSERT INTO fairlock_sessions (prefix, name, host, pid, ttl, expires_at)
VALUES ($1, $2, $3, $4, $5::bigint * interval '1 microsecond', clock_timestamp() + $5::bigint * interval '1 microsecond')
RETURNING id`

// createSession writes a new session of s with TTL ttl (whole
// microseconds), which expires ttl after the server ran the statement,
// and returns its id (from the identity sequence: never reused). One
// round trip, one statement. Errors: the database's or the connection's
// (the session may then exist, unused, and expires).
func createSession(ctx context.Context, pool *pgxpool.Pool, s space, info sessionInfo, ttl time.Duration) (int64, error) {
	var id int64
	err := pool.QueryRow(ctx, createSessionSQL, s.prefix, text(info.Name), text(info.Host), int32(info.PID), ttl.Microseconds()).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("pglock: create session: %w", err)
	}
	return id, nil
}

const renewSQL = `WITH s AS (
    UPDATE fairlock_sessions SET expires_at = clock_timestamp() + ttl
    WHERE id = $1 AND expires_at > clock_timestamp()
    RETURNING id
)
SELECT EXISTS (SELECT 1 FROM s),
    array(SELECT q FROM unnest($2::bigint[]) q
          EXCEPT SELECT seq FROM fairlock_calls WHERE session = $1 AND seq = ANY($2::bigint[]))`

// renewSession extends session's expiry to the server's now plus its TTL
// if it has not expired, and reports whether it had not (alive), and
// which of seqs, the calls the Locker believes are written, have no row
// any more (missing: released or purged by someone else; their grants
// are lost and their queue places gone). When alive is false every call
// of the session is lost. One round trip, in a READ COMMITTED
// transaction, on a connection of pool or on the connection pool is (the
// Locker's listening connection, which no call waits for). Errors: the
// database's or the connection's; the Locker tries again (bounded by the
// time its grants are certain).
func renewSession(ctx context.Context, pool batcher, session int64, seqs []int64) (alive bool, missing []int64, err error) {
	if seqs == nil {
		seqs = []int64{}
	}
	b := newTx()
	b.Queue(renewSQL, session, seqs).QueryRow(func(row pgx.Row) error { return row.Scan(&alive, &missing) })
	if err := commit(ctx, pool, b); err != nil {
		return false, nil, fmt.Errorf("pglock: renew session: %w", err)
	}
	return alive, missing, nil
}

// endSession deletes session's row: every call of it still written is
// dead from then on, deleted by the next statement on its key that walks
// to it, or the next read of the key (walk.go). A closing
// Locker releases its calls first (so that the calls behind them are
// told at once), then ends its session. One round trip. Errors: the
// database's or the connection's; the session then expires with its
// TTL.
func endSession(ctx context.Context, pool *pgxpool.Pool, session int64) error {
	if _, err := pool.Exec(ctx, `DELETE FROM fairlock_sessions WHERE id = $1`, session); err != nil {
		return fmt.Errorf("pglock: end session: %w", err)
	}
	return nil
}
