package backend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fairlock/fairlock/ctxerr"
)

// Round trips apart from a call's context. A write that queues a call
// must have a known outcome, or an entry could stay behind a call that
// returned: enqueue runs it on a context that the call's cancellation
// does not reach and, if the call gives up first, lets it finish and
// undoes what it wrote. bounded waits for a round trip no longer than a
// context even where the client does not honour it (go-redis applies a
// context's deadline to a connection's reads only with
// ContextTimeoutEnabled; otherwise a server that hangs holds a call for
// the client's ReadTimeout, whatever its context).

// enqueuedResult is what a background write hands its call.
type enqueuedResult struct {
	r   Enqueued
	err error
}

// enqueue runs the engine's Enqueue for c on a context that ctx's
// cancellation does not reach, so that its outcome is always known. If
// ctx ends (or the Locker closes) first, enqueue returns the context's
// error (or ErrClosed) at once and the write finishes in the background,
// given at most CleanupTimeout more; what it wrote is then removed. A
// write that fails with an unknown outcome leaves the call's named entry
// to the janitor. Close waits for background writes.
func (k *Core) enqueue(ctx context.Context, c *Call) (Enqueued, error) {
	if err := ctx.Err(); err != nil {
		return Enqueued{}, ctxerr.Of(ctx)
	}
	var res enqueuedResult
	if ctx.Done() == nil {
		// A context that never ends: nothing to give up on, so the write
		// runs on the call's own goroutine.
		res.r, res.err = k.engine.Enqueue(ctx, c)
		return k.enqueued(ctx, c, res)
	}
	done := make(chan enqueuedResult, 1)
	abandoned := false // guarded by k.mu
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	k.mu.Lock()
	k.pending++
	k.mu.Unlock()
	k.spawn(func() {
		r, err := k.engine.Enqueue(wctx, c)
		cancel()
		k.mu.Lock()
		gone := abandoned
		var e Entry
		if gone {
			e = Entry{Key: c.key, ID: c.id, Token: r.Token}
		} else {
			done <- enqueuedResult{r, err}
		}
		k.mu.Unlock()
		if gone {
			k.undo(e, r, err)
		}
		k.mu.Lock()
		k.pending--
		k.signalIdle()
		k.mu.Unlock()
	})
	var stop error
	select {
	case res = <-done:
	case <-ctx.Done():
		stop = ctxerr.Of(ctx)
	case <-k.closing.Done():
		stop = errClosed
	}
	if stop != nil {
		k.mu.Lock()
		select {
		case res = <-done:
			e := Entry{Key: c.key, ID: c.id, Token: res.r.Token}
			k.mu.Unlock()
			k.undo(e, res.r, res.err)
		default:
			abandoned = true
			k.mu.Unlock()
			// The write is given CleanupTimeout more, then given up: its
			// outcome is then unknown, and the janitor has it.
			time.AfterFunc(CleanupTimeout, cancel)
		}
		return Enqueued{}, stop
	}
	return k.enqueued(ctx, c, res)
}

// enqueued finishes enqueue with the write's outcome: an unknown one
// leaves the call's named entry to the janitor.
func (k *Core) enqueued(ctx context.Context, c *Call, res enqueuedResult) (Enqueued, error) {
	if res.err != nil && written(res.err) {
		// Unknown outcome: the entry may have been written.
		k.mu.Lock()
		e := Entry{Key: c.key, ID: c.id}
		k.mu.Unlock()
		k.Cleanup(e, true)
		if ctx.Err() == nil && (errors.Is(res.err, context.DeadlineExceeded) || errors.Is(res.err, context.Canceled)) {
			// The write's own bound ended, not the call's context: say so
			// without wrapping a context error, which the caller (and
			// fairlock.ResultOf) would take for its own.
			res.err = fmt.Errorf("%s: no reply to the enqueueing write (%v)", k.pkg, res.err)
		}
	}
	return res.r, res.err
}

// undo removes what an abandoned write wrote.
func (k *Core) undo(e Entry, r Enqueued, err error) {
	switch {
	case err != nil && written(err):
		e.Token = 0
		k.Cleanup(e, true)
	case err == nil && !r.Free:
		k.remove(e)
	}
}
