// Package etcdlock is fairlock's fair, strict-FIFO keyed lock across
// processes and machines, on an etcd cluster.
//
// Every Lock call is its own waiter in etcd: it writes its own key under
// the Locker's prefix (see the key layout in keys.go), attached to the
// Locker's lease, and the calls on a key are granted in the order of their
// keys' creation revisions, across every process that uses the same
// prefix. A waiter waits only for the keys ahead of it, so a release wakes
// one waiter, not a herd. Exclusion never depends on clocks: the holder is
// the oldest live key. Leases only end the grants of processes that
// stopped renewing them.
//
// The promises are fairlock's where they make sense: ErrReentrant at once
// for an owner that already holds the key (checked in this process,
// without a round trip), a TryLock that never overtakes a queued waiter,
// Wait, Close. Errors are *fairlock.LockError values naming the key and
// wrapping fairlock's sentinels, a context's error, an etcd error, or
// ErrLost.
//
// *Locker is a keylock.RWLocker and *Semaphore a keylock.Semaphore: code
// written against package keylock (keylock.Do, keylock.LockMany, which
// serves every backend) runs on etcd unchanged, and every Lease they
// return is a *Guard, whose IsOwner is one type assertion away. Besides
// exclusive grants (Lock) a Locker has shared ones (RLock: readers share
// a key, task-fair behind queued writers), and a Semaphore gives each key
// n units (Acquire(key, w), head-of-line FIFO). Every mode keeps one etcd
// key per call and decides a grant from the keys ahead of it: each key's
// name records what its call asks for (keys.go), so every process can
// tell, from a keys-only read and the deletions its watch delivers,
// whether a call's turn has come.
//
// What is new across processes is that a grant can be lost: its lease can
// expire (the process stalled or lost its connection for a TTL) or be
// revoked, or someone can delete its key. Guard.Lost says so, and the
// fencing token (Guard.Token, Guard.IsOwner) lets a store refuse the
// writes of a grant that is no longer current. docs/distributed.md states
// the failure model.
//
// # Hand-off
//
// Each Locker keeps one watch on its whole prefix, started at the current
// revision, and dispatches deletions to its waiters in this process. A
// watch that starts at the current revision sits in the server's synced
// watcher group and gets each event as it is committed; etcd's
// concurrency.Mutex instead starts one watch per waiter at a past
// revision, which the server parks in its unsynced group and catches up
// only every 100 ms (watchResyncPeriod in mvcc/watchable_store.go), so a
// freshly queued waiter there waits about 100 ms for a release it could
// have had at once.
//
// # Memory model
//
// For a key k, the n'th successful Unlock of k, by any process, happens
// before the return of the m'th Lock of k for n < m, in the sense etcd
// gives: the Unlock's deletion is committed before the Lock observes it.
// Writes made under a grant are ordered with the next holder's only
// through etcd (Txn with IsOwner) or a store that checks fencing tokens.
package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Locker's life: New makes its core (package backend) and engine
// (engine.go), grants its lease (lease.go) and starts its watch
// (hub.go); Locked reads a key's range, and Close ends it all. The calls
// on keys are in acquire.go and semaphore.go, the grant's methods in
// guard.go.

// startTimeout bounds New's lease grant and watch creation.
const startTimeout = 10 * time.Second

// Locker is a fair, strict-FIFO keyed lock shared by every process that
// makes one with the same etcd cluster and prefix. Make one with New; the
// zero Locker is not usable. All methods are safe for concurrent use.
//
// A Locker holds one lease (renewed every third of its TTL while the
// Locker is open), one watch on its prefix, and four goroutines: the
// lease's renewal, its replacement, the watch's dispatch, and a janitor
// that retries deletions that failed; and, while they run, one goroutine
// per enqueueing transaction and per abandoned lease being revoked, and
// two per watch being opened or listing being read. Close stops them all.
// While it has calls queued or held, a Locker whose watch has been
// silent for a tenth of the TTL (0.3 to 1 s) asks the server for a
// progress notification on it, a small message each way, and replaces a
// watch that does not answer (hub.go: a member that stopped answering
// without closing the connection).
type Locker struct {
	backend.Locker // Lock, TryLock, RLock, TryRLock, Wait, Close
	e              *engine
}

var (
	_ keylock.RWLocker = (*Locker)(nil)
	_ keylock.Lease    = (*Guard)(nil)
	_ keylock.Lister   = (*Locker)(nil)
)

// ErrLost is the error, wrapped in a *fairlock.LockError with Op "Unlock",
// that Guard.Unlock returns for a grant that was lost before it was
// unlocked: its lease expired or was revoked, its key was deleted by
// someone else, or the Locker could not renew the lease for a TTL (see
// Guard.Lost). Another process may have held the key since; anything
// written under the grant must be checked with its fencing token.
var ErrLost = fairlock.ErrLost

// New returns a Locker whose keys live under prefix in the etcd cluster
// that client talks to. Lockers in any number of processes that use the
// same cluster and prefix exclude each other, key by key. prefix must not
// be empty; one trailing '/' is implied ("locks" and "locks/" are the
// same), and one made only of slashes is refused; etcd's convention is a
// leading '/' ("/locks/orders"), and redislock takes the same form.
// Nothing but the Locker's keys may be written under it, nor may a
// Semaphore share it (each would count the other's calls as exclusive
// ones: see Semaphore). A nil Option is ignored.
//
// New grants the Locker's lease (WithTTL) and starts its watch on the
// prefix before it returns: two round trips, bounded by 10 s and by
// client.Ctx(). It returns an error wrapping the cause if either fails
// (an unreachable cluster: the client's dial error, as soon as the
// client gives up); it starts four goroutines that Close stops. The
// client must stay open until Close has returned.
func New(client *clientv3.Client, prefix string, opts ...Option) (*Locker, error) {
	k, e, err := start("New", client, prefix, 0, opts)
	if err != nil {
		return nil, err
	}
	return &Locker{backend.NewLocker(k, guardOf), e}, nil
}

// start makes the core and engine of New's Locker, or NewSemaphore's
// when size > 0, grants its lease and starts its watch; op names the
// call in errors.
func start(op string, client *clientv3.Client, prefix string, size int64, opts []Option) (*backend.Core, *engine, error) {
	if client == nil {
		return nil, nil, errors.New("etcdlock: " + op + ": nil client")
	}
	if prefix == "" || rootOf(prefix) == "/" {
		return nil, nil, fmt.Errorf("etcdlock: %s: prefix %q is empty or only slashes", op, prefix)
	}
	s := backend.NewSettings(opts)
	s.TTL = ttlSeconds(s.TTL)
	kind := "etcdlock.Locker"
	if size > 0 {
		kind = "etcdlock.Semaphore"
	}
	k := backend.New(backend.Config{Package: "etcdlock", Kind: kind, Size: size, DefaultName: "etcdlock"}, s)
	e := &engine{
		k:      k,
		client: client,
		prefix: prefix,
		root:   rootOf(prefix),
		size:   size,
		value:  valuePrefix(k.Process()),
	}
	e.leases = newLeaseKeeper(k, client, s.TTL)
	e.hub = hub{
		mu: k.Mu(), client: client, root: e.root, k: k, judge: e.judgeLocked,
	}
	e.hub.init()

	ctx, cancel := context.WithTimeout(client.Ctx(), startTimeout)
	defer cancel()
	if err := grantFirst(ctx, e.leases, client.Endpoints()); err != nil {
		k.Abort()
		return nil, nil, fmt.Errorf("etcdlock: %s: grant lease: %w", op, err)
	}
	ready := e.hub.readyCh()
	k.Go(e.leases.Run)
	k.Go(e.hub.watchLoop)
	select {
	case <-ready:
	case <-ctx.Done():
		k.Abort()
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(client.Ctx()), backend.CleanupTimeout)
		e.leases.Shutdown(rctx)
		rcancel()
		return nil, nil, fmt.Errorf("etcdlock: %s: watch %q: %w", op, e.root, ctx.Err())
	}
	k.Start(e)
	return k, e, nil
}

// Locked reports whether key has a holder or a queued call in any process
// at this instant: whether its range under the prefix holds a key that is
// not a Wait's whose turn has come (the keys of Waits at the head of the
// queue hold nothing, and their Lockers remove them a moment after the
// Waits return). It is one linearizable read of the oldest keys of the
// range, names only, and a read of the whole range only when those are
// all Waits' and there are more. It returns an error wrapping the
// context's or etcd's error if a read fails. A nil ctx panics, as in
// Lock.
func (l *Locker) Locked(ctx context.Context, key string) (bool, error) {
	if ctx == nil {
		panic("etcdlock: Locked with a nil context")
	}
	for limit := int64(aheadLimit); ; limit = 0 {
		var resp *clientv3.GetResponse
		err := l.e.attempts(ctx, func(actx context.Context) (err error) {
			resp, err = l.e.client.Get(actx, rangeOf(l.e.root, key), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(limit))
			return err
		})
		if err != nil {
			return false, backend.CallError(ctx, "Locked", key, err)
		}
		if !onlyWaits(resp.Kvs) {
			return true, nil
		}
		if !resp.More {
			return false, nil
		}
	}
}
