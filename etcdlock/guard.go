package etcdlock

import (
	"context"
	"fmt"
	"time"

	"github.com/fairlock/fairlock/etcdlock/internal/ctxerr"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Guard is one grant of a key, in any mode: the keylock.Lease behind
// every Lease that Locker.Lock, TryLock, RLock, TryRLock and
// Semaphore.Acquire, TryAcquire return. Its Unlock releases the grant.
// The etcd-specific IsOwner is one type assertion away:
//
//	lease, err := locks.Lock(ctx, "order-7")
//	…
//	g := lease.(*etcdlock.Guard)
//	client.Txn(ctx).If(g.IsOwner()).Then(…)
//
// Its methods are safe for concurrent use, and Unlock may be called from
// any goroutine. A nil *Guard holds nothing: Unlock does nothing, Token
// is 0, Lost is nil.
type Guard struct {
	l   *Locker
	c   *call         // the call that was granted
	sem chan struct{} // cap 1: one Unlock at a time
}

// Key returns the key the grant is for.
func (g *Guard) Key() string {
	if g == nil || g.c == nil {
		return ""
	}
	return g.c.key
}

// Token returns the grant's fencing token: the creation revision of its
// key in etcd. Every later grant of the same key under the same prefix,
// in any process, has a larger token, so a store that remembers the
// largest token it has accepted for a resource and refuses smaller ones
// refuses the writes of a grant that has been lost and taken over
// (Kleppmann's fencing tokens, "How to do distributed locking", 2016).
// Tokens of different keys are revisions of one etcd cluster and are
// comparable with each other too. A nil Guard's token is 0.
func (g *Guard) Token() uint64 {
	if g == nil || g.c == nil {
		return 0
	}
	return uint64(g.c.rev)
}

// Lost returns a channel that is closed when the grant is lost while it
// is held: its key was deleted by someone else, its lease expired or was
// revoked, the Locker could not renew the lease for about its TTL (the
// lease's deadline, see WithTTL), or Close ended the grant. It closes
// within about a second of a revocation, expiry or deletion the server
// reports (the prefix watch delivers the deletion as it is committed).
// Unlock does not close it. Another process may hold the key as soon as
// it is lost: stop writing, and fence what you write (Token, IsOwner).
func (g *Guard) Lost() <-chan struct{} {
	if g == nil || g.c == nil {
		return nil
	}
	return g.c.lost
}

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
	if g == nil || g.c == nil {
		return clientv3.Compare(clientv3.CreateRevision("\x00etcdlock: no grant"), "=", -1)
	}
	return g.c.isOwner()
}

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
func (g *Guard) Unlock(ctx context.Context) error {
	if g == nil || g.c == nil {
		return nil
	}
	if ctx == nil {
		ctx = context.Background()
	}
	// Take the Guard's turn without a look at ctx first: a select with a
	// done ctx picks a ready case at random, and an Unlock with a done ctx
	// must still release (its deletion then fails and goes to the janitor).
	// Only an Unlock racing another Unlock of the Guard waits here.
	select {
	case g.sem <- struct{}{}:
	default:
		select {
		case g.sem <- struct{}{}:
		case <-ctx.Done():
			return lockError("Unlock", g.c.key, g.c.owner, ctxerr.Of(ctx))
		}
	}
	defer func() { <-g.sem }()
	l, c := g.l, g.c
	l.mu.Lock()
	if c.state != held {
		l.doubles++
		l.mu.Unlock()
		return nil
	}
	lostBefore := c.lostClosed
	c.releasing = true
	l.mu.Unlock()

	var err error
	gone := false
	select {
	case <-l.closed:
		// Close revoked the lease and lost every grant: nothing to delete.
		gone = true
	default:
		var resp *clientv3.TxnResponse
		resp, err = l.client.Txn(ctx).If(c.isOwner()).Then(clientv3.OpDelete(c.name)).Commit()
		if err != nil {
			l.janitor.add(c.name, c.rev)
		} else {
			gone = !resp.Succeeded
		}
	}
	now := time.Now()
	l.mu.Lock()
	// A failed deletion says nothing about the key; the grant was lost
	// if Lost was closed before Unlock began or its lease was abandoned
	// since. (A deletion that succeeded found the key current.)
	lostToo := err != nil && (lostBefore || c.lease.abandoned)
	if lostToo {
		gone = true
	}
	l.hub.unwatchLocked(c)
	delete(l.written, c)
	l.forgetLocked(c)
	c.state = released
	l.grants--
	if gone {
		c.closeLost()
	}
	hold := now.Sub(c.granted)
	l.signalIdle()
	l.mu.Unlock()
	if l.obs != nil {
		l.obsMu.RLock()
		if !l.obsGone {
			l.obs.Release(hold)
		}
		l.obsMu.RUnlock()
	}
	switch {
	case lostToo:
		return lockError("Unlock", c.key, c.owner, fmt.Errorf("%w; deleting its key failed: %w", ErrLost, callError(ctx, err)))
	case err != nil:
		return lockError("Unlock", c.key, c.owner, callError(ctx, err))
	case lostBefore || gone:
		return lockError("Unlock", c.key, c.owner, ErrLost)
	}
	return nil
}
