package pglock

import (
	"context"
	"errors"

	"github.com/fairlock/fairlock/backend"
	"github.com/jackc/pgx/v5/pgconn"
)

// Round trips that fail. A statement that PostgreSQL refused (an ERROR:
// its transaction rolled back) wrote nothing, nor did one that was never
// sent (no connection could be made or acquired). Any other failure (the
// connection broke after the statement was sent: a restart, a
// pg_terminate_backend, a pooled connection the server had already
// closed) leaves the outcome unknown. pglock's enqueue, release and read
// may run again for the same call, so a failure of the second kind is
// retried a few times, at once and then after a short backoff, before the
// Locker gives the call an unknown outcome to clean up.

// tries bounds the attempts of one round trip.
const tries = 5

// serverRefused reports whether err is PostgreSQL's ERROR for a statement:
// its transaction rolled back. (A FATAL one ends the connection, perhaps
// after a COMMIT the client never heard of.)
func serverRefused(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Severity == "ERROR"
}

// sentNothing reports whether err happened before anything was sent.
func sentNothing(err error) bool {
	var ce *pgconn.ConnectError
	return pgconn.SafeToRetry(err) || errors.As(err, &ce)
}

// retried runs fn, which makes one round trip that may be repeated, until
// it succeeds, PostgreSQL refuses it (or enqueue finds its session
// expired), ctx ends, or tries attempts have failed. It returns fn's last error, and whether an attempt before it
// may have been applied (its outcome is unknown).
func retried(ctx context.Context, fn func() error) (doubt bool, err error) {
	b := backend.NewBackoff()
	for try := 1; ; try++ {
		err = fn()
		if err == nil || serverRefused(err) || errors.Is(err, errSessionExpired) || ctx.Err() != nil || try == tries {
			return doubt, err
		}
		if !sentNothing(err) {
			doubt = true
		}
		if try > 1 && !b.Wait(ctx) {
			return doubt, err
		}
	}
}

// unwritten reports whether the round trips that retried ran and that
// ended with err (not nil) wrote nothing.
func unwritten(doubt bool, err error) bool {
	return !doubt && (serverRefused(err) || sentNothing(err))
}
