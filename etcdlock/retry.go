package etcdlock

import (
	"context"
	"time"
)

// Retries in the background: how the Locker paces what it retries (a
// lease grant, a watch, a read of a queue, a revoke: backoff) and how
// long it gives a deletion or an enqueueing transaction that runs apart
// from its call (cleanupTimeout).

// cleanupTimeout bounds a deletion made on a detached context (a
// cancelled waiter's key, Close's revoke), and how long an enqueueing
// transaction may go on after its call returned. A deletion that
// fails is retried in the background until it succeeds or the lease
// ends.
const cleanupTimeout = 5 * time.Second

// backoff paces retries: 50 ms doubling to 1 s.
type backoff struct{ d time.Duration }

func newBackoff() *backoff { return &backoff{d: 50 * time.Millisecond} }

func (b *backoff) reset() { b.d = 50 * time.Millisecond }

// next returns the current delay and doubles it.
func (b *backoff) next() time.Duration {
	d := b.d
	b.d = min(2*b.d, time.Second)
	return d
}

// wait sleeps for the next delay; it reports false if ctx ended first.
func (b *backoff) wait(ctx context.Context) bool {
	t := time.NewTimer(b.next())
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
