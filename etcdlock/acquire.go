package etcdlock

import (
	"context"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/keylock"
)

// The calls that ask for a key (Lock, TryLock, RLock, TryRLock, Wait;
// the Semaphore's are in semaphore.go): each is one backend.Core.Acquire,
// which runs the enqueueing transaction (engine.go) and waits for the
// grant. The grant's release is Unlock, in guard.go.

// Lock locks key exclusively for the owner of ctx (owner.Of) and returns
// its grant, a *Guard (see Guard for IsOwner). If the key is held or has queued calls, in this
// process or any other on the same prefix, Lock queues behind them and
// blocks until every call that queued before it has been granted and
// released, or has left the queue; it never overtakes. Its place in the
// queue is its key's creation revision in etcd.
//
// Lock returns an error (a *fairlock.LockError naming the key and owner)
// wrapping:
//   - the context's error if ctx is done before the lock is granted, even
//     when the key is free; the caller then holds nothing and its key has
//     been deleted (on a detached context: see Guard.Unlock);
//   - fairlock.ErrReentrant at once if the owner already holds key through
//     this Locker (checked locally, without a round trip; another Locker or
//     process is another owner);
//   - fairlock.ErrClosed if the Locker is closed, or closes while Lock
//     waits;
//   - etcd's error if the enqueueing transaction fails (etcd unreachable
//     until ctx's end, for instance).
//
// If the call's key is lost while it waits (its lease expired or was
// revoked, or someone deleted it), Lock queues again, at the back, under
// the Locker's next lease. An uncontended Lock is one round trip (a
// transaction that writes the call's key and reads the keys ahead of it);
// a waiter is granted without another round trip when it knew every key
// ahead (at most eight), else with one read when the nearest are gone.
// A call that fails returns a nil Lease (a nil interface).
func (l *Locker) Lock(ctx context.Context, key string) (keylock.Lease, error) {
	return asLease(l.k.Acquire(ctx, "Lock", key, backend.Exclusive, 1, false))
}

// TryLock locks key if nothing holds it and nothing is queued on it, in
// any process: it never overtakes a queued call, even one whose holder
// has just released. Otherwise it returns an error wrapping
// fairlock.ErrWouldBlock, and it wrote nothing. It also fails like Lock
// on a done ctx, a reentrant owner, a closed Locker, or an etcd error. It
// is one round trip: a transaction that writes the call's key only if the
// key's range is empty. While the Locker's watch is restarting (after an
// outage or a compaction) a TryLock whose write succeeded waits, as Lock
// does, until the watch is live again, ctx ends or the Locker closes: a
// grant is handed out only once the loss of its key can be seen.
func (l *Locker) TryLock(ctx context.Context, key string) (keylock.Lease, error) {
	return asLease(l.k.Acquire(ctx, "TryLock", key, backend.Exclusive, 1, true))
}

// RLock locks key shared for the owner of ctx and returns its grant, a
// *Guard: any number of readers, in any processes, hold a key together.
// It is task-fair, like fairlock's RLock: a reader is granted when every
// call ahead of it in the key's queue is a reader, so a reader behind a
// queued Lock (or Wait) waits for it even while readers hold the key,
// and writers never starve. Readers queued together behind a writer are
// granted together when it releases.
//
// It fails like Lock, with ErrReentrant for an owner that holds the key
// in any mode through this Locker (an upgrade would deadlock). Its key's
// name marks it shared (see keys.go), which is how every process tells
// readers from writers; a reader reads every key ahead of it, not only
// the nearest eight, in the same one round trip, and is granted without
// another once the writers ahead are gone.
func (l *Locker) RLock(ctx context.Context, key string) (keylock.Lease, error) {
	return asLease(l.k.Acquire(ctx, "RLock", key, backend.Shared, 1, false))
}

// TryRLock locks key shared if every call on it, held or queued, in any
// process, is a reader; otherwise it returns an error wrapping
// fairlock.ErrWouldBlock and has written nothing. It never overtakes: a
// queued writer makes it fail even while readers hold the key. On a free
// key it is one round trip; beside readers, two: a transaction that
// writes only if the key's range is empty returns the range, and a second
// writes only if no call has joined it since (retried with the new range
// if one has, up to eight ranges, then ErrWouldBlock: a key that calls
// keep joining is busy). Otherwise it fails like RLock.
func (l *Locker) TryRLock(ctx context.Context, key string) (keylock.Lease, error) {
	return asLease(l.k.Acquire(ctx, "TryRLock", key, backend.Shared, 1, true))
}

// asLease returns a call's result as a keylock.Lease: nil (a nil interface,
// never a typed nil inside one) with an error.
func asLease(c *backend.Call, err error) (keylock.Lease, error) {
	if err != nil || c == nil {
		return nil, err
	}
	return (*Guard)(c), nil
}

// Wait waits for its turn on key and returns holding nothing: it queues
// like a Lock (calls that come later queue behind it) and returns nil the
// instant every grant of the key that was held or queued before it has
// been released. Its key's name marks it a Wait (keys.go), so at that
// instant every process judges the calls behind it as if it were gone:
// one deletion frees every Wait queued directly behind it, and the call
// behind them, at once; its own key is deleted in the background after it
// returns. A key that is free returns at once, with one round trip and nothing
// written. It fails like Lock: on a done ctx, if the owner holds key
// (ErrReentrant), on a closed Locker, on an etcd error. Wait is not
// reported to the Observer: it acquires nothing.
func (l *Locker) Wait(ctx context.Context, key string) error {
	_, err := l.k.Acquire(ctx, "Wait", key, backend.Turn, 1, false)
	return err
}
