package pglock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/keylock"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A Locker's life: New and NewSemaphore make its core (package backend)
// and engine (engine.go), check the tables (schema.go), make its session
// (keeper.go), start its listening connection (listen.go) and sweep its
// prefix; Locked reads a key's queue, and Close ends it all. The calls on
// keys are the kit's (backend.Locker and backend.Semaphore, which Locker
// and Semaphore embed), the grant's methods in guard.go.

// startTimeout bounds New's round trips: the tables' check, the session,
// the listening connection and its probe.
const startTimeout = 10 * time.Second

// sweepKeys is how many keys one round of New's sweep purges, and
// sweepRounds how many rounds it makes at most.
const (
	sweepKeys   = 100
	sweepRounds = 10
)

// Locker is a fair, strict-FIFO keyed lock with shared holds, shared by
// every process that makes one with the same database and prefix. Make
// one with New; the zero Locker is not usable. All methods are safe for
// concurrent use. It is a keylock.RWLocker; every Lease it returns is a
// *Guard.
//
// A Locker holds one connection of its own (taken from the pool and
// hijacked, so the pool may open another in its place: it LISTENs for
// grants), one session row renewed every third of the TTL, and four
// goroutines (the listener, the session's renewal, its replacement, and a
// janitor that retries removals that failed); and, while they run, one
// goroutine that sweeps the prefix after New, one per enqueueing round
// trip still running for a call that returned, one or two per renewal
// round, and one per session row being deleted. Its
// calls borrow a connection of the pool for each round trip and none
// while they wait. Close stops them all.
type Locker struct {
	backend.Locker // Lock, TryLock, RLock, TryRLock, Wait, Calls, Close
	e              *engine
}

// Semaphore is a keyed weighted semaphore of n units per key, head-of-line
// FIFO across every process that makes one with the same database, prefix
// and n: a call is granted when the units of every call ahead of it in
// its key's queue (held or queued) plus its own fit in n, so a large
// request at the head keeps smaller ones behind it waiting, and none
// starves. Make one with NewSemaphore. It is a keylock.Semaphore; every
// Lease it returns is a *Guard. It holds what a Locker holds.
type Semaphore struct {
	backend.Semaphore // Acquire, TryAcquire, Calls, Close
	e                 *engine
}

var (
	_ keylock.RWLocker  = (*Locker)(nil)
	_ keylock.Semaphore = (*Semaphore)(nil)
	_ keylock.Lister    = (*Locker)(nil)
	_ keylock.Lister    = (*Semaphore)(nil)
)

// New returns a Locker whose queues live under prefix in the database
// that pool connects to. Lockers in any number of processes that use the
// same database and prefix exclude each other, key by key. prefix must
// not be empty; it is any string, stored as bytes (a Locker and a
// Semaphore must not share one). A nil Option is ignored.
//
// New checks that the tables exist and that this role may use them,
// creating them (Schema) when they are missing; it fails with an error
// that quotes Schema and names the grants needed when it cannot. It
// creates the Locker's session row and starts its listening connection,
// checking that notices reach it: through a connection pooler in
// transaction or statement mode (PgBouncer's pool_mode=transaction) they
// do not, and New fails with an error that names it. All of this is a few
// round trips, bounded by 10 s. Then, in the background, it purges the
// rows that dead sessions left on the prefix's keys (a key nobody locks
// again would otherwise keep a crashed process's rows) and deletes the
// expired sessions of the prefix.
//
// The pool must stay open until Close has returned. Its size bounds how
// many of the Locker's round trips run at once, not how many calls wait:
// a waiting call holds no connection.
func New(pool *pgxpool.Pool, prefix string, opts ...Option) (*Locker, error) {
	k, e, err := start(pool, prefix, 0, "pglock.Locker", "pglock", opts)
	if err != nil {
		return nil, fmt.Errorf("pglock: New: %w", err)
	}
	return &Locker{backend.NewLocker(k, guardOf), e}, nil
}

// NewSemaphore returns a Semaphore of n units per key whose queues live
// under prefix, as New. Every process on the prefix must use the same n:
// an Acquire whose key's queue holds units of another n fails with
// fairlock.ErrInvalidWeight naming both sizes, and writes nothing. It
// fails if n < 1.
func NewSemaphore(pool *pgxpool.Pool, prefix string, n int64, opts ...Option) (*Semaphore, error) {
	if n < 1 {
		return nil, fmt.Errorf("pglock: NewSemaphore: %d units per key; want at least 1", n)
	}
	k, e, err := start(pool, prefix, n, "pglock.Semaphore", "pglock-semaphore", opts)
	if err != nil {
		return nil, fmt.Errorf("pglock: NewSemaphore: %w", err)
	}
	return &Semaphore{backend.NewSemaphore(k, guardOf), e}, nil
}

// start makes a Locker's or Semaphore's core and engine, its session and
// its listening connection, and starts their goroutines.
func start(pool *pgxpool.Pool, prefix string, n int64, kind, stem string, opts []Option) (*backend.Core, *engine, error) {
	if pool == nil {
		return nil, nil, errors.New("nil pool")
	}
	if prefix == "" {
		return nil, nil, errors.New("empty prefix")
	}
	s := backend.NewSettings(opts)
	s.TTL = ttlOf(s.TTL)
	k := backend.New(backend.Config{Package: "pglock", Kind: kind, Size: n, DefaultName: stem}, s)
	sp := newSpace(prefix)
	e := &engine{k: k, pool: pool, sp: sp, size: n}
	e.sessions = newKeeper(k, pool, sp, sessionInfo{Name: k.Name(), Host: k.Process().Host, PID: k.Process().PID}, s.TTL)

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := ensureSchema(ctx, pool); err != nil {
		return nil, nil, err
	}
	if err := e.sessions.Start(ctx); err != nil {
		k.Abort()
		return nil, nil, err
	}
	conn, err := dialListener(ctx, pool, sp.channel)
	if err != nil {
		k.Abort()
		end, cancel := context.WithTimeout(context.Background(), backend.CleanupTimeout)
		e.sessions.Shutdown(end)
		cancel()
		return nil, nil, err
	}
	var down bool // whether the connection is down: only the listener's goroutine reads and writes it
	notice := func(refs []callRef) {
		ids := make([]string, len(refs))
		for i, r := range refs {
			ids[i] = r.String()
		}
		e.granted(ids)
	}
	up := func() {
		down = false
		k.Logger().Info("pglock: listening connection back; re-reading the keys waited on", "locker", k.Name(), "channel", sp.channel)
		k.Reread()
	}
	lost := func(err error) {
		if !down {
			down = true
			k.Logger().Warn("pglock: listening connection down; reconnecting", "locker", k.Name(), "channel", sp.channel, "error", err)
		}
	}
	l := newListener(pool, sp.channel, s.TTL/3, notice, up, lost)
	e.sessions.l = l
	bg := k.Background()
	k.Go(func() { l.run(bg, conn) })
	k.Go(e.sessions.Run)
	k.Go(func() { e.sweep(bg) })
	k.Start(e)
	return k, e, nil
}

// sweep purges the dead rows of the prefix's keys, sweepKeys keys a
// round, until a round finds fewer or sweepRounds have run; it logs a
// failure and stops.
func (e *engine) sweep(ctx context.Context) {
	for range sweepRounds {
		rctx, cancel := context.WithTimeout(ctx, backend.CleanupTimeout)
		n, err := sweep(rctx, e.pool, e.sp, sweepKeys)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				e.k.Logger().Warn("pglock: sweeping dead rows failed", "locker", e.k.Name(), "error", err)
			}
			return
		}
		if n < sweepKeys {
			return
		}
	}
}

// locked reports whether key has a holder or a queued call, for Locked.
func (e *engine) locked(ctx context.Context, key string) (bool, error) {
	var held bool
	var err, lerr error // held, lerr: written by the goroutine, read only once it returned
	if e.k.Bounded(ctx, func() {
		_, lerr = retried(ctx, func() (err error) {
			held, err = locked(ctx, e.pool, e.sp, key)
			return err
		})
	}) {
		err = lerr
	} else {
		err = ctx.Err()
	}
	if err != nil {
		return false, backend.CallError(ctx, "Locked", key, err)
	}
	return held, nil
}

// Locked reports whether key has a holder or a queued call in any process
// at this instant: whether the key has a live row that is not a Wait's (a
// Wait holds nothing; the rows of Waits whose turn has come, which their
// Lockers delete a moment after the Waits return, keep nobody waiting).
// It is one round trip, which deletes the key's dead rows first (and
// grants the calls behind them), so a crashed holder's row does not
// count once its session has expired. It returns an error
// wrapping the context's or the database's error if the round trip fails.
// A nil ctx panics.
func (l *Locker) Locked(ctx context.Context, key string) (bool, error) {
	if ctx == nil {
		panic("pglock: Locked with a nil context")
	}
	return l.e.locked(ctx, key)
}
