package etcdlock

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/fairlock/fairlock/fairlock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The Locker's state: the Locker type, which New (etcdlock.go) makes and
// Close ends, and the helpers that keep its books of calls under mu. Its
// components (the lease keeper, the hub, the janitor) are fields of it
// that New gives the few values each needs; they never refer back to the
// Locker, which calls them (acquire.go, guard.go, txn.go, etcdlock.go).

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
	// closing and bg are made once in New, and the components hold
	// copies of them: never replace either.
	closing    context.Context
	beginClose context.CancelFunc // ends closing
	bg         context.Context    // the background goroutines' context
	stopBg     context.CancelFunc // ends bg
	closed     chan struct{}
	wg         sync.WaitGroup // the lease loop, the watch loop, the janitor

	// mu guards everything below (of the components, leases, hub and
	// janitor, what each marks as guarded by it: each holds a pointer to
	// it), and the calls' fields marked so.
	mu     sync.Mutex
	leases leaseKeeper        // the lease: its renewal and replacement (lease.go)
	keys   map[string][]*call // user key → this process's calls on it, in arrival order
	// written is the calls with an etcd key: queued or held. Made once
	// in New and shared with the hub (hub.written): clear it in place,
	// never replace it.
	written map[*call]struct{}
	hub     hub           // the watch and its dispatch (hub.go)
	janitor janitor       // deletions retried in the background (janitor.go)
	calls   int           // calls in progress (Lock, TryLock, Wait, …)
	grants  int           // grants not yet unlocked
	pending int           // enqueueing transactions still running for a call that returned
	idle    chan struct{} // cap 1: signalled when calls, grants or pending drops
	doubles int64         // Unlocks of a Guard already unlocked
	reentry int64         // calls refused with ErrReentrant
}

// signalIdle wakes a waiting Close. l.mu is held.
func (l *Locker) signalIdle() {
	select {
	case l.idle <- struct{}{}:
	default:
	}
}

// forgetLocked removes c from the local view of its key. l.mu is held.
func (l *Locker) forgetLocked(c *call) {
	cs := l.keys[c.key]
	if i := slices.Index(cs, c); i >= 0 {
		cs = slices.Delete(cs, i, i+1)
	}
	if len(cs) == 0 {
		delete(l.keys, c.key)
	} else {
		l.keys[c.key] = cs
	}
}

// loseLease loses the calls written with ls, a lease the lease keeper
// abandoned (its leaseKeeper.lost). l.mu is held.
func (l *Locker) loseLease(ls *lease) {
	for c := range l.written {
		if c.lease == ls {
			c.loseLocked()
		}
	}
}
