package etcdlock

import (
	"context"
	"fmt"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/keylock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Semaphore is a keyed weighted semaphore shared by every process that
// makes one with the same etcd cluster and prefix: each key has n units,
// and Acquire(key, w) takes w of them. It is fairlock.Semaphore across
// processes, head-of-line FIFO like golang.org/x/sync/semaphore: the
// calls on a key are granted in the order of their keys' creation
// revisions, a call when the units of every call ahead of it (held or
// queued) plus its own fit in n, so a large request at the head of the
// queue keeps smaller ones behind it waiting, and none starves.
//
// It keeps the Locker's layout and machinery (one lease, one watch, one
// etcd key per call, a grant decided from the keys ahead without another
// round trip), and its Guards have the same tokens, Lost channels,
// IsOwner comparisons and Unlock. Each call's key records its weight and
// n (keys.go), so that every process can count the units ahead.
//
// Every process on a prefix must use the same n. A call that finds on its
// key calls of a Semaphore of another n, the oldest of them older than
// any of its own size, fails with a *fairlock.LockError wrapping
// fairlock.ErrInvalidWeight that names both sizes, and leaves no key
// behind: the sizes are never mixed in one count, so a key is never
// granted beyond either size. The size whose call reached a free key
// first keeps it; calls of the other size fail until its calls are gone
// (one of them that queued behind its calls, on its way out, keeps the
// calls of the keeping size behind it waiting, not failing).
// Lockers and Semaphores must not share a prefix; a call of a Locker on a
// Semaphore's key counts as all n units, and the reverse as a writer.
//
// Make one with NewSemaphore; the zero Semaphore is not usable. All
// methods are safe for concurrent use.
type Semaphore struct {
	l *Locker
}

// NewSemaphore returns a Semaphore of n units per key whose keys live
// under prefix in the etcd cluster that client talks to. Semaphores in
// any number of processes that use the same cluster, prefix and n share
// each key's units. It takes New's options (WithTTL, WithName,
// WithObserver, WithDebug, WithLogger) and costs what New costs: a lease,
// a watch on the prefix, three goroutines that Close stops. It returns
// an error if n < 1, for a bad prefix, or if the lease or the watch
// cannot be made.
func NewSemaphore(client *clientv3.Client, prefix string, n int64, opts ...Option) (*Semaphore, error) {
	if n < 1 {
		return nil, fmt.Errorf("etcdlock: NewSemaphore: %d units per key: want at least 1", n)
	}
	l, err := newLocker("NewSemaphore", client, prefix, n, opts)
	if err != nil {
		return nil, err
	}
	return &Semaphore{l: l}, nil
}

// Acquire takes w units of key for the owner of ctx and returns the grant,
// a *Guard, whose Unlock gives them back. It queues behind every call on
// the key, in this process or any other on the prefix, and blocks until
// the units of every call ahead of it plus w fit in n: it never
// overtakes, even a larger request that does not fit yet. An uncontended
// Acquire is one round trip (a transaction that writes the call's key
// and reads the keys ahead of it); a queued one is granted without
// another round trip when the calls ahead release enough.
//
// It returns a nil Lease and a *fairlock.LockError naming the key and
// owner, wrapping:
//   - fairlock.ErrInvalidWeight at once, with nothing written, if w < 1 or
//     w > n; or if a Semaphore with another n keeps the key (its call is
//     the oldest on it: the message names both sizes; the call's own key
//     is deleted);
//   - fairlock.ErrReentrant at once if the owner holds units of key
//     through this Semaphore;
//   - the context's error, fairlock.ErrClosed or etcd's error, as Lock.
func (s *Semaphore) Acquire(ctx context.Context, key string, w int64) (keylock.Lease, error) {
	return asLease(s.locker("Acquire").k.Acquire(ctx, "Acquire", key, backend.Units, w, false))
}

// TryAcquire takes w units of key if the units of every call on it, held
// or queued, in any process, plus w fit in n; otherwise it returns an
// error wrapping fairlock.ErrWouldBlock and has written nothing. It never
// overtakes a queued call. On a free key it is one round trip; beside
// other holders, two (see Locker.TryRLock). It fails like Acquire
// otherwise.
func (s *Semaphore) TryAcquire(ctx context.Context, key string, w int64) (keylock.Lease, error) {
	return asLease(s.locker("TryAcquire").k.Acquire(ctx, "TryAcquire", key, backend.Units, w, true))
}

// Calls lists key's calls in every process at this instant, as
// Locker.Calls does, with each call's units.
func (s *Semaphore) Calls(ctx context.Context, key string) ([]keylock.CallInfo, error) {
	return s.locker("Calls").Calls(ctx, key)
}

// Close closes the Semaphore as Locker.Close closes a Locker: later
// calls and queued ones fail with fairlock.ErrClosed, Close waits until
// ctx ends for the units held to be given back, then revokes the lease.
func (s *Semaphore) Close(ctx context.Context) error { return s.locker("Close").Close(ctx) }

// locker returns the Semaphore's Locker; on a Semaphore not made by
// NewSemaphore it panics, naming the call, rather than fail somewhere
// inside.
func (s *Semaphore) locker(op string) *Locker {
	if s == nil || s.l == nil {
		panic("etcdlock: Semaphore." + op + " on a Semaphore not made by NewSemaphore")
	}
	return s.l
}
