package etcdlock

import (
	"time"

	"github.com/fairlock/fairlock/owner"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The waiter record: what this process knows of one of its calls.

// The states of a call. A call is queued from its start until it is
// granted (held) or ends without a grant (released); a grant is held
// until Unlock, Close, or, for Wait, the instant it is taken (released).
type callState uint8

const (
	queued callState = iota
	held
	released
)

// call is one Lock, TryLock, RLock, TryRLock, Wait, Acquire or TryAcquire
// of this process, from its start until its grant is released: the
// waiter record that the Locker keeps (Locker.keys, Locker.written) and
// the hub subscribes to deletions and wakes. A granted call is behind
// the Guard its caller gets, which points to it; the caller never sees
// a call.
type call struct {
	key   string
	owner owner.ID
	mode  string        // registry.Exclusive, Shared, Units, or Wait for Wait
	claim claim         // what the call asks for: written in its key's name
	since time.Time     // when the call began
	lost  chan struct{} // closed when a held grant is lost

	// The call's etcd key. Written under Locker.mu while the call is
	// queued; fixed once it is granted.
	name  string
	rev   int64 // its creation revision: the fencing token
	lease *lease

	// Guarded by Locker.mu.
	state      callState
	granted    time.Time
	wake       chan struct{} // cap 1: the hub has news for the waiting call
	weight     total         // the weight (claim.weigh) of aheadKeys
	aheadKeys  []string      // the subscribed keys ahead not yet deleted that weigh on it
	complete   bool          // aheadKeys were every key ahead
	ownWatched bool          // subscribed to its own key's deletion
	gone       bool          // its key was deleted, or its lease abandoned
	releasing  bool          // Unlock has begun: a deletion of its key is Unlock's
	lostClosed bool          // lost is closed
}

// ready reports whether the subscribed keys ahead of c that are left
// leave room for it: with complete, c's turn has come. Locker.mu is held.
func (c *call) ready() bool { return c.weight.atMost(c.claim.room()) }

// isOwner is the etcd comparison that holds while c's key exists with
// its creation revision (Guard.IsOwner).
func (c *call) isOwner() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(c.name), "=", c.rev)
}

// signal wakes the goroutine waiting in c. Locker.mu is held.
func (c *call) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// loseLocked marks c's key gone; a held grant is lost: its Lost channel
// closes. Locker.mu is held.
func (c *call) loseLocked() {
	c.gone = true
	if c.state == held && !c.releasing {
		c.closeLost()
	}
	c.signal()
}

// closeLost closes c's Lost channel, once. Locker.mu is held.
func (c *call) closeLost() {
	if !c.lostClosed {
		c.lostClosed = true
		close(c.lost)
	}
}
