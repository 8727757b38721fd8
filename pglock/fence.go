package pglock

import (
	"context"
	"errors"
	"fmt"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/jackc/pgx/v5"
)

// fenceSQL finds a granted call's row if its session is alive by the
// clock at this statement (clock_timestamp(), not now(), which is the
// transaction's start and would let a long transaction fence with a
// session that expired since), and locks it FOR SHARE until the
// transaction ends. $1 the token (the row's id), $2 its session.
const fenceSQL = `SELECT c.id FROM fairlock_calls c
WHERE c.id = $1 AND c.session = $2
  AND EXISTS (SELECT 1 FROM fairlock_sessions s WHERE s.id = c.session AND s.expires_at > clock_timestamp())
FOR SHARE OF c`

// fence checks, inside the caller's transaction tx on the database of the
// Locker's pool, that the grant whose row has id token and session
// session is current, and keeps it current until tx ends: it returns nil
// only if the row exists and its session has not expired by the clock at
// the statement, and then holds the row FOR SHARE. While tx holds it, no
// release deletes the row (a release waits for tx) and no purge does
// (purges skip locked rows), even past the session's expiry, so no other
// call on the key is granted before tx commits or rolls back: a write
// that tx commits was made under the lock. A long fenced transaction
// therefore delays a takeover after a holder died.
//
// The caller must have been granted the call (a row is granted for as
// long as it exists, once it was). tx should be READ COMMITTED, or begun
// after the grant: an older REPEATABLE READ or SERIALIZABLE snapshot does
// not show the row, and fence then says the grant is lost.
//
// One round trip on tx's connection; it may wait while a purge or a
// release holds the row, and then reports the row gone. Errors: an error
// wrapping fairlock.ErrLost if the grant is not current; the database's
// or the connection's otherwise (tx is then aborted, as after any failed
// statement).
func fence(ctx context.Context, tx pgx.Tx, session, token int64) error {
	var id int64
	err := tx.QueryRow(ctx, fenceSQL, token, session).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("pglock: fence token %d: the grant is no longer current: %w", token, fairlock.ErrLost)
	}
	if err != nil {
		return fmt.Errorf("pglock: fence token %d: %w", token, err)
	}
	return nil
}
