// Package ctxerr builds the error a lock call returns when its context
// ends, for every fairlock package: the in-process lock, keylock, and the
// backends in modules of their own (etcdlock, redislock, pglock), which is
// why it is public (a module may not import another's internal packages:
// they are versioned apart). errors.Is finds both the context's sentinel
// (context.Canceled or context.DeadlineExceeded) and the cause given to
// context.WithCancelCause or WithTimeoutCause, as package context's
// Cause does since Go 1.20 (golang.org/issue/51365).
package ctxerr

import (
	"context"
	"errors"
)

// Of returns the error to report for a done ctx: ctx.Err() alone, or,
// when a cause was set with a Cause function (context.WithCancelCause,
// WithTimeoutCause, …) and differs from it, an error that wraps both, so
// that errors.Is finds context.Canceled or DeadlineExceeded and the cause.
func Of(ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return &ended{err: err, cause: cause}
	}
	return err
}

// ended is a context's error with the cause it was given.
type ended struct{ err, cause error }

func (e *ended) Error() string   { return e.err.Error() + ": " + e.cause.Error() }
func (e *ended) Unwrap() []error { return []error{e.err, e.cause} }

// How returns how the context behind err ended (context.Canceled or
// context.DeadlineExceeded) if err was made by Of with a cause, and err
// itself otherwise. A caller that classifies err by its sentinels calls it
// first, so that a cause such as another call's ErrDeadlock (errgroup
// cancels its context with the first error) does not count as this
// call's.
func How(err error) error {
	var e *ended
	if errors.As(err, &e) {
		return e.err
	}
	return err
}
