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
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/etcdlock/internal/ctxerr"
	"github.com/fairlock/fairlock/owner"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// startTimeout bounds New's lease grant and watch creation.
const startTimeout = 10 * time.Second

// lockers counts Lockers made, for default names.
var lockers atomic.Int64

// New returns a Locker whose keys live under prefix in the etcd cluster
// that client talks to. Lockers in any number of processes that use the
// same cluster and prefix exclude each other, key by key. prefix must not
// be empty; one trailing '/' is implied ("locks" and "locks/" are the
// same), and one made only of slashes is refused. Nothing but the
// Locker's keys may be written under it, nor may a Semaphore share it
// (each would count the other's calls as exclusive ones: see Semaphore).
// A nil Option is ignored.
//
// New grants the Locker's lease (WithTTL) and starts its watch on the
// prefix before it returns: two round trips, bounded by 10 s and by
// client.Ctx(). It returns an error if either fails; it starts three
// goroutines that Close stops. The client must stay open until Close has
// returned.
func New(client *clientv3.Client, prefix string, opts ...Option) (*Locker, error) {
	return newLocker("New", client, prefix, 0, opts)
}

// newLocker is New, and NewSemaphore's Locker when size > 0; op names the
// call in errors.
func newLocker(op string, client *clientv3.Client, prefix string, size int64, opts []Option) (*Locker, error) {
	if client == nil {
		return nil, errors.New("etcdlock: " + op + ": nil client")
	}
	if prefix == "" || rootOf(prefix) == "/" {
		return nil, fmt.Errorf("etcdlock: %s: prefix %q is empty or only slashes", op, prefix)
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.name == "" {
		cfg.name = "etcdlock-" + strconv.FormatInt(lockers.Add(1), 10)
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	host, _ := os.Hostname()
	ttl := ttlSeconds(cfg.ttl)
	l := &Locker{
		client:  client,
		prefix:  prefix,
		root:    rootOf(prefix),
		size:    size,
		name:    cfg.name,
		logger:  cfg.logger,
		value:   host + ":" + strconv.Itoa(os.Getpid()) + " ",
		closed:  make(chan struct{}),
		keys:    make(map[string][]*call),
		written: make(map[*call]struct{}),
		idle:    make(chan struct{}, 1),
	}
	l.closing, l.beginClose = context.WithCancel(context.Background())
	l.bg, l.stopBg = context.WithCancel(context.WithoutCancel(client.Ctx()))
	// The components, each given what it needs of the Locker.
	l.leases = leaseKeeper{
		mu: &l.mu, client: client, ttl: ttl, closing: l.closing, bg: l.bg, wg: &l.wg,
		logger: l.logger, name: l.name, lost: l.loseLease,
		ch: make(chan struct{}),
	}
	l.hub = hub{
		mu: &l.mu, client: client, root: l.root, ttl: ttl, bg: l.bg, wg: &l.wg,
		logger: l.logger, name: l.name, written: l.written,
	}
	l.hub.init()
	l.janitor = janitor{
		mu: &l.mu, client: client, bg: l.bg, wg: &l.wg, logger: l.logger, name: l.name,
		keys: make(map[string]cleanup), kick: make(chan struct{}, 1),
	}

	ctx, cancel := context.WithTimeout(client.Ctx(), startTimeout)
	defer cancel()
	ls, err := l.leases.grant(ctx)
	if err != nil {
		l.stopBg()
		return nil, fmt.Errorf("etcdlock: %s: grant lease: %w", op, err)
	}
	l.leases.cur = ls
	close(l.leases.ch)
	ready := l.hub.readyCh()
	l.wg.Add(3)
	go l.leases.loop()
	go l.hub.watchLoop()
	go l.janitor.loop()
	select {
	case <-ready:
	case <-ctx.Done():
		l.stopBg()
		l.wg.Wait()
		l.leases.revoke(ls)
		return nil, fmt.Errorf("etcdlock: %s: watch %q: %w", op, l.root, ctx.Err())
	}
	if cfg.observer != nil {
		l.obs = cfg.observer.Register(l.name, l.stats)
	}
	if cfg.debug {
		_, l.unreg = registry.Register(l.name, debugSource{l})
	}
	return l, nil
}

// ttlSeconds rounds d up to whole seconds, at least one: etcd's unit.
func ttlSeconds(d time.Duration) time.Duration {
	s := (d + time.Second - 1) / time.Second
	return max(s, 1) * time.Second
}

// Locked reports whether key has a holder or a queued call in any process
// at this instant: whether its range under the prefix holds a key. It is
// one linearizable read (a count, no keys transferred). It returns an
// error wrapping the context's or etcd's error if the read fails. A nil
// ctx panics, as in Lock.
func (l *Locker) Locked(ctx context.Context, key string) (bool, error) {
	if ctx == nil {
		panic("etcdlock: Locked with a nil context")
	}
	resp, err := l.client.Get(ctx, rangeOf(l.root, key), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return false, lockError("Locked", key, owner.Of(ctx), callError(ctx, err))
	}
	return resp.Count > 0, nil
}

// Close closes the Locker. Later calls (Lock, TryLock, RLock, TryRLock,
// Wait) return ErrClosed, and queued calls wake with ErrClosed, deleting
// their keys.
// Close then waits until every grant has been unlocked or ctx is done.
// Then it stops the Locker's goroutines and revokes its lease, which
// deletes every key the Locker still had in etcd, and makes a last try
// at deletions that failed earlier: the two together are bounded by 5 s
// on a context of their own. When Close returns, the Locker has nothing
// under the prefix, or, if etcd could not be reached, only keys that
// expire with the lease's TTL. Grants still held at that point are lost: their Lost
// channels close and their Unlock returns ErrLost. Close unregisters the
// Locker from the debug registry and its Observer.
//
// Close returns nil, or an error wrapping ctx's error that says how many
// grants were still held, or the revoke's error. It is safe to call more
// than once and concurrently; a later call waits for the first to finish
// and returns nil, or an error wrapping its own ctx's error if that ends
// first. A nil ctx means context.Background.
func (l *Locker) Close(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	l.mu.Lock()
	first := l.closing.Err() == nil
	if first {
		l.beginClose()
	}
	l.mu.Unlock()
	if !first {
		select {
		case <-l.closed:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("etcdlock: Close: %w", ctxerr.Of(ctx))
		}
	}
	defer close(l.closed)

	// Queued calls see closing, delete their keys and return.
	var errs []error
	if grants := l.waitIdle(ctx); grants > 0 {
		noun := "grants"
		if grants == 1 {
			noun = "grant"
		}
		errs = append(errs, fmt.Errorf("etcdlock: Close: %d %s still held, now lost: %w", grants, noun, ctxerr.Of(ctx)))
	}
	l.stopBg()
	l.wg.Wait()

	l.mu.Lock()
	ls := l.leases.cur
	l.leases.cur = nil
	for c := range l.written {
		c.loseLocked()
	}
	l.mu.Unlock()
	// The revoke deletes every key of the lease; then a last try at
	// failed deletions (keys of an earlier lease, or of unknown outcome).
	// Both share one bound, however many deletions are left.
	end, cancel := context.WithTimeout(context.WithoutCancel(l.client.Ctx()), cleanupTimeout)
	defer cancel()
	if ls != nil {
		if err := l.leases.revokeWith(end, ls); err != nil {
			errs = append(errs, fmt.Errorf("etcdlock: Close: revoke lease %x: %w", int64(ls.id), err))
		}
	}
	l.janitor.sweep(end)
	if l.unreg != nil {
		l.unreg()
	}
	if l.obs != nil {
		// No report is in flight once obsGone is set: the observer hears
		// nothing after Unregister.
		l.obsMu.Lock()
		l.obsGone = true
		l.obsMu.Unlock()
		l.obs.Unregister()
	}
	return errors.Join(errs...)
}

// waitIdle waits until no call is in progress, no grant is held and no
// enqueueing transaction is pending, or ctx is done. Calls and pending
// transactions end on their own in bounded time once l.closing has
// ended, so it waits for them even past ctx; it returns how many grants
// were still held.
func (l *Locker) waitIdle(ctx context.Context) int {
	done, expired := ctx.Done(), false
	for {
		l.mu.Lock()
		calls, grants, pending := l.calls, l.grants, l.pending
		l.mu.Unlock()
		if calls == 0 && pending == 0 && (grants == 0 || expired) {
			return grants
		}
		select {
		case <-l.idle:
		case <-done:
			// Stop waiting for holders; keep waiting for calls.
			done, expired = nil, true
		}
	}
}
