package keylock

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/fairlock/fairlock/ctxerr"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
)

// cleanupTimeout bounds an Unlock that Do or LockMany make on a context
// detached from the caller's (context.WithoutCancel): long enough for a
// distributed backend's round trips, short enough that an unreachable
// engine cannot keep the caller waiting; a grant left behind then ends
// with its backend's lease or TTL. It follows etcd's concurrency.Mutex,
// whose cleanup after a cancelled Lock runs on a context that is not
// cancelled, with a bound added.
const cleanupTimeout = 5 * time.Second

// errNilLease is the cause of the error Do and LockMany return when a lock
// call breaks the interface's contract by returning neither a Lease nor
// an error.
var errNilLease = errors.New("fairlock: the lock call returned a nil Lease and a nil error")

// Leases is the grants of several keys, as LockMany returns them: sorted
// by key. The nil Leases holds nothing.
type Leases []Lease

// Unlock releases every grant, in the reverse of the slice's order (for
// LockMany's Leases, the reverse of the order they were taken), passing
// ctx to each Lease's Unlock and going on past an error. It returns nil
// or the errors of the Unlocks that failed (one error as it is, several
// joined with errors.Join): a wrapped fairlock.ErrLost for a grant that
// was lost, a backend's error for a release that could not be made. Nil
// entries are skipped. Like Lease.Unlock it is idempotent: a second Unlock
// does nothing to the keys and returns nil, even if they have been granted
// to others since. It allocates only the errors it returns.
func (ls Leases) Unlock(ctx context.Context) error {
	var errs []error
	for i := len(ls) - 1; i >= 0; i-- {
		if ls[i] == nil {
			continue
		}
		if err := ls[i].Unlock(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 1 {
		return errs[0]
	}
	return errors.Join(errs...)
}

// Do takes key with lock, runs fn while it holds the grant, and releases
// it: the "lock, run, unlock" that every user of a lock writes, once, with
// the loss of a distributed grant handled. lock is a Locker's Lock,
// RLock, TryLock or TryRLock, a method value such as l.Lock, or a closure
// such as func(ctx context.Context, key string) (Lease, error) {
// return s.Acquire(ctx, key, 2) }.
//
// If lock fails, Do returns its error unchanged and fn does not run.
// Otherwise fn runs with the Lease (for its Token, for Valid right before
// an action that must not run unprotected, or for a backend's own fencing:
// a type assertion to etcdlock's *Guard gives IsOwner) and a context that
// ends when ctx ends or when the grant is lost (its Lease's Lost channel closes), whichever comes first;
// on a loss, context.Cause of fn's context is a *fairlock.LockError with
// Op "Do" naming the key and wrapping fairlock.ErrLost, so fn can stop
// work that is no longer protected. This is rueidislock's WithContext,
// and the lost signal that redsync users ask for (go-redsync/redsync#153).
//
// When fn returns, Do unlocks on a context that fn's cancellation does not
// reach (context.WithoutCancel of ctx, so its values stay) bounded by a
// few seconds, and returns fn's error joined with Unlock's (errors.Join);
// either alone is returned as it is, and nil if both are nil. A lost
// grant's Unlock returns an error wrapping fairlock.ErrLost, so Do's
// error wraps it too. If fn panics (or calls runtime.Goexit), Do unlocks
// the same way and the panic goes on with the same value: Do never
// recovers it, and an error from that Unlock is dropped.
//
// Costs: with a Lease whose Lost is nil (every in-process Lease), fn gets
// ctx itself and Do starts no goroutine; an in-process Lease is unlocked
// directly, with no context or timer made. With a Lost channel, Do makes
// a cancellable context and one goroutine that waits on Lost, and stops
// it before it unlocks. A nil ctx panics in lock, as in every lock call.
func Do(ctx context.Context, lock func(context.Context, string) (Lease, error), key string, fn func(context.Context, Lease) error) (err error) {
	l, err := lock(ctx, key)
	if err != nil {
		return err
	}
	if l == nil {
		return &fairlock.LockError{Op: "Do", Key: key, Owner: owner.Of(ctx), Err: errNilLease}
	}
	finished := false // fn returned: it neither panicked nor called Goexit
	stop := func() {}
	defer func() {
		stop()
		uerr := unlockDetached(ctx, l)
		if !finished || uerr == nil {
			return // a panic goes on; Unlock's error has nowhere to go
		}
		if err == nil {
			err = uerr
		} else {
			err = errors.Join(err, uerr)
		}
	}()
	fctx := ctx
	if lost := l.Lost(); lost != nil {
		fctx, stop = watchLoss(ctx, lost, key)
	}
	err = fn(fctx, l)
	finished = true
	return err
}

// watchLoss returns a context that ends with ctx, or when lost closes
// with a cause wrapping fairlock.ErrLost, and the function that stops the
// watch: it returns once the watching goroutine has exited, then cancels
// the context.
func watchLoss(ctx context.Context, lost <-chan struct{}, key string) (context.Context, func()) {
	fctx, cancel := context.WithCancelCause(ctx)
	// The caller's owner, named in the cause; not the watcher's goroutine.
	cause := &fairlock.LockError{Op: "Do", Key: key, Owner: owner.Of(ctx), Err: fairlock.ErrLost}
	select {
	case <-lost: // lost before fn starts: fn sees it at once, no goroutine
		cancel(cause)
		return fctx, func() { cancel(context.Canceled) }
	default:
	}
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-lost:
			cancel(cause)
		case <-done:
		}
	}()
	return fctx, func() {
		close(done)
		<-exited
		cancel(context.Canceled)
	}
}

// unlockDetached unlocks l on a context detached from ctx and bounded by
// cleanupTimeout. An in-process Lease needs no context: it is unlocked
// directly.
func unlockDetached(ctx context.Context, l Lease) error {
	if g, ok := l.(*guardLease); ok {
		return g.Unlock(ctx)
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return l.Unlock(uctx)
}

// LockMany locks every key in keys exclusively with l, all or nothing, and
// returns the grants sorted by key. Duplicate keys are locked once. Keys
// are taken one at a time in ascending order, each with l.Lock, so that
// two LockMany calls on the same backend never deadlock each other: the
// resource-ordering rule (Havender, 1968). Each key is waited for in
// FIFO order, as with Lock.
//
// If a Lock fails, the keys already taken are released in reverse order on
// a context detached from ctx (context.WithoutCancel) and bounded by a few
// seconds, so that an unreachable engine cannot hold LockMany forever;
// then LockMany returns a nil Leases and a *fairlock.LockError with Op
// "LockMany" naming the key that failed and wrapping Lock's cause (the
// context's error, fairlock.ErrReentrant, fairlock.ErrClosed, a backend's
// error), joined with the release's errors if any.
//
// With no keys LockMany takes nothing: it returns a nil Leases and a nil
// error, or, if ctx is already done, a *fairlock.LockError with a nil Key
// wrapping the context's error, so that a caller whose key list came out
// empty never goes on under a cancelled context. (Unlike
// fairlock.LockMany it cannot tell that l is closed without a call.) It
// allocates the sorted copy of keys and the Leases. A nil ctx panics.
func LockMany(ctx context.Context, l Locker, keys ...string) (Leases, error) {
	if ctx == nil {
		panic("fairlock: keylock.LockMany with a nil context")
	}
	if len(keys) == 0 {
		if ctx.Err() != nil {
			return nil, &fairlock.LockError{Op: "LockMany", Owner: owner.Of(ctx), Err: ctxerr.Of(ctx)}
		}
		return nil, nil
	}
	sorted := slices.Clone(keys)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	ls := make(Leases, 0, len(sorted))
	for _, k := range sorted {
		lease, err := l.Lock(ctx, k)
		if err == nil && lease == nil {
			err = errNilLease
		}
		if err != nil {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			uerr := ls.Unlock(uctx)
			cancel()
			return nil, lockManyError(ctx, k, err, uerr)
		}
		ls = append(ls, lease)
	}
	return ls, nil
}

// lockManyError is LockMany's error for a Lock of key that failed with
// err, after a release that failed with uerr (or nil). A *LockError from
// the backend is copied with its Op set to "LockMany"; any other error is
// wrapped in one.
func lockManyError(ctx context.Context, key string, err, uerr error) error {
	var e fairlock.LockError
	if le, ok := err.(*fairlock.LockError); ok {
		e = *le
		e.Op = "LockMany"
	} else {
		e = fairlock.LockError{Op: "LockMany", Key: key, Owner: owner.Of(ctx), Err: err}
	}
	if uerr != nil {
		e.Err = errors.Join(e.Err, uerr)
	}
	return &e
}
