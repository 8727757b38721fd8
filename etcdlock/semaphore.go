package etcdlock

import (
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
	backend.Semaphore // Acquire, TryAcquire, Close
	e                 *engine
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
	k, e, err := start("NewSemaphore", client, prefix, n, opts)
	if err != nil {
		return nil, err
	}
	return &Semaphore{backend.NewSemaphore(k, guardOf), e}, nil
}

var (
	_ keylock.Semaphore = (*Semaphore)(nil)
	_ keylock.Lister    = (*Semaphore)(nil)
)
