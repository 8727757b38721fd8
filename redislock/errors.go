package redislock

import (
	"context"
	"errors"
	"fmt"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/redislock/internal/ctxerr"
)

// The errors the package returns, and how an Observer classifies them.

// ErrLost is the error, wrapped in a *fairlock.LockError with Op "Unlock",
// that Guard.Unlock returns for a grant that was lost before it was
// unlocked: its session expired on the server, its entry was removed by
// someone else, or the Locker could not renew the session for about a TTL
// (see Guard.Lost). Another process may have held the key since: anything
// written under the grant must be checked with its fencing token. It is
// fairlock.ErrLost, the sentinel every backend wraps.
var ErrLost = fairlock.ErrLost

var errClosed = fairlock.ErrClosed

// lockError builds the error a call returns: a *fairlock.LockError naming
// the operation, the key and the owner.
func lockError(op, key string, id owner.ID, err error) error {
	return &fairlock.LockError{Op: op, Key: key, Owner: id, Err: err}
}

// invalidWeight is the error of an Acquire whose w no grant could satisfy,
// or whose semaphore size differs from the one its key's queue was made
// with.
func invalidWeight(w, n, other int64) error {
	if other != 0 {
		return fmt.Errorf("%w (this semaphore has %d units per key; the key's queue holds calls of a semaphore of %d)", fairlock.ErrInvalidWeight, n, other)
	}
	return fmt.Errorf("%w (asked for %d; the semaphore has %d units per key)", fairlock.ErrInvalidWeight, w, n)
}

// callError is the error a call returns for err from Redis: the context's
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
		// context.Canceled, and errors from Redis (unreachable, …).
		return fairlock.Canceled
	}
}
