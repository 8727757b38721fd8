// Package keylock is the keyed-lock interface that every fairlock backend
// satisfies: the in-process lock (through InProcess and
// InProcessSemaphore), etcdlock and redislock. Code written against it
// locks the same way wherever the lock lives, and a test can swap a
// distributed lock for the in-process one.
//
// Keys are strings: a key that crosses a process is a string. The
// promises are fairlock's (strict FIFO per key in every mode, Try forms
// that never overtake, ErrReentrant instead of a self-deadlock,
// idempotent Unlock, fencing tokens that only grow per key), kept by each
// backend across every Locker it makes; package keylocktest checks them.
//
// InProcess and InProcessSemaphore make the in-process lock a backend;
// Do ("lock, run, unlock", with fn's context ending if a distributed
// grant is lost) and LockMany (several keys, all or nothing) are written
// once over the interfaces, for every backend. A failed call returns a
// nil Lease: a nil interface, never a typed nil inside one.
//
// The shape follows net.Listener (methods that return an interface, a
// concrete type behind it) and madelson/DistributedLock's provider
// interfaces.
package keylock

import (
	"context"
	"time"

	"github.com/fairlock/fairlock/owner"
)

// Lease is one grant of a key: held from the call that returned it until
// Unlock, or until the backend loses it.
type Lease interface {
	// Unlock releases the grant. It is idempotent: a second Unlock does
	// nothing and returns nil. It returns an error wrapping
	// fairlock.ErrLost if the grant was lost before Unlock released it,
	// and the backend's error (a context's, a transport's) if the release
	// could not be made; an in-process Lease's Unlock always returns nil.
	Unlock(ctx context.Context) error
	// Key returns the key the grant is for.
	Key() string
	// Token returns the grant's fencing token: larger than the token of
	// every earlier grant of the key by the same backend.
	Token() uint64
	// Lost returns a channel that is closed when the grant is lost while
	// it is held. It is nil for a backend that cannot lose a grant (a nil
	// channel never becomes ready).
	Lost() <-chan struct{}
	// Deadline returns the instant, on this process's monotonic clock,
	// before which nobody else can be granted the key even if this
	// process stops right now: for a distributed backend, the send time
	// of the last renewal its engine confirmed plus the TTL the engine
	// granted, less a margin for clock-rate drift that the backend's doc
	// names. While the grant is held it only moves forward, and the
	// backend closes Lost when it passes. It is the zero Time while an
	// in-process grant is held (such a grant cannot be lost). After
	// Unlock, or once the grant was lost, it is an instant in the past,
	// no later than the Unlock call or the loss. Valid reads it.
	Deadline() time.Time
	// HandOff makes the grant to's from now on, as fairlock's
	// Guard.HandOff: the old owner's next call on the key through the
	// same Locker waits for this grant's release instead of failing with
	// fairlock.ErrReentrant, and reentrancy checks and debug output see
	// to. It returns false, changing nothing, for a grant released or
	// lost, for owner 0, and for an owner with a call queued on the key
	// (it would wait for itself).
	HandOff(to owner.ID) bool
}

// Locker is an exclusive keyed lock.
type Locker interface {
	// Lock waits for key in FIFO order and returns its exclusive grant.
	// It fails with the context's error, fairlock.ErrReentrant,
	// fairlock.ErrClosed or the backend's error, and then returns a nil
	// Lease.
	Lock(ctx context.Context, key string) (Lease, error)
	// TryLock is Lock without waiting: it fails with
	// fairlock.ErrWouldBlock if key is held or has queued calls (also in
	// the instant after a release, before the next call has run), and
	// otherwise as Lock does.
	TryLock(ctx context.Context, key string) (Lease, error)
	// Wait takes a turn in key's queue like a Lock and returns nil,
	// holding nothing, once every grant of key held or queued before it
	// has been released; on a free key it returns at once. It fails as
	// Lock does (fairlock.ErrReentrant if the caller's owner holds key
	// through this Locker in any mode).
	Wait(ctx context.Context, key string) error
	// Close makes later calls fail with fairlock.ErrClosed, wakes queued
	// calls with it, and blocks until the Locker's grants are released
	// (nil) or ctx ends (an error wrapping the context's). It may be
	// called again: a later Close returns nil once no grant is held.
	Close(ctx context.Context) error
}

// RWLocker is a Locker with shared holds, task-fair: a reader queued
// behind a writer waits for it even while readers hold the key.
type RWLocker interface {
	Locker
	// RLock waits for key in FIFO order and returns a shared grant: it
	// is granted when every call ahead of it is a reader. It fails as
	// Lock does, with a nil Lease.
	RLock(ctx context.Context, key string) (Lease, error)
	// TryRLock is RLock without waiting: it fails with
	// fairlock.ErrWouldBlock if a writer holds key or any call is queued
	// on it.
	TryRLock(ctx context.Context, key string) (Lease, error)
}

// Semaphore is a keyed weighted semaphore: every key has the same number
// of units, granted head-of-line FIFO.
type Semaphore interface {
	// Acquire waits in FIFO order for w units of key and returns their
	// grant: it is granted when the units of every call ahead of it plus
	// w fit in the semaphore's size. Weights below 1 or above the size
	// fail at once with fairlock.ErrInvalidWeight; otherwise it fails as
	// Locker.Lock does (fairlock.ErrReentrant if the caller's owner holds
	// units of key), always with a nil Lease.
	Acquire(ctx context.Context, key string, w int64) (Lease, error)
	// TryAcquire is Acquire without waiting: it fails with
	// fairlock.ErrWouldBlock if w units are not free or a call is queued
	// on key.
	TryAcquire(ctx context.Context, key string, w int64) (Lease, error)
	// Close is Locker.Close.
	Close(ctx context.Context) error
}

// Valid reports whether l's grant is held and certain right now: its Lost
// channel is not closed, and its Deadline is zero or still ahead on this
// process's clock (after Unlock or a loss, Deadline is in the past, so
// Valid is false). It reads the clock, so it is right whenever the
// caller's goroutine runs after the process was paused (a GC pause,
// SIGSTOP, a descheduled container) past its deadline, even if no
// goroutine of the backend has run since to close Lost: call it right
// before an action that must not run unprotected, and fence the action
// itself where the store can (Token). The clock is Go's monotonic one
// (CLOCK_MONOTONIC on Linux), which does not count the time a machine
// spends suspended: after a suspend or a VM's live snapshot that stops
// the guest's clock, Valid can say true past the real deadline, and only
// fencing catches the action. This is the synchronous check redsync
// offers as Until and bsm/redislock as TTL. A nil Lease is not valid. It
// allocates nothing.
func Valid(l Lease) bool {
	if l == nil {
		return false
	}
	select {
	case <-l.Lost():
		return false
	default:
	}
	d := l.Deadline()
	return d.IsZero() || time.Now().Before(d)
}
