package redislock

import (
	"context"
	"time"
)

// Removing entries: remove removes an entry that must go now (a cancelled
// call's, a finished Wait's, an abandoned enqueue's), and the janitor
// retries the removals that failed.
//
// The janitor. An entry that must go but could not be removed at once
// (Redis unreachable, or an enqueue whose outcome is unknown) is recorded
// and its removal retried every second until it succeeds, or, for an
// enqueue whose outcome is unknown, until a grace period passes after
// which that script can no longer run. Close makes a last attempt. An
// entry the janitor has not removed yet dies with the session's marker on
// its key once nothing else of this Locker renews it.

// cleanupTimeout bounds a removal made on a detached context (a
// cancelled call's entry, Close's last removals), and how long an
// enqueueing script may go on after its call returned. A removal that
// fails is retried in the background.
const cleanupTimeout = 5 * time.Second

// remove removes a call's entry now, on the Locker's background context
// bounded by cleanupTimeout, not the call's (a cancelled call's context
// must not stop its cleanup), and hands it to the janitor if that fails
// or does not finish within the bound.
func (c *core) remove(key, member string) {
	ctx, cancel := context.WithTimeout(c.bg, cleanupTimeout)
	var err, rerr error // rerr: written by the goroutine, read only once it returned
	if c.bounded(ctx, func() { _, rerr = c.release(ctx, key, member) }) {
		err = rerr
	} else {
		err = ctx.Err()
	}
	cancel()
	if err != nil {
		if c.bg.Err() == nil {
			c.logger.Warn("redislock: could not remove an entry; retrying in the background",
				"locker", c.name, "key", key, "error", err)
		}
		c.janitorAdd(key, member, false)
	}
}

// unknownGrace is how long after an enqueue with an unknown outcome the
// janitor keeps removing its entry, in case the script runs late.
const unknownGrace = time.Minute

// janitorAdd records that member must be removed from key's queue.
func (c *core) janitorAdd(key, member string, unknown bool) {
	cl := cleanup{key: key}
	if unknown {
		cl.until = time.Now().Add(unknownGrace)
	}
	c.mu.Lock()
	c.janitor[member] = cl
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// janitorLoop retries recorded removals every second while there are
// some, until c.bg ends. It runs in its own goroutine.
func (c *core) janitorLoop() {
	defer c.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-c.kick:
		case <-t.C:
		case <-c.bg.Done():
			return
		}
		c.sweep(c.bg)
	}
}

// sweep tries every recorded removal once, until ctx ends, and returns
// the last error.
func (c *core) sweep(ctx context.Context) error {
	c.mu.Lock()
	todo := make(map[string]cleanup, len(c.janitor))
	for m, cl := range c.janitor {
		todo[m] = cl
	}
	c.mu.Unlock()
	var last error
	for member, cl := range todo {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
		_, err := c.release(rctx, cl.key, member)
		cancel()
		if err != nil {
			last = err
			continue
		}
		if cl.until.IsZero() || time.Now().After(cl.until) {
			c.mu.Lock()
			if c.janitor[member] == cl {
				delete(c.janitor, member)
			}
			c.mu.Unlock()
		}
	}
	return last
}
