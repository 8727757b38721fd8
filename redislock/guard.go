package redislock

import (
	"context"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
)

// Guard is one grant of a key, returned by Lock, TryLock, RLock,
// TryRLock, Acquire and TryAcquire; its Unlock releases it. It is the
// kit's record of the call (package backend) under this package's name,
// so returning it allocates nothing more. Its methods are safe for
// concurrent use, and Unlock may be called from any goroutine. A nil
// *Guard holds nothing: Unlock does nothing, Token is 0, Lost is nil.
type Guard backend.Call

// guardOf is a grant as the Lease this package returns.
func guardOf(c *backend.Call) keylock.Lease { return (*Guard)(c) }

// call returns the kit's record behind g.
func (g *Guard) call() *backend.Call { return (*backend.Call)(g) }

// Key returns the key the grant is for.
func (g *Guard) Key() string { return g.call().Key() }

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
// grant a key twice, each grant with its own token (docs/distributed.md);
// WithReplicas closes that gap. A nil Guard's token is 0.
func (g *Guard) Token() uint64 { return g.call().Token() }

// Lost returns a channel that is closed when the grant is lost while it
// is held: its session's marker on the key expired on the server (seen by
// the next renewal, or by Unlock), someone removed its entry, the Locker
// could not renew the session before its deadline (see Deadline), or
// Close ended the grant. Unlock does not close it. Another process may
// hold the key as soon as it is lost: stop writing, and fence what you
// write with Token.
func (g *Guard) Lost() <-chan struct{} { return g.call().Lost() }

// Deadline returns the instant, on this process's monotonic clock, before
// which no other call can be granted the key even if this process stops
// right now: the send time of the last script that set or renewed the
// grant's session marker on the key, plus the TTL, less a tenth of it
// (for the two clocks' rates, which may differ by up to 10%). Redis
// expires the marker by its own clock, counted from when it ran the
// command, after the send. The deadline only moves forward while the
// grant is held, and Lost closes when it passes without a renewal. After
// Unlock, or once the grant was lost, it is the instant that happened.
// A failover to a replica that had not received the latest renewal can
// expire the marker earlier: WithReplicas closes that gap.
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
// trip: ownership is this process's bookkeeping.
func (g *Guard) HandOff(to owner.ID) bool { return g.call().HandOff(to) }

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
// block others once this Locker has no other call on the key. A release
// that fails for a grant that was lost before Unlock began, or whose
// session ended while Unlock ran, returns an error wrapping both ErrLost
// and the failure. Either way the Guard is released.
func (g *Guard) Unlock(ctx context.Context) error { return g.call().Unlock(ctx) }

// ErrLost is the error, wrapped in a *fairlock.LockError with Op "Unlock",
// that Guard.Unlock returns for a grant that was lost before it was
// unlocked: its session expired on the server, its entry was removed by
// someone else, or the Locker could not renew the session for about a TTL
// (see Guard.Lost). Another process may have held the key since: anything
// written under the grant must be checked with its fencing token. It is
// fairlock.ErrLost, the sentinel every backend wraps.
var ErrLost = fairlock.ErrLost
