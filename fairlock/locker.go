// Package fairlock provides Locker, a fair, strict-FIFO keyed mutex with
// shared holds, and Semaphore, a keyed weighted semaphore with the same
// order.
//
// Calls on the same key are granted in the order in which they arrived;
// calls on different keys never wait on each other. A flow that asks for a
// key it already holds gets ErrReentrant instead of deadlocking itself,
// and with WithDeadlockDetection a call that would close a wait-for cycle
// between flows gets ErrDeadlock. Every grant carries a fencing token
// (Guard.Token) that grows with each grant of its key.
//
// # Owners
//
// Each call has an owner, owner.Of(ctx): the flow token carried by ctx
// (owner.NewContext), or else the calling goroutine. Reentrancy and
// deadlock detection are per owner. Unlock is not: a Guard may be unlocked
// from any goroutine. A Guard handed to another goroutine to unlock is
// handed over with Guard.HandOff, so that the first owner's next call on
// the key waits for it instead of returning ErrReentrant.
//
// # Memory model
//
// For a key k, the n'th Unlock of k synchronizes before the return of
// every call granted k after that Unlock (for exclusive holds, as for
// sync.Mutex: the n'th Unlock before the m'th successful Lock, n < m), and
// before the return of a Wait whose turn came after it.
//
// # Costs
//
// An uncontended Lock, RLock or Acquire and its Unlock, on a key whose
// shard (WithShards) holds nothing else, take no mutex: a few atomic
// operations. Any other call takes the key's shard mutex, held only for
// bookkeeping; it is the only wait of Unlock, the Try forms, Locked and
// Waiters. With debug and observer off, a grant allocates nothing, and a
// call that waits allocates nothing once warm, except: a key's state when
// its shard has no recycled one (a shard keeps 16), a returned error,
// WithDeadlockDetection's check of a call about to wait, and WithStacks'
// stack of every call. Memory is held only for keys in use; beyond them,
// each shard keeps the last key it granted without the mutex (a pointer
// key's object stays reachable) until the shard is next used, Len or
// Close runs, or the Locker is dropped. docs/design.md has the mechanism.
package fairlock

import "context"

// Locker is a fair, strict-FIFO keyed mutex with shared holds. Make one
// with New; the zero Locker is not usable. A Locker must not be copied
// after first use. All methods are safe for concurrent use.
//
// A key is held by one exclusive holder (Lock) or by any number of shared
// holders (RLock). Grants follow arrival order whatever the mode
// ("task-fair"): when the head of a key's queue can be granted it is,
// together with every waiter directly behind it that can be granted beside
// it, up to the first that cannot. Nobody overtakes: a reader that arrives
// behind a queued writer waits, even while readers hold the key, so
// writers never starve.
type Locker[K comparable] struct {
	t table[K] // first: a Locker and its table share one allocation
}

// New returns an open Locker for keys of type K. It allocates the shards
// (WithShards) and, with WithLongHeld, starts one watchdog goroutine.
// Keys are hashed with hash/maphash.Comparable: K must not be, or
// contain, an interface holding an uncomparable value, or calls panic as
// a map would.
//
// Close a Locker when done with it: Close wakes its waiters and stops its
// watchdog. A Locker with debug or an observer that is dropped without
// Close leaves the debug registry and its Observer, and stops its
// watchdog, some time after it becomes unreachable (runtime.AddCleanup).
func New[K comparable](opts ...Option) *Locker[K] {
	l := new(Locker[K])
	l.t.init(lockerKind, lockerUnits, opts)
	return l
}

// Lock locks key exclusively for the owner of ctx (owner.Of) and returns
// the Guard that unlocks it. If the key is held, or others queued for it
// before, Lock blocks until every call that queued on the key before it
// has been granted and released, then takes the key directly from the
// previous holders; it never overtakes an earlier waiter.
//
// Lock returns an error wrapping:
//   - the context's error if ctx is done before the lock is granted, even
//     when the key is free, or ends while Lock waits for the shard mutex;
//     the caller then holds nothing;
//   - ErrReentrant at once if the owner holds key in any mode;
//   - ErrClosed if the Locker is closed, or closes while Lock waits;
//   - ErrDeadlock (also a *DeadlockError) with WithDeadlockDetection, at
//     once, if waiting would close a wait-for cycle;
//   - ErrInvalidKey at once if key is not equal to itself (it is or holds
//     a NaN).
//
// The returned error is a *LockError naming the key and owner; building
// it allocates. A granted Lock allocates nothing but what Costs in the
// package doc lists, and takes no mutex on a key whose shard holds
// nothing else. A nil ctx panics, as in every call that asks for a key;
// Close takes nil as context.Background.
func (l *Locker[K]) Lock(ctx context.Context, key K) (Guard[K], error) {
	s, tag := l.t.shardOf(key)
	return l.t.acquire(ctx, "Lock", s, key, tag, lockerUnits, askBlock)
}

// TryLock locks key exclusively for the owner of ctx if it can do so at
// once: the key is neither held nor awaited. It never blocks (beyond the
// shard mutex) and never overtakes a queued waiter.
//
// TryLock returns an error wrapping the context's error if ctx is already
// done, ErrReentrant if the owner holds key in any mode, ErrWouldBlock if
// someone else holds it or waits for it, ErrClosed if the Locker is
// closed, and ErrInvalidKey if key is not equal to itself (a NaN). It
// allocates nothing on success; a refusal allocates its error, the
// *LockError and the key boxed in it (two objects), so a caller that
// polls TryLock in a loop pays that per refused try.
func (l *Locker[K]) TryLock(ctx context.Context, key K) (Guard[K], error) {
	s, tag := l.t.shardOf(key)
	return l.t.acquire(ctx, "TryLock", s, key, tag, lockerUnits, askTry)
}

// RLock locks key shared for the owner of ctx: any number of RLock
// holders may hold a key together, but never beside a Lock holder. It
// returns the Guard that releases this hold.
//
// RLock is granted at once if the key is free or held shared and nobody
// is queued; otherwise it queues, and is granted, in arrival order, when
// every call queued before it has been granted and every exclusive holder
// before it has released. A reader behind a queued Lock therefore waits
// even while other readers hold the key (no writer starvation), and
// readers queued together behind a writer are granted together when it
// unlocks.
//
// RLock returns the same errors as Lock, for the same reasons: ErrReentrant
// if the owner already holds key in any mode (a second shared hold by the
// same flow would deadlock behind a queued writer, and an upgrade would
// deadlock against another reader's), the context's error, ErrClosed,
// ErrDeadlock and ErrInvalidKey. Its costs are Lock's: an uncontended
// RLock and its Unlock take the lock-free path where Lock would.
func (l *Locker[K]) RLock(ctx context.Context, key K) (Guard[K], error) {
	s, tag := l.t.shardOf(key)
	return l.t.acquire(ctx, "RLock", s, key, tag, 1, askBlock)
}

// TryRLock locks key shared for the owner of ctx if it can do so at once:
// nobody holds the key exclusively and nobody is queued for it (a reader
// never overtakes a queued writer). It never blocks beyond the shard
// mutex. It returns TryLock's errors: ErrWouldBlock if an exclusive holder
// or any waiter is in the way, ErrReentrant, ErrClosed, ErrInvalidKey or
// the context's error.
func (l *Locker[K]) TryRLock(ctx context.Context, key K) (Guard[K], error) {
	s, tag := l.t.shardOf(key)
	return l.t.acquire(ctx, "TryRLock", s, key, tag, 1, askTry)
}

// Wait takes a zero-length exclusive turn in key's queue: it queues like a
// Lock (calls that arrive after it, readers included, queue behind it, as
// behind a Lock) and returns, holding nothing, the instant its turn comes:
// once every grant of the key that was held or queued before it has been
// released. The calls behind it proceed at that same instant. On a free
// key Wait returns at once. It is for callers that must let the work
// already under way finish before they go on, without taking the key
// (AsyncKeyedLock's and RedisKit's wait-for-unlock).
//
// Wait returns nil when its turn came, or an error wrapping the context's
// error (ctx done before the turn; ctx done while the turn came still
// returns nil), ErrReentrant at once if the owner holds key in any mode
// (it would wait for itself), ErrClosed, ErrDeadlock with
// WithDeadlockDetection, or ErrInvalidKey; the error is a *LockError with
// Op "Wait". Waiters counts a queued Wait, and so does the Waiters of an
// Observer's Stats; otherwise an Observer hears nothing of Wait calls:
// they acquire nothing. A Wait on a free key whose shard is
// idle reads one atomic word and takes no mutex.
func (l *Locker[K]) Wait(ctx context.Context, key K) error {
	s, tag := l.t.shardOf(key)
	_, err := l.t.acquire(ctx, "Wait", s, key, tag, 0, askTurn)
	return err
}

// Locked reports whether key is held, in any mode, at this instant. It
// takes one shard mutex and allocates nothing. A key that is not equal to
// itself (a NaN) is never held: Locked returns false and Waiters 0.
func (l *Locker[K]) Locked(key K) bool { return l.t.locked(key) }

// Waiters returns the number of calls (Lock, RLock, Wait) queued on key at
// this instant, not counting holders. It takes one shard mutex and
// allocates nothing.
func (l *Locker[K]) Waiters(key K) int { return l.t.waiters(key) }

// Len returns the number of keys that have a holder or a waiter. It is 0
// once all work is done, whatever was cancelled. It takes each shard mutex
// in turn, so it is a sum of per-shard instants, not one snapshot.
func (l *Locker[K]) Len() int { return l.t.Len() }

// Stats returns the Locker's live counts: the keys with a holder and the
// calls queued over all keys (Lock, RLock, Wait). They are what an
// Observer reads through the function its Register is given. Stats takes
// each shard mutex in turn, so it is a sum of per-shard instants, not one
// snapshot; call it from a metrics collection or a health check, not per
// operation. It allocates nothing.
func (l *Locker[K]) Stats() Stats { return l.t.stats() }

// Calls returns key's calls at this instant: its holders in grant order,
// then its queued calls (Lock, RLock, Wait) in the order they will be
// granted, each with its owner, label, mode and, for a holder, token. A
// key without calls gives nil. It takes key's shard mutex once and
// allocates the slice; it is for listings and health checks
// (keylock.Lister), not for every operation.
func (l *Locker[K]) Calls(key K) []KeyCall { return l.t.calls(key) }

// Name returns the Locker's name: WithName's, or the one New generated
// ("fairlock-N").
func (l *Locker[K]) Name() string { return l.t.name }

// Close closes the Locker: later calls return ErrClosed, and queued
// waiters (Lock, RLock, Wait) wake with ErrClosed at once. Close then
// waits until every holder has unlocked or ctx is done, whichever comes
// first; on ctx's end it returns an error wrapping ctx's error and naming
// how many keys are still held (they may still be unlocked later). It
// stops the Locker's watchdog goroutine at once. Once no key is held, it
// unregisters the Locker from package debug and its Observer (after the
// Observer has heard every Unlock); until then the Locker stays in debug
// output and metrics, so that a Close stuck on a holder can be looked
// into, and if Close gave up, the last Unlock unregisters it (on a
// goroutine of its own). Close is safe to call more than once and
// concurrently; each call waits as described. A nil ctx means
// context.Background.
func (l *Locker[K]) Close(ctx context.Context) error { return l.t.close(ctx) }
