package etcdlock

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The janitor. A key that must go but could not be deleted at once (etcd
// unreachable, or a write whose outcome is unknown) is recorded and its
// deletion retried every second until it succeeds, or, for a write whose
// outcome is unknown, until a grace period passes after which the write
// can no longer be applied. Close makes a last attempt and then revokes
// the lease, which deletes whatever is left; if etcd is unreachable even
// then, the lease expires within its TTL since nobody renews it.

// janitor is what a Locker keeps for its janitor.
type janitor struct {
	keys map[string]cleanup // guarded by Locker.mu: etcd key → how to delete it
	kick chan struct{}      // cap 1: wakes janitorLoop
}

// cleanup is a key the janitor deletes.
type cleanup struct {
	rev   int64     // delete only if its creation revision is rev; 0: whatever it is
	until time.Time // keep deleting until then (a write that may still land); zero: once
}

// unknownGrace is how long after a write with an unknown outcome the
// janitor keeps deleting its key, in case the write is applied late.
const unknownGrace = time.Minute

// janitorAdd records that name must be deleted (if its creation revision
// is rev, or whatever it is for rev 0) and wakes the janitor.
func (l *Locker) janitorAdd(name string, rev int64) {
	c := cleanup{rev: rev}
	if rev == 0 {
		c.until = time.Now().Add(unknownGrace)
	}
	l.mu.Lock()
	l.janitor.keys[name] = c
	l.mu.Unlock()
	select {
	case l.janitor.kick <- struct{}{}:
	default:
	}
}

// janitorLoop retries recorded deletions every second while there are
// some, until l.bg ends. It runs in its own goroutine.
func (l *Locker) janitorLoop() {
	defer l.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-l.janitor.kick:
		case <-t.C:
		case <-l.bg.Done():
			return
		}
		l.sweep(l.bg)
	}
}

// sweep tries every recorded deletion once, until ctx ends: Close's
// stopping of the janitor ends a sweep in progress, and its own last
// sweep shares one bound with the lease's revoke.
func (l *Locker) sweep(ctx context.Context) {
	l.mu.Lock()
	todo := make(map[string]cleanup, len(l.janitor.keys))
	for k, c := range l.janitor.keys {
		todo[k] = c
	}
	l.mu.Unlock()
	for name, c := range todo {
		if ctx.Err() != nil {
			return
		}
		if err := l.deleteKey(ctx, name, c.rev); err != nil {
			continue
		}
		if c.until.IsZero() || time.Now().After(c.until) {
			l.mu.Lock()
			if l.janitor.keys[name] == c {
				delete(l.janitor.keys, name)
			}
			l.mu.Unlock()
		}
	}
}

// deleteKey deletes name if its creation revision is rev (any, for rev
// 0), bounded by ctx and by cleanupTimeout. A key that is already gone is
// not an error.
func (l *Locker) deleteKey(ctx context.Context, name string, rev int64) error {
	dctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
	defer cancel()
	cmp := clientv3.Compare(clientv3.CreateRevision(name), "=", rev)
	if rev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(name), ">", 0)
	}
	_, err := l.client.Txn(dctx).If(cmp).Then(clientv3.OpDelete(name)).Commit()
	return err
}

// remove deletes a call's key now, on the Locker's background context,
// not the call's (a cancelled call's context must not stop its cleanup:
// the failure mode of etcd-io/etcd#18082), and hands it to the janitor if
// that fails. Close ends the background context once calls have ended;
// its revoke and last sweep then take over.
func (l *Locker) remove(name string, rev int64) {
	if err := l.deleteKey(l.bg, name, rev); err != nil {
		if l.bg.Err() == nil {
			l.logger.Warn("etcdlock: could not delete a key; retrying in the background",
				"locker", l.name, "key", logName(name), "error", err)
		}
		l.janitorAdd(name, rev)
	}
}
