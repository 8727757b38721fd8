package pglock

import (
	"context"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/keylock"
)

// The Locker's and Semaphore's calls on keys (Lock, TryLock, RLock,
// TryRLock, Wait, Acquire, TryAcquire): each is one backend.Core.Acquire,
// which writes the call's row (engine.go) and waits for the grant.
// The grant's release is Unlock, in guard.go.

// Lock locks key for the owner of ctx (owner.Of) and returns the Guard
// that unlocks it. If the key is held or has queued calls, in this
// process or any other on the same prefix, Lock queues behind them and
// blocks until every call that queued before it has been granted and
// released, or has left the queue; it never overtakes.
//
// Lock returns a nil Lease and an error (a *fairlock.LockError naming the
// key and owner) wrapping:
//   - the context's error if ctx is done before the lock is granted, even
//     when the key is free; the caller then holds nothing and its row
//     has been deleted, on a detached context bounded by 5 s (if the
//     database does not answer within it, the call returns and the row
//     is deleted in the background: see Guard.Unlock);
//   - fairlock.ErrReentrant at once if the owner already holds key through
//     this Locker (checked locally, without a round trip; another Locker or
//     process is another owner);
//   - fairlock.ErrClosed if the Locker is closed, or closes while Lock
//     waits;
//   - the database's error if the round trip that writes the call's
//     row fails (it is sent again, a few times, when the connection
//     fails: the write is idempotent per call).
//
// If the call's row is lost while it waits (its session expired, or
// someone deleted it), Lock queues again, at the back, under the
// Locker's next session. An
// uncontended Lock is one round trip; a queued one is granted by the
// notice of the release that made it the head, without another.
func (l *Locker) Lock(ctx context.Context, key string) (keylock.Lease, error) {
	return lease(l.k.Acquire(ctx, "Lock", key, backend.Exclusive, 1, false))
}

// TryLock locks key if nothing holds it and nothing is queued on it, in
// any process: it never overtakes a queued call, even one whose holder
// has just released. Otherwise it returns an error wrapping
// fairlock.ErrWouldBlock and writes nothing. It fails like Lock on a done
// ctx, a reentrant owner, a closed Locker or a database error. It is one
// round trip.
func (l *Locker) TryLock(ctx context.Context, key string) (keylock.Lease, error) {
	return lease(l.k.Acquire(ctx, "TryLock", key, backend.Exclusive, 1, true))
}

// RLock takes a shared hold of key: granted once every call ahead of it
// in key's queue is an RLock, whatever process made it (task-fair: a
// reader behind a queued Lock waits for it). It fails like Lock.
func (l *Locker) RLock(ctx context.Context, key string) (keylock.Lease, error) {
	return lease(l.k.Acquire(ctx, "RLock", key, backend.Shared, 1, false))
}

// TryRLock takes a shared hold of key if it would be granted at once:
// every call in key's queue is a granted RLock. Otherwise it returns an
// error wrapping fairlock.ErrWouldBlock and writes nothing. It fails like
// TryLock.
func (l *Locker) TryRLock(ctx context.Context, key string) (keylock.Lease, error) {
	return lease(l.k.Acquire(ctx, "TryRLock", key, backend.Shared, 1, true))
}

// Wait waits for its turn on key and returns holding nothing: it queues
// like a Lock (calls that come later queue behind it) and returns nil
// once every grant of the key that was held or queued before it has been
// released. At that instant its row stops counting (the grant rule
// judges the calls behind it as if it were gone), so one release frees
// every Wait queued directly behind it, and the call behind them, in one
// notice; its row is deleted in the background after it returns. A key
// that is free returns at once, with one round trip and nothing written.
// It fails like Lock. Wait is not reported to the Observer.
func (l *Locker) Wait(ctx context.Context, key string) error {
	_, err := l.k.Acquire(ctx, "Wait", key, backend.Turn, 1, false)
	return err
}

// Acquire takes w units of key, head-of-line FIFO: granted once the units
// of every call ahead of it in key's queue plus w fit in the semaphore's
// n; a large call at the head blocks smaller ones behind it. It returns
// an error wrapping fairlock.ErrInvalidWeight at once if w < 1 or w > n,
// or if key's queue holds a call of a semaphore of another size; else it
// fails like Locker.Lock (ErrReentrant if the owner holds units of key
// through this Semaphore).
func (s *Semaphore) Acquire(ctx context.Context, key string, w int64) (keylock.Lease, error) {
	return lease(s.k.Acquire(ctx, "Acquire", key, backend.Units, w, false))
}

// TryAcquire takes w units of key if they would be granted at once: every
// call in key's queue is granted and their units plus w fit. Otherwise it
// returns an error wrapping fairlock.ErrWouldBlock and writes nothing. It
// fails like Acquire.
func (s *Semaphore) TryAcquire(ctx context.Context, key string, w int64) (keylock.Lease, error) {
	return lease(s.k.Acquire(ctx, "TryAcquire", key, backend.Units, w, true))
}

// lease turns a call's result into a keylock.Lease: a nil interface on
// failure, never a typed nil inside one.
func lease(c *backend.Call, err error) (keylock.Lease, error) {
	if err != nil || c == nil {
		return nil, err
	}
	return (*Guard)(c), nil
}
