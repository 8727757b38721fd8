package pglock

import (
	"context"
	"strconv"
	"time"

	"github.com/fairlock/fairlock/backend"
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

// keeper keeps a Locker's session: the kit's Keeper (which makes the
// current session, hands it to calls, replaces it when it ends and
// deletes the rows of those given up) on PostgreSQL's session rows, and
// the renewals. newKeeper sets the fields; they do not change after, but
// for l, which start sets before the Locker starts.
type keeper struct {
	*backend.Keeper
	k    *backend.Core
	pool *pgxpool.Pool
	sp   space
	info sessionInfo
	ttl  time.Duration
	l    *listener // renewals go on its connection while it is up
}

// newKeeper returns k's keeper, with no session yet (Start makes the
// first).
func newKeeper(k *backend.Core, pool *pgxpool.Pool, sp space, info sessionInfo, ttl time.Duration) *keeper {
	kp := &keeper{k: k, pool: pool, sp: sp, info: info, ttl: ttl}
	kp.Keeper = backend.NewKeeper(k, "session", backend.CleanupTimeout, kp.open, kp.end)
	return kp
}

// sessionID returns the id in fairlock_sessions of one of the kit's
// sessions (named with it).
func sessionID(s *backend.Session) int64 {
	id, _ := strconv.ParseInt(s.ID(), 10, 64)
	return id
}

// open writes a new session row (createSession) and starts the kit's
// session for it: the Keeper's open.
func (kp *keeper) open(ctx context.Context) (*backend.Session, error) {
	sent := time.Now()
	id, err := createSession(ctx, kp.pool, kp.sp, kp.info, kp.ttl)
	if err != nil {
		return nil, err
	}
	return kp.k.StartSession(strconv.FormatInt(id, 10), sent, kp.ttl), nil
}

// end deletes s's row (endSession): the Keeper's end.
func (kp *keeper) end(ctx context.Context, s *backend.Session) error {
	return endSession(ctx, kp.pool, sessionID(s))
}

// current returns the session a call should write under and its id
// (Keeper.Current).
func (kp *keeper) current(ctx context.Context) (*backend.Session, int64, error) {
	s, err := kp.Current(ctx)
	if err != nil {
		return nil, 0, err
	}
	return s, sessionID(s), nil
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
