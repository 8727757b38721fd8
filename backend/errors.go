package backend

import (
	"context"
	"errors"
	"fmt"

	"github.com/fairlock/fairlock/ctxerr"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
)

// The errors the kit returns to callers, and the ones an engine returns
// to the kit to say what happened.

// ErrGone is what an engine's Refresh returns when the call's entry is no
// longer in its key's queue (someone removed it, or its session expired
// and it was purged): the call queues again, at the back.
var ErrGone = errors.New("backend: the call's entry is gone")

// lockError builds the error a call returns: a *fairlock.LockError naming
// the operation, the key and the owner. Its message renders the key
// quoted, control characters escaped, a long key cut with its size.
func lockError(op, key string, id owner.ID, err error) error {
	return &fairlock.LockError{Op: op, Key: key, Owner: id, Err: err}
}

// callError is the error a call returns for err from the engine: the
// context's (with its cause) if ctx is done, else err.
func callError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctxerr.Of(ctx)
	}
	return err
}

// invalidWeight is the error of an Acquire whose w no grant could
// satisfy.
func invalidWeight(w, n int64) error {
	return fmt.Errorf("%w (asked for %d of %d units per key)", fairlock.ErrInvalidWeight, w, n)
}

// SizeError is the error an engine returns from Enqueue when the key's
// queue belongs to a semaphore of another size (other units per key) than
// this one's n: the sizes are never counted together, so a key is never
// granted beyond either. The engine must have written nothing, or removed
// what it wrote, before it returns it.
func SizeError(n, other int64) error {
	return unwritten{fmt.Errorf("%w (this Semaphore has %d units per key, and a call on the key came from one of %d: every Semaphore on the prefix must have the same size)",
		fairlock.ErrInvalidWeight, n, other)}
}

// Unwritten wraps an error of Enqueue that is known to have written
// nothing (the engine refused the request, or it was never sent): the kit
// then has nothing to clean up. Any other error of Enqueue leaves the
// outcome unknown, and the kit removes the call's entry, by the id it was
// named with (Call.Name), should it show up. fairlock.ErrWouldBlock and
// the context's error before anything was sent count as unwritten too.
func Unwritten(err error) error {
	if err == nil {
		return nil
	}
	return unwritten{err}
}

type unwritten struct{ error }

func (u unwritten) Unwrap() error { return u.error }

// written reports whether an error of Enqueue may have left an entry.
func written(err error) bool {
	var u unwritten
	return !errors.As(err, &u) && !errors.Is(err, fairlock.ErrWouldBlock)
}

// Final wraps an error of Refresh after which waiting is pointless (the
// engine's client was closed, say): the call fails with it at once
// instead of retrying.
func Final(err error) error { return final{err} }

type final struct{ error }

func (f final) Unwrap() error { return f.error }

func isFinal(err error) bool {
	var f final
	return errors.As(err, &f)
}

// lostError is Unlock's error for a grant that was lost and whose release
// also failed: it wraps ErrLost and the failure, and errors.Is finds
// either.
func lostError(err error) error {
	return fmt.Errorf("%w; removing its entry failed: %w", fairlock.ErrLost, err)
}

// CallError is the error of a backend's own call on key that failed with
// err (Locked, say): a *fairlock.LockError naming op, the key and the
// owner of ctx, wrapping the context's error (with its cause) if ctx is
// done, else err.
func CallError(ctx context.Context, op, key string, err error) error {
	return lockError(op, key, owner.Of(ctx), callError(ctx, err))
}

// errLost is what Unlock wraps for a grant lost before it was released.
var errLost = fairlock.ErrLost
