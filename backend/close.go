package backend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fairlock/fairlock/ctxerr"
)

// Close closes the Locker. Later calls return ErrClosed, and queued calls
// wake with ErrClosed, removing their entries. Close then waits until
// every grant has been unlocked or ctx is done. Then it stops the
// Locker's goroutines and the engine's (Engine.Shutdown, which ends its
// sessions), loses the grants still held (their Lost channels close and
// their Unlock returns ErrLost), and removes what is left of the
// Locker's entries, with a last try at removals that failed earlier: all
// bounded by CleanupTimeout on a context of its own. When Close returns,
// the Locker has nothing in the engine, or, if the engine could not be
// reached, only entries that die with its sessions' TTL. It unregisters
// the Locker from the debug registry and its Observer.
//
// Close returns nil, or an error wrapping ctx's error that says how many
// grants were still held, or the error of a removal or of the engine's
// shutdown that failed. It is safe to call more than once and
// concurrently; a later call waits for the first to finish and returns
// nil, or an error wrapping its own ctx's error if that ends first. A
// nil ctx means context.Background.
func (k *Core) Close(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	k.mu.Lock()
	first := k.closing.Err() == nil
	if first {
		k.beginClose()
	}
	k.mu.Unlock()
	if !first {
		select {
		case <-k.closed:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("%s: Close: %w", k.pkg, ctxerr.Of(ctx))
		}
	}
	defer close(k.closed)

	// Queued calls see closing, remove their entries and return.
	var errs []error
	if grants := k.waitIdle(ctx); grants > 0 {
		noun := "grants"
		if grants == 1 {
			noun = "grant"
		}
		errs = append(errs, fmt.Errorf("%s: Close: %d %s still held, now lost: %w", k.pkg, grants, noun, ctxerr.Of(ctx)))
	}
	k.stopBg()
	k.wg.Wait()

	k.mu.Lock()
	now := time.Now()
	left := make([]Entry, 0, len(k.ids))
	for _, c := range k.ids {
		k.loseLocked(c, now)
		left = append(left, c.entry())
	}
	for _, s := range k.sessions {
		s.ended = true
	}
	k.mu.Unlock()
	end, cancel := context.WithTimeout(context.Background(), CleanupTimeout)
	defer cancel()
	remaining, err := k.engine.Shutdown(end, left)
	if err != nil {
		errs = append(errs, fmt.Errorf("%s: Close: %w", k.pkg, err))
	}
	for _, e := range remaining {
		k.Cleanup(e, false)
	}
	if _, err := k.sweep(end, true); err != nil {
		errs = append(errs, fmt.Errorf("%s: Close: remove entries: %w", k.pkg, err))
	}
	if k.unreg != nil {
		k.unreg()
	}
	k.reportLost()
	if k.obs != nil {
		// No report is in flight once obsGone is set: the observer hears
		// nothing after Unregister.
		k.obsMu.Lock()
		k.obsGone = true
		k.obsMu.Unlock()
		k.obs.Unregister()
	}
	return errors.Join(errs...)
}

// waitIdle waits until no call is in progress, no grant is held and no
// write is pending, or ctx is done. Calls and pending writes end on their
// own in bounded time once closing has ended, so it waits for them even
// past ctx; it returns how many grants were still held.
func (k *Core) waitIdle(ctx context.Context) int {
	done, expired := ctx.Done(), false
	for {
		k.mu.Lock()
		calls, grants, pending := k.calls, k.grants, k.pending
		k.mu.Unlock()
		if calls == 0 && pending == 0 && (grants == 0 || expired) {
			return grants
		}
		select {
		case <-k.idle:
		case <-done:
			// Stop waiting for holders; keep waiting for calls.
			done, expired = nil, true
		}
	}
}
