package etcdlock

import (
	"context"
	"time"

	"github.com/fairlock/fairlock/internal/ctxerr"
	"github.com/fairlock/fairlock/owner"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The states of a call. A call is queued from its start until it is
// granted (held) or ends without a grant (released); a grant is held
// until Unlock, Close, or, for Wait, the instant it is taken (released).
const (
	queued = iota
	held
	released
)

// Guard is one grant of a key, returned by Lock and TryLock; its Unlock
// releases the key. Its methods are safe for concurrent use, and Unlock
// may be called from any goroutine. A nil *Guard holds nothing: Unlock
// does nothing, Token is 0, Lost is nil.
type Guard struct {
	l     *Locker
	key   string
	owner owner.ID
	mode  string        // registry.Exclusive, or registry.Wait for Wait
	since time.Time     // when the call began
	lost  chan struct{} // closed when a held grant is lost
	sem   chan struct{} // cap 1: one Unlock at a time

	// The call's etcd key. Written under Locker.mu while the call is
	// queued; fixed once the Guard is returned.
	name  string
	rev   int64 // its creation revision: the fencing token
	lease *lease

	// Guarded by Locker.mu.
	state      int
	granted    time.Time
	wake       chan struct{} // cap 1: the hub has news for the waiting call
	ahead      int           // subscribed keys ahead not yet deleted
	aheadKeys  []string      // those keys
	complete   bool          // aheadKeys were every key ahead
	ownWatched bool          // subscribed to its own key's deletion
	gone       bool          // its key was deleted, or its lease abandoned
	releasing  bool          // Unlock has begun: a deletion of its key is Unlock's
	lostClosed bool          // lost is closed
}

// signal wakes the call waiting on g. Locker.mu is held.
func (g *Guard) signal() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// loseLocked marks g's key gone; a held grant is lost: its Lost channel
// closes. l.mu is held.
func (l *Locker) loseLocked(g *Guard) {
	g.gone = true
	if g.state == held && !g.releasing && !g.lostClosed {
		g.lostClosed = true
		close(g.lost)
	}
	g.signal()
}

// Key returns the key the grant is for.
func (g *Guard) Key() string {
	if g == nil {
		return ""
	}
	return g.key
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
	if g == nil {
		return 0
	}
	return uint64(g.rev)
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
	if g == nil {
		return nil
	}
	return g.lost
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
	if g == nil {
		return clientv3.Compare(clientv3.CreateRevision("\x00etcdlock: no grant"), "=", -1)
	}
	return clientv3.Compare(clientv3.CreateRevision(g.name), "=", g.rev)
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
// way the Guard is released and the key does not stay.
func (g *Guard) Unlock(ctx context.Context) error {
	if g == nil || g.l == nil {
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
			return lockError("Unlock", g.key, g.owner, ctxerr.Of(ctx))
		}
	}
	defer func() { <-g.sem }()
	l := g.l
	l.mu.Lock()
	if g.state != held {
		l.doubles++
		l.mu.Unlock()
		return nil
	}
	lostBefore := g.lostClosed
	g.releasing = true
	l.mu.Unlock()

	var err error
	gone := false
	select {
	case <-l.closed:
		// Close revoked the lease and lost every grant: nothing to delete.
		gone = true
	default:
		var resp *clientv3.TxnResponse
		resp, err = l.client.Txn(ctx).If(g.IsOwner()).Then(clientv3.OpDelete(g.name)).Commit()
		if err != nil {
			l.janitorAdd(g.name, g.rev)
		} else {
			gone = !resp.Succeeded
		}
	}
	now := time.Now()
	l.mu.Lock()
	l.unwatchLocked(g)
	delete(l.live, g)
	l.forgetLocked(g)
	g.state = released
	l.held--
	if gone && !g.lostClosed {
		g.lostClosed = true
		close(g.lost)
	}
	hold := now.Sub(g.granted)
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
	case err != nil:
		return lockError("Unlock", g.key, g.owner, l.callError(ctx, err))
	case lostBefore || gone:
		return lockError("Unlock", g.key, g.owner, ErrLost)
	}
	return nil
}
