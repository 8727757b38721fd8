package backend

import (
	"context"
	"time"
)

// Removing entries: remove takes out an entry that must go now (a
// cancelled call's, a finished Turn's, an abandoned write's), and the
// janitor retries the removals that failed.
//
// The janitor. An entry that must go but could not be removed at once
// (the engine unreachable, or a write whose outcome is unknown) is
// recorded and its removal retried every second until it succeeds, or,
// for a write whose outcome is unknown, until a grace period passes after
// which that write can no longer be applied. Close makes a last attempt.
// An entry the janitor has not removed yet dies with its session once
// nothing renews it.

// CleanupTimeout bounds a removal made on a detached context (a
// cancelled call's entry, Close's last removals), and how long a write
// may go on after its call returned.
const CleanupTimeout = 5 * time.Second

// unknownGrace is how long after a write with an unknown outcome the
// janitor keeps removing its entry, in case the write is applied late.
const unknownGrace = time.Minute

// turnRemovalDelay is how long the janitor leaves the entry of a Turn
// that EndTurnLocked ended before it removes it. A Turn's entry only
// keeps the Turn's place until its turn comes; after that the engine's
// grant rule reads it as transparent (the calls behind it are granted as
// if it were gone), so nothing waits for its removal. One release often
// frees many Turns at once, in this Locker and in others; removals made as
// they return would be writes whose notices (etcd's watch events) reach
// every Locker while those Lockers are still waking the Turns the same
// release freed, and would delay the last of them. Left for a moment,
// they go after the burst, in one batch per key (BatchRemover).
const turnRemovalDelay = 20 * time.Millisecond

// Cleanup records that e must be removed and wakes the janitor; unknown
// says the write of e has an unknown outcome, so its removal is repeated
// for a grace period in case the write lands late. Engines call it for
// what they cannot remove themselves.
func (k *Core) Cleanup(e Entry, unknown bool) {
	if e.ID == "" {
		return
	}
	cl := cleanup{entry: e}
	if unknown {
		cl.until = time.Now().Add(unknownGrace)
	}
	k.mu.Lock()
	k.janitor[e.ID] = cl
	k.mu.Unlock()
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// cleanupTurnLocked records the entry of a Turn that has finished for the
// janitor, to be removed after turnRemovalDelay, and wakes the janitor to
// time it. k.mu is held.
func (k *Core) cleanupTurnLocked(e Entry) {
	if e.ID == "" {
		return
	}
	k.janitor[e.ID] = cleanup{entry: e, after: time.Now().Add(turnRemovalDelay)}
	select {
	case k.kick <- struct{}{}:
	default:
	}
}

// remove removes e now, on the Locker's background context bounded by
// CleanupTimeout, not a call's (a cancelled call's context must not stop
// its cleanup: the failure mode of etcd-io/etcd#18082), and hands it to
// the janitor if that fails or does not finish within the bound.
func (k *Core) remove(e Entry) {
	ctx, cancel := context.WithTimeout(k.bg, CleanupTimeout)
	var err, rerr error // rerr: written by the goroutine, read only once it returned
	if k.bounded(ctx, func() { rerr = k.engine.Remove(ctx, e) }) {
		err = rerr
	} else {
		err = ctx.Err()
	}
	cancel()
	if err != nil {
		if k.bg.Err() == nil {
			k.logger.Warn(k.pkg+": could not remove an entry; retrying in the background",
				"locker", k.name, "key", LogKey(e.Key), "error", err)
		}
		k.Cleanup(e, false)
	}
}

// janitorLoop retries recorded removals every second while there are
// some, makes each deferred one when it is due, until the background
// context ends.
func (k *Core) janitorLoop() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	later := time.NewTimer(time.Hour)
	later.Stop()
	defer later.Stop()
	for {
		select {
		case <-k.kick:
		case <-t.C:
		case <-later.C:
		case <-k.bg.Done():
			return
		}
		next, _ := k.sweep(k.bg, false)
		if !next.IsZero() {
			later.Reset(time.Until(next))
		}
	}
}

// sweep tries every recorded removal once, until ctx ends, and returns
// the time the first removal it deferred is due (zero if none) and the
// last error. With all it defers none.
func (k *Core) sweep(ctx context.Context, all bool) (time.Time, error) {
	k.mu.Lock()
	todo := make(map[string][]cleanup)
	now := time.Now()
	var next time.Time
	for _, cl := range k.janitor {
		if !all && cl.after.After(now) {
			if next.IsZero() || cl.after.Before(next) {
				next = cl.after
			}
			continue
		}
		todo[cl.entry.Key] = append(todo[cl.entry.Key], cl)
	}
	k.mu.Unlock()
	batch, _ := k.engine.(BatchRemover)
	var last error
	for key, cls := range todo {
		if ctx.Err() != nil {
			return next, ctx.Err()
		}
		rctx, cancel := context.WithTimeout(ctx, CleanupTimeout)
		var done []cleanup
		if batch != nil && len(cls) > 1 {
			es := make([]Entry, len(cls))
			for i, cl := range cls {
				es[i] = cl.entry
			}
			if err := batch.RemoveAll(rctx, key, es); err != nil {
				last = err
			} else {
				done = cls
			}
		} else {
			for _, cl := range cls {
				if err := k.engine.Remove(rctx, cl.entry); err != nil {
					last = err
					continue
				}
				done = append(done, cl)
			}
		}
		cancel()
		now := time.Now()
		k.mu.Lock()
		for _, cl := range done {
			if (cl.until.IsZero() || now.After(cl.until)) && k.janitor[cl.entry.ID] == cl {
				delete(k.janitor, cl.entry.ID)
			}
		}
		k.mu.Unlock()
	}
	return next, last
}
