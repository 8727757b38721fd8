package etcdlock

import (
	"context"
	"errors"

	"github.com/fairlock/fairlock/etcdlock/internal/ctxerr"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
)

// Errors: the error values the package returns or passes between its
// parts, and how a call's error is built (lockError, callError) and
// classified for an Observer (resultOf).

// ErrLost is the error, wrapped in a *fairlock.LockError with Op "Unlock",
// that Guard.Unlock returns for a grant that was lost before it was
// unlocked: its lease expired or was revoked, its key was deleted by
// someone else, or the Locker could not renew the lease for a TTL (see
// Guard.Lost). Another process may have held the key since; anything
// written under the grant must be checked with its fencing token.
var ErrLost = fairlock.ErrLost

// errClosed is what a call on a closed Locker fails with, before it is
// wrapped by lockError.
var errClosed = fairlock.ErrClosed

// lockError builds the error a call returns: a *fairlock.LockError naming
// the operation, the key and the owner. Its message renders the key
// quoted, control characters escaped.
func lockError(op, key string, id owner.ID, err error) error {
	return &fairlock.LockError{Op: op, Key: key, Owner: id, Err: err}
}

// callError is the error a call returns for err from etcd: the context's
// (with its cause) if ctx is done, else err.
func callError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctxerr.Of(ctx)
	}
	return err
}

// resultOf classifies a call's error for an Observer. A call that ended
// with its context is Canceled or DeadlineExceeded whatever the context's
// cause.
func resultOf(err error) fairlock.Result {
	err = ctxerr.How(err)
	switch {
	case err == nil:
		return fairlock.Acquired
	case errors.Is(err, fairlock.ErrReentrant):
		return fairlock.Reentrant
	case errors.Is(err, fairlock.ErrWouldBlock):
		return fairlock.WouldBlock
	case errors.Is(err, fairlock.ErrClosed):
		return fairlock.Closed
	case errors.Is(err, fairlock.ErrInvalidWeight):
		return fairlock.InvalidWeight
	case errors.Is(err, context.DeadlineExceeded):
		return fairlock.DeadlineExceeded
	default:
		// context.Canceled, and errors from etcd (unreachable, …): the
		// call ended without a grant for a reason outside the lock.
		return fairlock.Canceled
	}
}
