package pglock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Notices. Each Locker keeps one connection of its own that LISTENs on
// its prefix's channel (walk.go says what is sent there), taken from the
// pool (so the pool's dial hooks apply) and then hijacked: it is no
// longer the pool's, and the pool may open another in its place. A
// waiting call holds no connection; its Locker's listener hears its
// grant. Notices sent while the listening connection is down are lost
// (PostgreSQL keeps none for a session that is not listening), so after
// each (re)connection the Locker re-reads the keys it waits on (readKey),
// and it also does so on a timer, which covers a holder's expiry, whose
// purge nobody would otherwise trigger.
//
// # Connection poolers
//
// A pooler that gives a client's successive transactions to different
// server sessions (PgBouncer with pool_mode=transaction or statement)
// cannot carry LISTEN: the session that ran LISTEN goes back to the
// pooler's pool, and the notices sent to it never reach the client,
// which sits idle between transactions. pglock does not fall back to
// polling for it: dialListener checks, each time it connects, that a
// notice sent from another connection arrives, and fails with
// errNoNotices naming the pooler if none does. (Everything else pglock
// sends would work through such a pooler: each round trip is one
// transaction and it uses no session state. pgx's prepared statements
// need PgBouncer 1.21 or newer with max_prepared_statements, or a pool
// in one of pgx's exec modes that prepares nothing.) Connect pglock's
// pool directly, or through a pooler in session mode.

// probeTimeout bounds how long dialListener waits for its own notice (a
// variable for the tests of a pooler, which wait it out).
var probeTimeout = 5 * time.Second

// probePrefix starts the payload of dialListener's probe notices, which
// parseNotice ignores (Lockers of the prefix hear them too).
const probePrefix = "probe "

// errNoNotices is the error of dialListener when its probe notice does
// not arrive.
type errNoNotices struct {
	channel string
}

func (e *errNoNotices) Error() string {
	return fmt.Sprintf("pglock: LISTEN %s: a notice sent from another connection did not arrive within %v: "+
		"pglock needs LISTEN/NOTIFY, which a connection pooler in transaction or statement mode "+
		"(PgBouncer's pool_mode=transaction) does not carry; connect to PostgreSQL directly or through a pooler in session mode",
		e.channel, probeTimeout)
}

// parseNotice returns the calls a notice's payload names ("session:seq"
// words separated by spaces), skipping any word that is not one (a
// probe's).
func parseNotice(payload string) []callRef {
	if strings.HasPrefix(payload, probePrefix) {
		return nil
	}
	words := strings.Fields(payload)
	refs := make([]callRef, 0, len(words))
	for _, w := range words {
		a, b, ok := strings.Cut(w, ":")
		if !ok {
			continue
		}
		s, err1 := strconv.ParseInt(a, 10, 64)
		q, err2 := strconv.ParseInt(b, 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		refs = append(refs, callRef{Session: s, Seq: q})
	}
	return refs
}

// dialListener takes a connection from pool, hijacks it, runs LISTEN on
// channel, and checks that notices reach it: it sends a probe notice from
// another connection of the pool and waits for it (at most probeTimeout).
// Notices of grants that arrive meanwhile are dropped: the caller re-reads
// its keys once dialListener returns. It is about three round trips, and
// returns the connection, which the caller closes. Errors: *errNoNotices
// if the probe does not arrive (a pooler in transaction mode); the
// database's, the connection's or the context's otherwise.
func dialListener(ctx context.Context, pool *pgxpool.Pool, channel string) (*pgx.Conn, error) {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("pglock: LISTEN %s: %w", channel, err)
	}
	conn := pc.Hijack()
	fail := func(err error) (*pgx.Conn, error) {
		closeConn(conn)
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		return fail(fmt.Errorf("pglock: LISTEN %s: %w", channel, err))
	}
	var nonce [8]byte
	rand.Read(nonce[:])
	probe := probePrefix + hex.EncodeToString(nonce[:])
	if _, err := pool.Exec(ctx, "SELECT pg_notify($1, $2)", channel, probe); err != nil {
		return fail(fmt.Errorf("pglock: LISTEN %s: send a probe notice: %w", channel, err))
	}
	wait, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(wait)
		if err != nil {
			if ctx.Err() == nil && wait.Err() != nil {
				return fail(&errNoNotices{channel: channel})
			}
			return fail(fmt.Errorf("pglock: LISTEN %s: wait for the probe notice: %w", channel, err))
		}
		if n.Payload == probe {
			return conn, nil
		}
	}
}

// closeConn closes a listening connection, bounded (it sends Terminate).
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c.Close(ctx)
}

// listener keeps a LISTEN connection on a channel and hands its notices
// on.
type listener struct {
	pool    *pgxpool.Pool
	channel string
	// check (positive) is how long the connection may sit idle before
	// it is checked with a query: a connection that died silently (a
	// peer gone without a reset) would otherwise never report an error.
	check time.Duration
	// notice is called with the calls each notice names, in the order
	// PostgreSQL delivered them (the order the transactions committed).
	notice func([]callRef)
	// up is called after each reconnection, once LISTEN works again: the
	// notices of the gap are lost, and the caller re-reads its keys.
	up func()
	// down is called with each error that cost the connection, or that
	// a reconnection failed with.
	down func(error)

	// Jobs: round trips that others run on the connection between its
	// waits for notices (do).
	jobs    chan *connJob
	serving atomic.Bool // the connection is up and LISTENs: do may send jobs
	mu      sync.Mutex  // guards cancel
	cancel  func()      // ends the current wait for a notice; nil between waits
}

// connJob is a round trip that do hands the listening goroutine.
type connJob struct {
	ctx  context.Context
	fn   func(context.Context, *pgx.Conn) error
	done chan error // cap 1
}

// errNotListening is do's error while the listening connection is down.
var errNotListening = errors.New("pglock: the listening connection is down")

// newListener returns a listener of channel on pool; run serves it.
func newListener(pool *pgxpool.Pool, channel string, check time.Duration, notice func([]callRef), up func(), down func(error)) *listener {
	return &listener{pool: pool, channel: channel, check: check, notice: notice, up: up, down: down, jobs: make(chan *connJob, 4)}
}

// do runs fn on the listening connection, between two of its waits for
// notices (a wait is cut short for it), and returns fn's error: a round
// trip that no call of the pool can delay, since the connection is the
// listener's alone (the Locker's session renewal). It fails at once with
// errNotListening while the connection is down, and with ctx's error if
// ctx ends first (fn then fails with it, if it has started; its round
// trip on a connection that stopped answering costs the connection,
// which the listener replaces). fn must not keep the connection.
func (l *listener) do(ctx context.Context, fn func(context.Context, *pgx.Conn) error) error {
	if !l.serving.Load() {
		return errNotListening
	}
	j := &connJob{ctx: ctx, fn: fn, done: make(chan error, 1)}
	select {
	case l.jobs <- j:
	case <-ctx.Done():
		return ctx.Err()
	}
	l.mu.Lock()
	if l.cancel != nil {
		l.cancel()
	}
	l.mu.Unlock()
	select {
	case err := <-j.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runJobs runs the jobs waiting, on conn. It returns the error of one
// that failed in a way that leaves the connection in doubt (anything but
// PostgreSQL refusing a statement): the caller replaces it.
func (l *listener) runJobs(conn *pgx.Conn) error {
	for {
		var j *connJob
		select {
		case j = <-l.jobs:
		default:
			return nil
		}
		if err := j.ctx.Err(); err != nil {
			j.done <- err
			continue
		}
		err := j.fn(j.ctx, conn)
		j.done <- err
		if err != nil && !serverRefused(err) {
			return err
		}
	}
}

// failJobs fails the jobs waiting: the connection is down.
func (l *listener) failJobs() {
	for {
		select {
		case j := <-l.jobs:
			j.done <- errNotListening
		default:
			return
		}
	}
}

// run serves conn, from dialListener, until ctx ends, and then closes it.
// When the connection fails it calls l.down and dials again (every
// 50 ms at first, then less often, up to l.check apart), calling l.up
// after each success. Between waits for notices it runs the jobs that do
// hands it. It blocks; the callbacks run on its goroutine, so a slow
// callback delays the next notice.
func (l *listener) run(ctx context.Context, conn *pgx.Conn) {
	backoff := 50 * time.Millisecond
	lost := func(err error) {
		l.serving.Store(false)
		l.failJobs()
		closeConn(conn)
		conn = nil
		l.down(err)
	}
	defer func() {
		l.serving.Store(false)
		l.failJobs()
	}()
	l.serving.Store(conn != nil)
	for {
		if conn == nil {
			c, err := dialListener(ctx, l.pool, l.channel)
			if ctx.Err() != nil {
				if c != nil {
					closeConn(c)
				}
				return
			}
			if err != nil {
				l.down(err)
				t := time.NewTimer(backoff)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
				backoff = min(2*backoff, max(l.check, 50*time.Millisecond))
				continue
			}
			conn, backoff = c, 50*time.Millisecond
			l.serving.Store(true)
			l.up()
		}
		if err := l.runJobs(conn); err != nil {
			if ctx.Err() != nil {
				closeConn(conn)
				return
			}
			lost(fmt.Errorf("pglock: LISTEN %s: a round trip on the connection: %w", l.channel, err))
			continue
		}
		wait, cancel := context.WithTimeout(ctx, l.check)
		l.mu.Lock()
		l.cancel = cancel
		if len(l.jobs) > 0 {
			cancel()
		}
		l.mu.Unlock()
		n, err := conn.WaitForNotification(wait)
		l.mu.Lock()
		l.cancel = nil
		l.mu.Unlock()
		cancel()
		if err == nil {
			if refs := parseNotice(n.Payload); len(refs) > 0 {
				l.notice(refs)
			}
			continue
		}
		if ctx.Err() != nil {
			closeConn(conn)
			return
		}
		if errors.Is(err, context.Canceled) && !conn.IsClosed() {
			continue // cut short for a job
		}
		if pgconn.Timeout(err) && !conn.IsClosed() {
			// Idle for l.check: make sure the connection still answers.
			ping, cancel := context.WithTimeout(ctx, l.check)
			err = conn.Ping(ping)
			cancel()
			if err == nil {
				continue
			}
			if ctx.Err() != nil {
				closeConn(conn)
				return
			}
		}
		lost(fmt.Errorf("pglock: LISTEN %s: %w", l.channel, err))
	}
}
