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
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/etcdlock/internal/ctxerr"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	// startTimeout bounds New's lease grant and watch creation.
	startTimeout = 10 * time.Second
	// cleanupTimeout bounds a deletion made on a detached context (a
	// cancelled waiter's key, Close's revoke), and how long an enqueueing
	// transaction may go on after its call returned. A deletion that
	// fails is retried in the background until it succeeds or the lease
	// ends.
	cleanupTimeout = 5 * time.Second
)

// lockers counts Lockers made, for default names.
var lockers atomic.Int64

// Locker is a fair, strict-FIFO keyed lock shared by every process that
// makes one with the same etcd cluster and prefix. Make one with New; the
// zero Locker is not usable. All methods are safe for concurrent use.
//
// A Locker holds one lease (renewed every third of its TTL while the
// Locker is open), one watch on its prefix, and three goroutines: the
// lease's renewal, the watch's dispatch, and a janitor that retries
// deletions that failed; and, while they run, one goroutine per
// enqueueing transaction and per abandoned lease being revoked, and two
// per watch being opened or listing being read. Close stops them all.
// While it has calls queued or held, a Locker whose watch has been
// silent for a tenth of the TTL (0.3 to 1 s) asks the server for a
// progress notification on it, a small message each way, and replaces a
// watch that does not answer (hub.go: a member that stopped answering
// without closing the connection).
type Locker struct {
	client  *clientv3.Client
	prefix  string // as given to New
	root    string // rootOf(prefix): every etcd key of the Locker starts with it
	size    int64  // a Semaphore's units per key; 0 for a Locker
	name    string
	ttl     time.Duration // asked of the server: the option rounded up to whole seconds
	logger  *slog.Logger
	value   string // "host:pid ": the start of every key's value
	obs     fairlock.LockerObserver
	obsMu   sync.RWMutex // read-held around each report to obs; see Close
	obsGone bool         // guarded by obsMu: Close unregistered obs
	unreg   func()       // removes the Locker from the debug registry; nil without WithDebug

	seq atomic.Uint64 // numbers the etcd keys this Locker writes

	// Closing: an open Locker goes once through three stages, each
	// marked by one context or channel that ends with it, in this order.
	//  1. closing ends when Close begins (under mu): calls fail with
	//     ErrClosed, queued calls leave the queue, reads and enqueueing
	//     transactions in progress are given up.
	//  2. bg ends once the calls have ended and the grants are released
	//     (or Close's ctx ended): the lease loop, the watch loop and the
	//     janitor stop, and with them background deletions and revokes.
	//  3. closed is closed when the first Close returns: later Closes
	//     return, and Unlock has no key left to delete.
	closing    context.Context
	beginClose context.CancelFunc // ends closing
	bg         context.Context    // the background goroutines' context
	stopBg     context.CancelFunc // ends bg
	closed     chan struct{}
	wg         sync.WaitGroup // the lease loop, the watch loop, the janitor

	mu      sync.Mutex // guards everything below, and the calls' fields marked so
	lease   *lease     // the current lease; nil while a new one is granted
	leaseCh chan struct{}
	keys    map[string][]*call // user key → this process's calls on it, in arrival order
	written map[*call]struct{} // calls with an etcd key: queued or held
	hub     hub                // the watch's dispatch state
	janitor janitor            // etcd keys still to delete
	calls   int                // calls in progress (Lock, TryLock, Wait, …)
	grants  int                // grants not yet unlocked
	pending int                // enqueueing transactions still running for a call that returned
	idle    chan struct{}      // cap 1: signalled when calls, grants or pending drops
	doubles int64              // Unlocks of a Guard already unlocked
	reentry int64              // calls refused with ErrReentrant

	watchCancel context.CancelFunc // ends the current watch (tests: PauseWatch)
	watchGate   chan struct{}      // tests: the next watch starts once it is closed
}

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
	l := &Locker{
		client:  client,
		prefix:  prefix,
		root:    rootOf(prefix),
		size:    size,
		name:    cfg.name,
		ttl:     ttlSeconds(cfg.ttl),
		logger:  cfg.logger,
		value:   host + ":" + strconv.Itoa(os.Getpid()) + " ",
		closed:  make(chan struct{}),
		leaseCh: make(chan struct{}),
		keys:    make(map[string][]*call),
		written: make(map[*call]struct{}),
		janitor: janitor{keys: make(map[string]cleanup), kick: make(chan struct{}, 1)},
		idle:    make(chan struct{}, 1),
	}
	l.hub.init()
	l.closing, l.beginClose = context.WithCancel(context.Background())
	l.bg, l.stopBg = context.WithCancel(context.WithoutCancel(client.Ctx()))

	ctx, cancel := context.WithTimeout(client.Ctx(), startTimeout)
	defer cancel()
	ls, err := l.grant(ctx)
	if err != nil {
		l.stopBg()
		return nil, fmt.Errorf("etcdlock: %s: grant lease: %w", op, err)
	}
	l.lease = ls
	close(l.leaseCh)
	ready := l.hub.readyCh()
	l.wg.Add(3)
	go l.leaseLoop()
	go l.watchLoop()
	go l.janitorLoop()
	select {
	case <-ready:
	case <-ctx.Done():
		l.stopBg()
		l.wg.Wait()
		l.revoke(ls)
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
	resp, err := l.client.Get(ctx, l.rangeOf(key), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return false, lockError("Locked", key, owner.Of(ctx), l.callError(ctx, err))
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
	ls := l.lease
	l.lease = nil
	for c := range l.written {
		l.loseLocked(c)
	}
	l.mu.Unlock()
	// The revoke deletes every key of the lease; then a last try at
	// failed deletions (keys of an earlier lease, or of unknown outcome).
	// Both share one bound, however many deletions are left.
	end, cancel := context.WithTimeout(context.WithoutCancel(l.client.Ctx()), cleanupTimeout)
	defer cancel()
	if ls != nil {
		if err := l.revokeWith(end, ls); err != nil {
			errs = append(errs, fmt.Errorf("etcdlock: Close: revoke lease %x: %w", int64(ls.id), err))
		}
	}
	l.sweep(end)
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

// signalIdle wakes a waiting Close. l.mu is held.
func (l *Locker) signalIdle() {
	select {
	case l.idle <- struct{}{}:
	default:
	}
}

// callError is the error a call returns for err from etcd: the context's
// (with its cause) if ctx is done, else err.
func (l *Locker) callError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctxerr.Of(ctx)
	}
	return err
}
