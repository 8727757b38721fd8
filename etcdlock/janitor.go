package etcdlock

import (
	"context"
	"log/slog"
	"sync"
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

// janitor deletes a Locker's keys: at once (remove), else in the
// background (add, loop). New sets the fields that come from the Locker;
// they do not change after.
type janitor struct {
	mu     *sync.Mutex // the Locker's mu: guards keys
	client *clientv3.Client
	bg     context.Context // the Locker's background context: ends the loop
	wg     *sync.WaitGroup // the Locker's background goroutines
	logger *slog.Logger
	name   string // the Locker's name, for the log

	keys map[string]cleanup // guarded by mu: etcd key → how to delete it
	kick chan struct{}      // cap 1: wakes loop
}

// cleanup is a key the janitor deletes.
type cleanup struct {
	rev   int64     // delete only if its creation revision is rev; 0: whatever it is
	until time.Time // keep deleting until then (a write that may still land); zero: once
}

// unknownGrace is how long after a write with an unknown outcome the
// janitor keeps deleting its key, in case the write is applied late.
const unknownGrace = time.Minute

// add records that name must be deleted (if its creation revision is
// rev, or whatever it is for rev 0) and wakes the janitor.
func (j *janitor) add(name string, rev int64) {
	c := cleanup{rev: rev}
	if rev == 0 {
		c.until = time.Now().Add(unknownGrace)
	}
	j.mu.Lock()
	j.keys[name] = c
	j.mu.Unlock()
	select {
	case j.kick <- struct{}{}:
	default:
	}
}

// loop retries recorded deletions every second while there are some,
// until j.bg ends. It runs in its own goroutine.
func (j *janitor) loop() {
	defer j.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-j.kick:
		case <-t.C:
		case <-j.bg.Done():
			return
		}
		j.sweep(j.bg)
	}
}

// sweep tries every recorded deletion once, until ctx ends: Close's
// stopping of the janitor ends a sweep in progress, and its own last
// sweep shares one bound with the lease's revoke.
func (j *janitor) sweep(ctx context.Context) {
	j.mu.Lock()
	todo := make(map[string]cleanup, len(j.keys))
	for k, c := range j.keys {
		todo[k] = c
	}
	j.mu.Unlock()
	for name, c := range todo {
		if ctx.Err() != nil {
			return
		}
		if err := j.deleteKey(ctx, name, c.rev); err != nil {
			continue
		}
		if c.until.IsZero() || time.Now().After(c.until) {
			j.mu.Lock()
			if j.keys[name] == c {
				delete(j.keys, name)
			}
			j.mu.Unlock()
		}
	}
}

// deleteKey deletes name if its creation revision is rev (any, for rev
// 0), bounded by ctx and by cleanupTimeout. A key that is already gone is
// not an error.
func (j *janitor) deleteKey(ctx context.Context, name string, rev int64) error {
	dctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
	defer cancel()
	cmp := clientv3.Compare(clientv3.CreateRevision(name), "=", rev)
	if rev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(name), ">", 0)
	}
	_, err := j.client.Txn(dctx).If(cmp).Then(clientv3.OpDelete(name)).Commit()
	return err
}

// remove deletes a call's key now, on the Locker's background context,
// not the call's (a cancelled call's context must not stop its cleanup:
// the failure mode of etcd-io/etcd#18082), and hands it to the janitor if
// that fails. Close ends the background context once calls have ended;
// its revoke and last sweep then take over.
func (j *janitor) remove(name string, rev int64) {
	if err := j.deleteKey(j.bg, name, rev); err != nil {
		if j.bg.Err() == nil {
			j.logger.Warn("etcdlock: could not delete a key; retrying in the background",
				"locker", j.name, "key", logName(name), "error", err)
		}
		j.add(name, rev)
	}
}
