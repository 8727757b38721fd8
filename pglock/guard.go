package pglock

import (
	"context"
	"errors"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
	"github.com/jackc/pgx/v5"
)

// Guard is one grant of a key, returned by Lock, TryLock, RLock,
// TryRLock, Acquire and TryAcquire; its Unlock releases it, and Fence
// makes a transaction of the caller's own count only while it is current.
// It is the kit's record of the call (package backend) under this
// package's name, so returning it allocates nothing more; the
// PostgreSQL-specific Fence is one type assertion away:
//
//	lease, err := locks.Lock(ctx, "order-7")
//	…
//	tx, err := pool.Begin(ctx)
//	…
//	if err := lease.(*pglock.Guard).Fence(ctx, tx); err != nil { … } // rolled back: the grant was lost
//	… writes …
//	err = tx.Commit(ctx) // made under the lock
//	…
//	lease.Unlock(ctx) // after the transaction, never inside it
//
// Its methods are safe for concurrent use, and Unlock may be called from
// any goroutine. A nil *Guard holds nothing: Unlock does nothing, Token
// is 0, Lost is nil, Fence fails with ErrLost.
type Guard backend.Call

var _ keylock.Lease = (*Guard)(nil)

// guardOf is a grant as the Lease this package returns.
func guardOf(c *backend.Call) keylock.Lease { return (*Guard)(c) }

// call returns the kit's record behind g.
func (g *Guard) call() *backend.Call { return (*backend.Call)(g) }

// Key returns the key the grant is for.
func (g *Guard) Key() string { return g.call().Key() }

// Token returns the grant's fencing token: the id of its call's row in
// fairlock_calls, which the table's identity sequence gave out when the
// call queued. Calls are granted in id order, and a key's ids are given
// out under its lock, so every later grant of the same key under the
// same prefix, in any process and any mode, has a larger token; a store
// that remembers the largest token it has accepted for a resource and
// refuses smaller ones refuses the writes of a grant that has been lost
// and taken over (Kleppmann's fencing tokens, "How to do distributed
// locking", 2016). Tokens never go back: the sequence is logged and
// survives a crash or restart of the server. They are shared by every
// key (a token is larger than every earlier token of the database), so
// they order grants of one key, and say nothing of two keys. For writes
// to the same database, Fence is the stronger check. A nil Guard's token
// is 0.
func (g *Guard) Token() uint64 { return g.call().Token() }

// Lost returns a channel that is closed when the grant is lost while it
// is held: its session expired on the server (seen by the next renewal),
// someone deleted its row, the Locker could not renew the session before
// its deadline (see Deadline), or Close ended the grant. Unlock does not
// close it. Another process may hold the key as soon as it is lost: stop
// writing, and fence what you write (Fence, or Token).
func (g *Guard) Lost() <-chan struct{} { return g.call().Lost() }

// Deadline returns the instant, on this process's monotonic clock, before
// which no other call can be granted the key even if this process stops
// right now: the send time of the last renewal of the grant's session
// that the server confirmed (or of the session's creation), plus the TTL,
// less a tenth of it (for the two clocks' rates, which may differ by up
// to 10%). PostgreSQL expires the session by its own clock, counted from
// when it ran the renewal, after the send. The deadline only moves forward
// while the grant is held, and Lost closes when it passes without a
// renewal. After Unlock, or once the grant was lost, it is the instant
// that happened. keylock.Valid(g) is the check to make right before an
// action that must not run unprotected; for writes to the same database,
// Fence is the one that cannot be wrong.
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

// Unlock releases the grant: one round trip deletes the grant's row by
// its name (session and number), so it deletes only this grant's row,
// never a later grant's, even if retried late, deletes the dead rows at
// the head of the key's queue, and announces the calls it grants (their Lockers hear of it on
// their listening connections). It is made with ctx; a nil ctx means
// context.Background. A round trip whose connection fails is sent again,
// a few times within ctx. Unlock returns when ctx ends even if the round
// trip goes on.
//
// Unlock waits while a transaction that Fenced the grant is open: the
// grant stays current until that transaction ends. So never call it from
// inside the grant's own fenced transaction (it would wait for the
// transaction, which waits for it, until ctx ends): commit or roll back
// first.
//
// Unlock is idempotent: a second Unlock of the Guard does nothing and
// returns nil. It returns an error wrapping ErrLost if the grant was lost
// before Unlock deleted its row (Lost is then closed): the row was
// already gone, or its session had expired on the server (any statement
// on the key could have purged the row and granted the key to another).
// If the round trip fails (ctx ends, the database is unreachable) Unlock
// returns an error wrapping that failure (the context's error if ctx
// ended first), and the Locker keeps deleting the row in the background
// until it succeeds (Close makes a last try); meanwhile the session's TTL
// bounds how long the row can block others once the Locker is gone. A
// release that fails for a grant that was lost before Unlock began, or
// whose session ended while Unlock ran, returns an error wrapping both
// ErrLost and the failure. Either way the Guard is released.
func (g *Guard) Unlock(ctx context.Context) error { return g.call().Unlock(ctx) }

// Fence, inside the caller's own transaction tx on the same database as
// the Locker's pool, returns nil only if the grant is still current, and
// keeps it current until tx ends: it reads the grant's row, if its
// session has not expired by the server's clock at that statement
// (clock_timestamp(), not the transaction's start), and locks it FOR
// SHARE. While tx holds that lock nothing deletes the row, not even past
// the session's expiry (the purge of dead rows skips locked rows, and
// Unlock waits), so no other call is granted the key before tx commits or
// rolls back: a write that tx commits after Fence returned nil was made
// under the lock. Another process's write under a later grant of the key
// is therefore ordered after tx, and a paused holder that wakes after
// losing the grant has its fenced transaction refused: a lock and the
// data it guards in one database, which no lock kept elsewhere can give.
//
// Fence is one round trip on tx's connection, made with ctx. It first
// checks this process's view (keylock.Valid: Lost not closed, Deadline
// ahead), and fails without a round trip if the grant is lost, unlocked
// or past its deadline.
//
// tx must be READ COMMITTED (PostgreSQL's default), or begun after the
// grant: an older REPEATABLE READ or SERIALIZABLE snapshot does not show
// the grant's row, and Fence then says it is lost. A long fenced
// transaction delays a takeover: if this process dies while tx is open
// (its connection is held by another pool, or the database keeps the
// session until it notices), the key stays held until tx ends. Do not
// Unlock from inside tx (see Unlock).
//
// Fence returns nil, or a *fairlock.LockError with Op "Fence" naming the
// key and the owner of ctx, wrapping ErrLost if the grant is not current,
// or the database's or the context's error (tx is then aborted, as after
// any failed statement; roll it back).
func (g *Guard) Fence(ctx context.Context, tx pgx.Tx) error {
	if ctx == nil {
		panic("pglock: Fence with a nil context")
	}
	if g == nil {
		return backend.CallError(ctx, "Fence", "", ErrLost)
	}
	c := g.call()
	if tx == nil {
		return backend.CallError(ctx, "Fence", c.Key(), errors.New("pglock: nil transaction"))
	}
	if !keylock.Valid(g) {
		return backend.CallError(ctx, "Fence", c.Key(), fairlock.ErrLost)
	}
	ref := refOf(c.ID())
	if err := fence(ctx, tx, ref.Session, int64(c.Token())); err != nil {
		return backend.CallError(ctx, "Fence", c.Key(), err)
	}
	return nil
}

// ErrLost is the error, wrapped in a *fairlock.LockError, that
// Guard.Unlock returns for a grant that was lost before it was unlocked,
// and that Guard.Fence returns for a grant that is no longer current: its
// session expired on the server (its process stopped renewing it for a
// TTL), its row was deleted by someone else, or the Locker could not renew
// the session before its deadline (see Guard.Lost). Another process may
// have held the key since. It is fairlock.ErrLost, the sentinel every
// backend wraps.
var ErrLost = fairlock.ErrLost
