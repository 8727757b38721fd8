package backend

import (
	"context"

	"github.com/fairlock/fairlock/keylock"
)

// The calls a user makes, written once for every backend: a backend's
// Locker embeds Locker, its Semaphore embeds Semaphore, and their methods
// are the backend's (promoted), each one Core.Acquire whose grant the
// backend's own Guard type wraps. What differs per engine (the round
// trips a call costs, what a grant's token is) is said in the backend's
// package doc and on its Guard.

// Locker is the keylock.RWLocker half of a backend's Locker: Lock,
// TryLock, RLock, TryRLock, Wait and Close. Make it with NewLocker; the
// zero Locker panics on use, naming the call.
type Locker struct {
	core *Core
	wrap func(*Call) keylock.Lease
}

// NewLocker returns the calls of a Locker on k, whose grants wrap turns
// into the backend's Lease type (its *Guard), without allocating.
func NewLocker(k *Core, wrap func(*Call) keylock.Lease) Locker {
	return Locker{core: k, wrap: wrap}
}

// Core returns the Locker's Core.
func (l *Locker) Core() *Core { return l.core }

// Lock locks key exclusively for the owner of ctx (owner.Of) and returns
// its grant. If the key is held or has queued calls, in this process or
// any other on the same prefix, Lock queues behind them and blocks until
// every call that queued before it has been granted and released, or has
// left the queue; it never overtakes.
//
// Lock returns a nil Lease and a *fairlock.LockError naming the key and
// owner, wrapping:
//   - the context's error if ctx is done before the lock is granted, even
//     when the key is free; the caller then holds nothing and its entry
//     has been removed, on a detached context bounded by a few seconds
//     (if the engine does not answer within it, the Locker goes on
//     removing it in the background);
//   - fairlock.ErrReentrant at once if the owner already holds key in any
//     mode through this Locker (checked in this process, without a round
//     trip; another Locker or process is another owner; hand a grant to
//     another flow with the Guard's HandOff, and give forked work a flow
//     of its own with owner.NewContext);
//   - fairlock.ErrClosed if the Locker is closed, or closes while Lock
//     waits;
//   - the engine's error if the write that queues the call fails.
//
// If the call's entry is lost while it waits (its session expired, or
// someone removed it), Lock queues again, at the back. An uncontended
// Lock is one round trip; a queued one is granted by the notice of the
// release that made room for it, without another.
func (l *Locker) Lock(ctx context.Context, key string) (keylock.Lease, error) {
	return l.lease(l.check("Lock").Acquire(ctx, "Lock", key, Exclusive, 1, false))
}

// TryLock locks key if nothing holds it and nothing is queued on it, in
// any process: it never overtakes a queued call, even one whose holder
// has just released. Otherwise it returns an error wrapping
// fairlock.ErrWouldBlock and writes nothing. It fails like Lock on a done
// ctx, a reentrant owner, a closed Locker or an engine error.
func (l *Locker) TryLock(ctx context.Context, key string) (keylock.Lease, error) {
	return l.lease(l.check("TryLock").Acquire(ctx, "TryLock", key, Exclusive, 1, true))
}

// RLock takes a shared hold of key: granted once every call ahead of it
// in key's queue is an RLock (or a Wait whose turn has come), whatever
// process made it. It is task-fair: a reader behind a queued Lock or Wait
// waits for it even while readers hold the key, so writers never starve;
// readers queued together behind a writer are granted together when it
// releases. It fails like Lock, with ErrReentrant for an owner that holds
// the key in any mode through this Locker (an upgrade would deadlock).
func (l *Locker) RLock(ctx context.Context, key string) (keylock.Lease, error) {
	return l.lease(l.check("RLock").Acquire(ctx, "RLock", key, Shared, 1, false))
}

// TryRLock takes a shared hold of key if it would be granted at once:
// every call on it, held or queued, in any process, is a granted reader.
// Otherwise it returns an error wrapping fairlock.ErrWouldBlock and has
// written nothing: a queued writer makes it fail even while readers hold
// the key. It fails like TryLock otherwise.
func (l *Locker) TryRLock(ctx context.Context, key string) (keylock.Lease, error) {
	return l.lease(l.check("TryRLock").Acquire(ctx, "TryRLock", key, Shared, 1, true))
}

// Wait waits for its turn on key and returns holding nothing: it queues
// like a Lock (calls that come later, readers included, queue behind it)
// and returns nil the instant every grant of the key that was held or
// queued before it has been released. At that instant its entry stops
// counting: every process judges the calls behind it as if it were gone,
// so one release frees every Wait queued directly behind it, and the call
// behind them, at once; its entry is removed in the background after it
// returns (or, where the engine announces Waits by a bound, by the
// release that frees it: redislock). A key that is free returns at once,
// with one round trip and nothing written. It fails like Lock. Wait is
// not reported to the Observer: it acquires nothing.
func (l *Locker) Wait(ctx context.Context, key string) error {
	_, err := l.check("Wait").Acquire(ctx, "Wait", key, Turn, 1, false)
	return err
}

// Close closes the Locker. Later calls fail with fairlock.ErrClosed and
// queued calls wake with it, removing their entries; Close then waits
// until every grant has been unlocked or ctx is done, stops the Locker's
// goroutines, loses the grants still held (their Lost channels close and
// their Unlock returns ErrLost) and removes what the Locker left in the
// engine, bounded by a few seconds. It returns nil, or an error wrapping
// ctx's that says how many grants were still held, or the error of a
// removal that failed; it is safe to call more than once. Core.Close has
// the details.
func (l *Locker) Close(ctx context.Context) error { return l.check("Close").Close(ctx) }

// Calls lists key's calls in every process at this instant, in grant
// order (keylock.Lister): each with the label of the flow that made it
// (owner.NewLabeledContext), its process (host, pid and the Locker's
// name), its mode or units, its token if it holds the key, and its age.
// It is one read of the engine (the backend's package doc says how the
// engine records these). It returns a *fairlock.LockError wrapping the
// context's error, ErrClosed after Close, errors.ErrUnsupported for an
// engine that cannot list, or the engine's error. A nil ctx panics.
func (l *Locker) Calls(ctx context.Context, key string) ([]keylock.CallInfo, error) {
	return l.check("Calls").Calls(ctx, key)
}

// check returns l's Core, or panics, naming op, on a Locker not made by
// its backend's New.
func (l *Locker) check(op string) *Core {
	if l == nil || l.core == nil {
		panic("fairlock: Locker." + op + " on a Locker not made by its backend's New")
	}
	return l.core
}

// lease turns a call's result into a keylock.Lease: the backend's Guard,
// or a nil interface (never a typed nil inside one) and the error.
func (l *Locker) lease(c *Call, err error) (keylock.Lease, error) {
	if err != nil || c == nil {
		return nil, err
	}
	return l.wrap(c), nil
}

// Semaphore is the keylock.Semaphore half of a backend's Semaphore:
// Acquire, TryAcquire and Close. Make it with NewSemaphore.
type Semaphore struct{ l Locker }

// NewSemaphore returns the calls of a Semaphore on k (made with a
// Config.Size), whose grants wrap turns into the backend's Lease type.
func NewSemaphore(k *Core, wrap func(*Call) keylock.Lease) Semaphore {
	return Semaphore{Locker{core: k, wrap: wrap}}
}

// Core returns the Semaphore's Core.
func (s *Semaphore) Core() *Core { return s.l.core }

// Acquire takes w units of key for the owner of ctx and returns the
// grant, whose Unlock gives them back. It queues behind every call on
// the key, in this process or any other on the prefix, and blocks until
// the units of every call ahead of it plus w fit in the semaphore's n
// (head-of-line, like golang.org/x/sync/semaphore): it never overtakes,
// even a larger request that does not fit yet. It returns an error
// wrapping fairlock.ErrInvalidWeight at once if w < 1 or w > n, or if
// key's queue holds a call of a semaphore of another size (the message
// names both sizes, and nothing is left behind); else it fails like
// Locker.Lock (ErrReentrant if the owner holds units of key through this
// Semaphore).
func (s *Semaphore) Acquire(ctx context.Context, key string, w int64) (keylock.Lease, error) {
	return s.l.lease(s.check("Acquire").Acquire(ctx, "Acquire", key, Units, w, false))
}

// TryAcquire takes w units of key if they would be granted at once: every
// call on key, in any process, is granted and their units plus w fit in
// n. Otherwise it returns an error wrapping fairlock.ErrWouldBlock and
// writes nothing. It fails like Acquire otherwise.
func (s *Semaphore) TryAcquire(ctx context.Context, key string, w int64) (keylock.Lease, error) {
	return s.l.lease(s.check("TryAcquire").Acquire(ctx, "TryAcquire", key, Units, w, true))
}

// Close closes the Semaphore as Locker.Close closes a Locker.
func (s *Semaphore) Close(ctx context.Context) error { return s.check("Close").Close(ctx) }

// Calls lists key's calls in every process at this instant, as
// Locker.Calls does, with each call's units.
func (s *Semaphore) Calls(ctx context.Context, key string) ([]keylock.CallInfo, error) {
	return s.check("Calls").Calls(ctx, key)
}

// check returns s's Core, or panics, naming op, on a Semaphore not made
// by its backend's NewSemaphore.
func (s *Semaphore) check(op string) *Core {
	if s == nil || s.l.core == nil {
		panic("fairlock: Semaphore." + op + " on a Semaphore not made by its backend's NewSemaphore")
	}
	return s.l.core
}
