package etcdlock

import (
	"context"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Guard is one grant of a key, in any mode: the keylock.Lease behind
// every Lease that Locker.Lock, TryLock, RLock, TryRLock and
// Semaphore.Acquire, TryAcquire return. Its Unlock releases the grant.
// It is the kit's record of the call (package backend) under this
// package's name, so returning it allocates nothing more. The
// etcd-specific IsOwner is one type assertion away:
//
//	lease, err := locks.Lock(ctx, "order-7")
//	…
//	g := lease.(*etcdlock.Guard)
//	client.Txn(ctx).If(g.IsOwner()).Then(…)
//
// Its methods are safe for concurrent use, and Unlock may be called from
// any goroutine. A nil *Guard holds nothing: Unlock does nothing, Token
// is 0, Lost is nil.
type Guard backend.Call

// guardOf is a grant as the Lease this package returns.
func guardOf(c *backend.Call) keylock.Lease { return (*Guard)(c) }

// call returns the kit's record behind g.
func (g *Guard) call() *backend.Call { return (*backend.Call)(g) }

// Key returns the key the grant is for.
func (g *Guard) Key() string { return g.call().Key() }

// Token returns the grant's fencing token: the creation revision of its
// key in etcd. Every later grant of the same key under the same prefix,
// in any process, has a larger token, so a store that remembers the
// largest token it has accepted for a resource and refuses smaller ones
// refuses the writes of a grant that has been lost and taken over
// (Kleppmann's fencing tokens, "How to do distributed locking", 2016).
// Tokens of different keys are revisions of one etcd cluster and are
// comparable with each other too. A nil Guard's token is 0.
func (g *Guard) Token() uint64 { return g.call().Token() }

// IsOwner returns the etcd comparison that holds while this grant is
// current: its key exists with its creation revision. Put it in the If of
// a transaction that writes what the lock protects,
//
//	resp, err := client.Txn(ctx).If(g.IsOwner()).Then(clientv3.OpPut(k, v)).Commit()
//	// !resp.Succeeded: the grant was lost; nothing was written
//
// and the write happens only if the grant is still held when etcd applies
// it, whatever the clocks and pauses. A nil Guard's comparison never
// holds.
func (g *Guard) IsOwner() clientv3.Cmp {
	if g == nil {
		return clientv3.Compare(clientv3.CreateRevision("\x00etcdlock: no grant"), "=", -1)
	}
	return isOwner(g.call().ID(), int64(g.Token()))
}

// Lost returns a channel that is closed when the grant is lost while it
// is held: its key was deleted by someone else, its lease expired or was
// revoked, the Locker could not renew the lease before its deadline (see
// Deadline), or Close ended the grant. It closes within about a second
// of a revocation, expiry or deletion the server reports (the prefix
// watch delivers the deletion as it is committed). Unlock does not close
// it. Another process may hold the key as soon as it is lost: stop
// writing, and fence what you write (Token, IsOwner).
func (g *Guard) Lost() <-chan struct{} { return g.call().Lost() }

// Deadline returns the instant, on this process's monotonic clock, before
// which no other call can be granted the key even if this process stops
// right now: the send time of the last lease renewal the server confirmed
// (or of the lease's grant), plus the TTL the server granted (etcd counts
// it in whole seconds), less a tenth of it (for the two clocks' rates,
// which may differ by up to 10%). etcd's leader expires a lease by its
// own clock, from when it applied the renewal, after the send; a new
// leader grants every lease a fresh TTL, so a leader change only moves
// the real expiry later. The deadline only moves forward while the grant
// is held, and Lost closes when it passes without a renewal. After
// Unlock, or once the grant was lost, it is the instant that happened.
// keylock.Valid(g) is the check to make right before an action that must
// not run unprotected.
func (g *Guard) Deadline() time.Time { return g.call().Deadline() }

// HandOff makes the grant to's flow's from now on, as fairlock's
// Guard.HandOff does in process: the old owner's next call on the key
// waits for this grant's release instead of failing with ErrReentrant,
// and debug output shows to. Give the worker that will release the grant
// a flow of its own (owner.NewContext) and hand the grant to it before
// handing the Guard over. It returns false, changing nothing, for a grant
// released or lost, for owner 0, and for an owner with a call queued on
// the key in this Locker (it would wait for itself). It makes no round
// trip: ownership is this process's bookkeeping (the key's value in etcd
// keeps the owner that took it).
func (g *Guard) HandOff(to owner.ID) bool { return g.call().HandOff(to) }

// Unlock releases the grant: it deletes the grant's key in one
// transaction that compares the key's creation revision with the
// grant's, so it deletes only this grant's key, never a later grant's,
// even if retried late (the failure of etcd-io/etcd#22082). The next
// waiter is granted when the deletion is committed. It is one round trip,
// made with ctx; a nil ctx means context.Background.
//
// Unlock is idempotent: a second Unlock of the Guard does nothing and
// returns nil, whoever holds the key by then. It returns an error
// wrapping ErrLost if the grant was lost before Unlock deleted its key
// (Lost is then closed); the key is deleted all the same if it was still
// there. If the deletion fails (ctx ends, etcd is unreachable) Unlock
// returns an error wrapping that failure, and the Locker keeps deleting
// the key in the background until it succeeds or the lease ends: either
// way the Guard is released and the key does not stay. A deletion that
// fails for a grant that was lost before Unlock began, or whose lease
// the Locker gave up while Unlock ran (its deadline passed: see Lost),
// returns an error wrapping both ErrLost and the failure; errors.Is finds
// either.
func (g *Guard) Unlock(ctx context.Context) error { return g.call().Unlock(ctx) }
