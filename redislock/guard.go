package redislock

import (
	"context"
	"time"

	"github.com/fairlock/fairlock/redislock/internal/ctxerr"
)

// A grant's methods: what its holder reads (Key, Token, Lost) and
// Unlock, which releases it. The Guard type is declared with the core it
// points to, in locker.go.

// Key returns the key the grant is for.
func (g *Guard) Key() string {
	if g == nil {
		return ""
	}
	return g.key
}

// Token returns the grant's fencing token: its entry's score in the key's
// queue, chosen by the server when the call queued. Calls are granted in
// queue order, so every later grant of the same key under the same
// prefix, in any process and any mode, has a larger token; a store that
// remembers the largest token it has accepted for a resource and refuses
// smaller ones refuses the writes of a grant that has been lost and
// taken over (Kleppmann's fencing tokens, "How to do distributed
// locking", 2016).
//
// A token is never below the Redis server's clock in microseconds when
// the call queued (about 1.7e15 in 2024), and above the key's previous
// token. So tokens keep growing across whatever the server restores (an
// RDB snapshot, an append-only file that lost its last second, a replica
// promoted before it received the latest grants) and after the key's
// state expired with the key idle: a later token is larger as long as
// the server's clock (the new primary's, after a failover) reads later
// than it did when the earlier token was handed out. A clock that steps
// back further can hand out a smaller token. Tokens of different keys are
// not comparable: they order grants of one key only. A failover can still
// grant a key twice, each grant with its own token (docs/distributed.md).
// A nil Guard's token is 0.
func (g *Guard) Token() uint64 {
	if g == nil {
		return 0
	}
	return g.token
}

// Lost returns a channel that is closed when the grant is lost while it
// is held: its session's marker on the key expired on the server (seen by
// the next renewal, or by Unlock), someone removed its entry, the Locker could not
// renew the session for about its TTL (the renewal deadline, see WithTTL),
// or Close ended the grant. Unlock does not close it. Another process may
// hold the key as soon as it is lost: stop writing, and fence what you
// write with Token.
func (g *Guard) Lost() <-chan struct{} {
	if g == nil {
		return nil
	}
	return g.lost
}

// Unlock releases the grant: one script removes the grant's entry by its
// unique name, so it removes only this grant's entry, never a later
// grant's, even if retried late, and grants the calls it was blocking
// (their Lockers hear of it on the prefix's channel). It is one round
// trip, made with ctx; a nil ctx means context.Background. Unlock returns
// when ctx ends even if the round trip goes on (go-redis bounds a read by
// a context's deadline only with ContextTimeoutEnabled, else by the
// client's ReadTimeout): the script may still run, and the background
// removal below makes sure of it.
//
// Unlock is idempotent: a second Unlock of the Guard does nothing and
// returns nil. It returns an error wrapping ErrLost if the grant was lost
// before Unlock removed its entry (Lost is then closed): the entry was
// already gone, or its session's marker had expired on the server (any
// script could have purged the entry and granted the key to another). If
// the script fails or does not answer (ctx ends, Redis is unreachable,
// or the connection fails after sending it: it is sent once, never
// retried by go-redis, since a second run would find the entry gone and
// report the grant lost) Unlock returns an error wrapping that failure
// (the context's error if ctx ended first), and the Locker keeps
// removing the entry in the background until it succeeds (Close makes a
// last try); meanwhile the session's TTL bounds how long the entry can
// block others once this Locker has no other call on the key. Either way
// the Guard is released.
func (g *Guard) Unlock(ctx context.Context) error {
	if g == nil || g.c == nil {
		return nil
	}
	if ctx == nil {
		ctx = context.Background()
	}
	// Take the Guard's turn without a look at ctx first: an Unlock with a
	// done ctx must still release (its script then fails and goes to the
	// janitor). Only an Unlock racing another Unlock waits here.
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
	c := g.c
	c.mu.Lock()
	if g.state != held {
		c.doubles++
		c.mu.Unlock()
		return nil
	}
	lostBefore := g.lostClosed
	g.releasing = true
	c.mu.Unlock()

	var err error
	gone := false
	select {
	case <-c.closed:
		gone = true // Close removed the entry and lost the grant
	default:
		var removed bool
		var rerr error
		if c.bounded(ctx, func() { removed, rerr = c.release(ctx, g.key, g.member) }) {
			err = rerr
		} else {
			err = ctxerr.Of(ctx) // the script may still run: the janitor makes sure
		}
		if err != nil {
			c.janitorAdd(g.key, g.member, false)
		} else {
			gone = !removed
		}
	}
	now := time.Now()
	c.mu.Lock()
	delete(c.entries, g.member)
	c.forgetLocked(g)
	g.state = released
	c.held--
	if gone && !g.lostClosed {
		g.lostClosed = true
		close(g.lost)
	}
	hold := now.Sub(g.grantedAt)
	c.signalIdle()
	c.mu.Unlock()
	if c.obs != nil {
		c.obsMu.RLock()
		if !c.obsGone {
			c.obs.Release(hold)
		}
		c.obsMu.RUnlock()
	}
	switch {
	case err != nil:
		return lockError("Unlock", g.key, g.owner, callError(ctx, err))
	case lostBefore || gone:
		return lockError("Unlock", g.key, g.owner, ErrLost)
	}
	return nil
}
