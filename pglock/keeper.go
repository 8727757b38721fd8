package pglock

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/ctxerr"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A Locker's session, on its side. A Locker has one session row at a time
// (session.go); every call it writes names it. The kit (package backend)
// renews it every third of its TTL through the engine's Renew and keeps
// its deadline: the send time of the last renewal the server confirmed
// (or of the session's creation) plus the TTL, less a tenth. The session
// ends when the server says it has expired (a renewal, or an enqueue,
// finds it so: it never comes back), or when its deadline passes without
// a renewal. Then every grant on it is lost (Lost closes), every queued
// call on it queues again under the next session, the old row is deleted
// in the background (so that its calls are dead at once, not at its
// expiry: retried for up to twice the TTL), and the keeper makes a new
// session for later calls: the Locker does not die with its session, as
// etcdlock's does not with its lease.

// keeper keeps a Locker's session: it creates it, hands the current one
// to calls (current), and replaces it when it ends (loop). New sets the
// fields that come from the Locker; they do not change after.
type keeper struct {
	mu   *sync.Mutex // the Core's mutex: guards cur, id, ready and ended
	k    *backend.Core
	pool *pgxpool.Pool
	sp   space
	info sessionInfo
	ttl  time.Duration
	l    *listener // renewals go on its connection while it is up

	cur     *backend.Session // the current session; nil while a new one is made
	id      int64            // cur's id in fairlock_sessions
	ready   chan struct{}    // closed once cur is set
	replace chan struct{}    // cap 1: the current session ended; make another
	ended   []int64          // sessions given up, whose rows are still to delete
}

// newKeeper returns a keeper with no session yet.
func newKeeper(k *backend.Core, pool *pgxpool.Pool, sp space, info sessionInfo, ttl time.Duration) *keeper {
	return &keeper{
		mu: k.Mu(), k: k, pool: pool, sp: sp, info: info, ttl: ttl,
		ready: make(chan struct{}), replace: make(chan struct{}, 1),
	}
}

// sessionID returns the id in fairlock_sessions of one of the kit's
// sessions (named with it).
func sessionID(s *backend.Session) int64 {
	id, _ := strconv.ParseInt(s.ID(), 10, 64)
	return id
}

// create makes a new session row and records it as the current session.
func (kp *keeper) create(ctx context.Context) error {
	sent := time.Now()
	id, err := createSession(ctx, kp.pool, kp.sp, kp.info, kp.ttl)
	if err != nil {
		return err
	}
	s := kp.k.StartSession(strconv.FormatInt(id, 10), sent, kp.ttl)
	kp.mu.Lock()
	kp.cur, kp.id = s, id
	close(kp.ready)
	kp.mu.Unlock()
	return nil
}

// current returns the session a call should write under and its id,
// waiting for a new one while the last is being replaced. It fails with
// the context's error or fairlock.ErrClosed.
func (kp *keeper) current(ctx context.Context) (*backend.Session, int64, error) {
	closing := kp.k.Closing()
	for {
		kp.mu.Lock()
		if closing.Err() != nil {
			kp.mu.Unlock()
			return nil, 0, fairlock.ErrClosed
		}
		s, id, ch := kp.cur, kp.id, kp.ready
		kp.mu.Unlock()
		if s != nil {
			return s, id, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, 0, ctxerr.Of(ctx)
		case <-closing.Done():
			return nil, 0, fairlock.ErrClosed
		}
	}
}

// expired ends s: the server says it has expired (an enqueue found it
// so). Its calls are lost, and loop makes the next session.
func (kp *keeper) expired(s *backend.Session) {
	kp.mu.Lock()
	kp.k.EndSessionLocked(s)
	kp.mu.Unlock()
}

// endedLocked is the engine's SessionEndedLocked: s is given up; if it is
// the current one, calls wait for the next, which loop makes, and its row
// is deleted in the background. mu is held.
func (kp *keeper) endedLocked(s *backend.Session) {
	kp.ended = append(kp.ended, sessionID(s))
	if kp.cur == s {
		kp.cur, kp.id = nil, 0
		kp.ready = make(chan struct{})
	}
	select {
	case kp.replace <- struct{}{}:
	default:
	}
}

// loop deletes the rows of the sessions that ended and makes a new
// session when the current one ended, until the background context
// ends. It runs in its own goroutine.
func (kp *keeper) loop() {
	bg := kp.k.Background()
	for {
		select {
		case <-kp.replace:
		case <-bg.Done():
			return
		}
		kp.mu.Lock()
		old := kp.ended
		kp.ended = nil
		need := kp.cur == nil
		kp.mu.Unlock()
		for _, id := range old {
			kp.k.Go(func() { kp.endLater(id) })
		}
		if !need {
			continue
		}
		retry := backend.NewBackoff()
		for {
			ctx, cancel := context.WithTimeout(bg, backend.CleanupTimeout)
			err := kp.create(ctx)
			cancel()
			if err == nil {
				break
			}
			if bg.Err() != nil {
				return
			}
			kp.k.Logger().Warn("pglock: creating a session failed; retrying", "locker", kp.k.Name(), "error", err)
			if !retry.Wait(bg) {
				return
			}
		}
	}
}

// endLater deletes the row of a session the Locker gave up, so that the
// calls still written under it (grants lost to a renewal deadline while
// the database was unreachable, say) do not keep others waiting until it
// expires. It retries until the delete succeeds, for at most twice the
// TTL (by then the session has expired on the server anyway), or until
// the Locker closes; Shutdown then deletes the rows left.
func (kp *keeper) endLater(id int64) {
	bg := kp.k.Background()
	giveUp := time.Now().Add(2 * kp.ttl)
	retry := backend.NewBackoff()
	for {
		ctx, cancel := context.WithTimeout(bg, backend.CleanupTimeout)
		err := endSession(ctx, kp.pool, id)
		cancel()
		if err == nil || !time.Now().Before(giveUp) {
			return
		}
		if !retry.Wait(bg) {
			kp.mu.Lock()
			kp.ended = append(kp.ended, id)
			kp.mu.Unlock()
			return
		}
	}
}

// renew renews session id, reporting which of seqs are missing. The
// renewal goes on the listening connection, which is the Locker's alone,
// so that calls that keep every connection of the pool busy (or the
// application's own queries) cannot delay it past the session's deadline;
// on a connection of the pool while the listening one is down. In a round
// after one that ran out of its bound (attempt > 0), one more renewal is
// sent at once on a connection of the pool (two while the listening
// connection is down), and the first that succeeds wins: a connection
// that stopped answering holds up one of them at most. It returns when
// the renewal was sent.
func (kp *keeper) renew(ctx context.Context, id int64, seqs []int64, attempt int) (sent time.Time, alive bool, missing []int64, err error) {
	type result struct {
		alive   bool
		missing []int64
		err     error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var paths []batcher // nil: the listening connection
	listening := kp.l != nil && kp.l.serving.Load()
	if listening {
		paths = append(paths, nil)
	}
	if !listening || attempt > 0 {
		paths = append(paths, kp.pool)
	}
	if !listening && attempt > 0 {
		paths = append(paths, kp.pool)
	}
	n := len(paths)
	got := make(chan result, n)
	sent = time.Now()
	for _, via := range paths {
		go func() {
			var r result
			if via != nil {
				r.alive, r.missing, r.err = renewSession(ctx, via, id, seqs)
			} else {
				// Read only once do returned nil: the job has ended.
				var a bool
				var m []int64
				r.err = kp.l.do(ctx, func(ctx context.Context, conn *pgx.Conn) (err error) {
					a, m, err = renewSession(ctx, conn, id, seqs)
					return err
				})
				if r.err == nil {
					r.alive, r.missing = a, m
				}
			}
			got <- r
		}()
	}
	var settled *result
	for range n {
		r := <-got
		switch {
		case settled == nil && r.err == nil:
			settled = &r
			cancel()
		case r.err != nil:
			err = r.err
		}
	}
	if settled != nil {
		return sent, settled.alive, settled.missing, nil
	}
	return sent, false, nil, err
}

// shutdown deletes the rows of the current session and of those that
// ended, within ctx: every call still written under them is dead from
// then on. It returns the first error.
func (kp *keeper) shutdown(ctx context.Context) error {
	kp.mu.Lock()
	ids := kp.ended
	kp.ended = nil
	if kp.cur != nil {
		ids = append(ids, kp.id)
		kp.cur, kp.id = nil, 0
	}
	kp.mu.Unlock()
	var first error
	for _, id := range ids {
		if err := endSession(ctx, kp.pool, id); err != nil && first == nil {
			first = err
		}
	}
	return first
}
