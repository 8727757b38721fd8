package pglock

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/pglock/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// lockAsync calls lock(ctx, key) in a goroutine and returns the channel
// its Lease comes on (buffered: the goroutine never blocks). A failed
// call fails t and sends nil.
func lockAsync(t testing.TB, ctx context.Context, lock func(context.Context, string) (keylock.Lease, error), key string) <-chan keylock.Lease {
	ch := make(chan keylock.Lease, 1)
	go func() {
		g, err := lock(ctx, key)
		if err != nil {
			t.Error(err)
		}
		ch <- g
	}()
	return ch
}

// awaitGrant returns the Lease that a channel of lockAsync delivers,
// failing t with msg if none comes within d, and ending the test at once
// if the call failed (lockAsync has reported its error).
func awaitGrant(t testing.TB, ch <-chan keylock.Lease, d time.Duration, msg string) keylock.Lease {
	t.Helper()
	g := recvWithin(t, ch, d, msg)
	if g == nil {
		t.FailNow()
	}
	return g
}

// notYet fails t if ch has delivered a Lease.
func notYet(t testing.TB, ch <-chan keylock.Lease, what string) {
	t.Helper()
	select {
	case g := <-ch:
		t.Fatalf("%s was granted (token %d) while the key was held", what, g.Token())
	default:
	}
}

// TestLockerSurvivesRestart restarts the server (a fast shutdown, then an
// immediate one, which runs crash recovery) while a Locker holds a key
// and another waits on it in two modes. Across each restart no waiter is
// granted, the holder's grant stays valid and its renewals resume (its
// Deadline moves past the restart), its Unlock reports no loss, and the
// waiters are granted in order (their Locker's listening connection came
// back and re-read the key), with tokens larger than every token given
// before the restart.
func TestLockerSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.StartServer(t)
	// A TTL that a restart on a loaded machine never outlasts: the grant
	// must survive it.
	const ttl = 10 * time.Second
	hp, wp := srv.NewPool(t), srv.NewPool(t)
	prefix := t.Name()
	holder := newLocker(t, hp, prefix, WithTTL(ttl))
	waiter := newLocker(t, wp, prefix, WithTTL(ttl))
	var last uint64
	for _, how := range []pgtest.Shutdown{pgtest.Fast, pgtest.Immediate} {
		g, err := holder.Lock(ctx, "k")
		if err != nil {
			t.Fatalf("before %v: %v", how, err)
		}
		if g.Token() <= last {
			t.Errorf("before %v: token %d after %d", how, g.Token(), last)
		}
		w1 := lockAsync(t, ctx, waiter.Lock, "k")
		awaitRows(t, hp, prefix, "k", 2, 10*time.Second)
		w2 := lockAsync(t, ctx, waiter.RLock, "k")
		awaitRows(t, hp, prefix, "k", 3, 10*time.Second)

		if err := srv.Restart(how); err != nil {
			t.Fatal(err)
		}
		restarted := time.Now()
		awaitValid(t, g, "after "+how.String())
		notYet(t, w1, "the first waiter")
		notYet(t, w2, "the second waiter")
		if _, err := waiter.TryLock(ctx, "k"); !errors.Is(err, fairlock.ErrWouldBlock) {
			t.Errorf("after %v: TryLock of the held key: %v, want ErrWouldBlock", how, err)
		}
		for deadline := time.Now().Add(20 * time.Second); !g.Deadline().After(restarted.Add(ttl / 2)); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("after %v: no renewal confirmed since the restart (deadline %v)", how, g.Deadline())
			}
		}
		notYet(t, w1, "the first waiter")
		if err := g.Unlock(ctx); err != nil {
			t.Errorf("after %v: Unlock of the held grant: %v", how, err)
		}
		g1 := awaitGrant(t, w1, 20*time.Second, "after "+how.String()+": the first waiter was not granted")
		notYet(t, w2, "the second waiter")
		if g1.Token() <= g.Token() {
			t.Errorf("after %v: the waiter's token %d after the holder's %d", how, g1.Token(), g.Token())
		}
		if err := g1.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		g2 := awaitGrant(t, w2, 20*time.Second, "after "+how.String()+": the second waiter was not granted")
		last = g2.Token()
		if err := g2.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	awaitRows(t, hp, prefix, "k", 0, 10*time.Second)
}

// TestLockerSurvivesTerminatedConnections terminates every server
// connection of two Lockers (pg_terminate_backend: their listening
// connections and their pools'), one holding a key and one waiting for
// it. The listening connections come back, the grant stays valid and its
// Unlock reports no loss (its round trip, on a pooled connection the
// server closed, is sent again), and the waiter is granted.
func TestLockerSurvivesTerminatedConnections(t *testing.T) {
	ctx := context.Background()
	pools := namedPools(t, server(t).ConnString(), t.Name(), 2)
	prefix := t.Name() + "#" + itoa64(prefixes.Add(1))
	a := newLocker(t, pools[0], prefix)
	b := newLocker(t, pools[1], prefix)
	g, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	w := lockAsync(t, ctx, b.Lock, "k")
	awaitRows(t, pools[0], prefix, "k", 2, 10*time.Second)
	admin := server(t).NewPool(t)
	listening := func() (n int) {
		err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name LIKE $1 || '-%' AND query LIKE 'LISTEN%'`, t.Name()).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := listening(); n != 2 {
		t.Fatalf("%d listening connections before, want 2", n)
	}
	var killed int
	err = admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name LIKE $1 || '-%'`, t.Name()).Scan(&killed)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("terminated %d connections", killed)
	if killed < 4 {
		t.Fatalf("terminated %d connections, want the two listening ones and the pools'", killed)
	}
	for deadline := time.Now().Add(20 * time.Second); listening() != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the listening connections did not come back")
		}
	}
	awaitValid(t, g, "after the connections were terminated")
	notYet(t, w, "the waiter")
	if err := g.Unlock(ctx); err != nil {
		t.Errorf("Unlock after the connections were terminated: %v", err)
	}
	g = awaitGrant(t, w, 20*time.Second, "the waiter was not granted")
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if g, err = a.Lock(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	awaitRows(t, pools[0], prefix, "k", 0, 10*time.Second)
}

// TestSessionExpiredReplaced expires a Locker's session on the server (as
// a pause past its TTL would) while it holds a key and has a call queued
// behind another Locker's: the grant is lost (Lost closes, Unlock says
// ErrLost), the queued call queues again under the Locker's next session
// and is granted after the calls that were behind it, and later calls
// work.
func TestSessionExpiredReplaced(t *testing.T) {
	ctx := context.Background()
	pool, sp := setup(t, 0)
	prefix := string(sp.prefix)
	a := newLocker(t, pool, prefix)
	b := newLocker(t, pool, prefix)
	ga, err := a.Lock(ctx, "held")
	if err != nil {
		t.Fatal(err)
	}
	gb, err := b.Lock(ctx, "queued")
	if err != nil {
		t.Fatal(err)
	}
	queued := lockAsync(t, ctx, a.Lock, "queued")
	awaitRows(t, pool, prefix, "queued", 2, 10*time.Second)
	behind := lockAsync(t, owner.NewContext(ctx), b.Lock, "queued")
	awaitRows(t, pool, prefix, "queued", 3, 10*time.Second)
	old := refOfLease(ga).Session
	expire(t, pool, old)
	recvWithin(t, ga.Lost(), 10*time.Second, "Lost not closed after the session expired")
	if err := ga.Unlock(ctx); !errors.Is(err, ErrLost) {
		t.Errorf("Unlock of a grant whose session expired: %v, want ErrLost", err)
	}
	// The queued call queues again, under the next session, behind the
	// other Locker's.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM fairlock_calls WHERE prefix = $1 AND key = 'queued' AND session <> $2`,
			[]byte(prefix), old).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		if n == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls on the key under live sessions, want 3", n)
		}
	}
	if err := gb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g := awaitGrant(t, behind, 20*time.Second, "the call that was behind was not granted")
	notYet(t, queued, "the requeued call")
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g = awaitGrant(t, queued, 20*time.Second, "the requeued call was not granted")
	if s := refOfLease(g).Session; s == old {
		t.Errorf("the requeued call was granted under the expired session %d", s)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if g, err = a.Lock(ctx, "held"); err != nil {
		t.Fatal(err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM fairlock_sessions WHERE id = $1`, old).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the expired session's row was not deleted")
		}
	}
}

// TestManyWaitersOnALocker queues 500 Lock calls on one key, over one
// pool of at most 10 connections shared by two Lockers, behind a holder,
// and checks that while they wait no connection of the pool is in use,
// and that they are granted one at a time in the order of their tokens
// (their queue order).
func TestManyWaitersOnALocker(t *testing.T) {
	ctx := context.Background()
	pool, sp := setup(t, 10)
	prefix := string(sp.prefix)
	ls := []*Locker{newLocker(t, pool, prefix), newLocker(t, pool, prefix)}
	h, err := ls[0].Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 500
	var mu sync.Mutex
	var order []uint64 // tokens, in the order their calls were granted
	holding := 0
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			g, err := ls[i%2].Lock(ctx, "k")
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, g.Token())
			holding++
			if holding != 1 {
				t.Errorf("token %d holds beside %d others", g.Token(), holding-1)
			}
			holding--
			mu.Unlock()
			if err := g.Unlock(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	awaitRows(t, pool, prefix, "k", waiters+1, 60*time.Second)
	// Every call has its row; once their replies are in, none holds a
	// connection (a renewal or a re-read may borrow one for a moment).
	for deadline := time.Now().Add(10 * time.Second); pool.Stat().AcquiredConns() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections of the pool in use while every call waits", pool.Stat().AcquiredConns())
		}
	}
	if n := pool.Stat().TotalConns(); n > 10 {
		t.Errorf("%d connections in the pool", n)
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(order) != waiters {
		t.Fatalf("%d of %d calls granted", len(order), waiters)
	}
	if !slices.IsSorted(order) {
		t.Errorf("grants out of token order: %v", order)
	}
	awaitRows(t, pool, prefix, "k", 0, 10*time.Second)
}

// TestCancellationStorm runs 16 goroutines over three Lockers on one key
// for a second, three Locks in four with a random timeout of 5 to 50 ms
// (a few round trips), the fourth with 10 s: no two ever hold the key at
// once, and when they stop the key's rows are all gone (every cancelled
// call deleted its row, or the janitor did) and a TryLock succeeds. (When
// calls give up faster than the key's statements, serialised by its
// advisory lock, can run, their removals pile up and strict FIFO grants
// almost none of the impatient calls in time: the patient ones keep the
// check of grants meaningful on a loaded machine.)
func TestCancellationStorm(t *testing.T) {
	ctx := context.Background()
	pool, sp := setup(t, 10)
	prefix := string(sp.prefix)
	ls := []*Locker{newLocker(t, pool, prefix), newLocker(t, pool, prefix), newLocker(t, pool, prefix)}
	var holding, grants, gaveUp atomic.Int64
	stop := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			for n := 0; time.Now().Before(stop); n++ {
				timeout := time.Duration(5+rand.IntN(46)) * time.Millisecond
				if n%4 == 3 {
					timeout = 10 * time.Second
				}
				cctx, cancel := context.WithTimeout(ctx, timeout)
				g, err := ls[i%3].Lock(cctx, "k")
				cancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Error(err)
						return
					}
					gaveUp.Add(1)
					continue
				}
				if holding.Add(1) != 1 {
					t.Error("two holders at once")
				}
				grants.Add(1)
				holding.Add(-1)
				if err := g.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d grants, %d calls gave up", grants.Load(), gaveUp.Load())
	if grants.Load() == 0 || gaveUp.Load() == 0 {
		t.Errorf("%d grants and %d calls that gave up: the storm did not storm", grants.Load(), gaveUp.Load())
	}
	awaitRows(t, pool, prefix, "k", 0, 20*time.Second)
	g, err := ls[0].TryLock(ctx, "k")
	if err != nil {
		t.Fatalf("TryLock after the storm: %v", err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestNewRefusesTransactionPooling checks that New, through a PgBouncer in
// transaction mode, fails with an error that names it.
func TestNewRefusesTransactionPooling(t *testing.T) {
	defer func(d time.Duration) { probeTimeout = d }(probeTimeout)
	probeTimeout = time.Second
	cfg, err := pgxpool.ParseConfig(server(t).StartPgBouncer(t, "transaction"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	l, err := New(pool, t.Name())
	if err == nil {
		l.Close(context.Background())
		t.Fatal("New through transaction pooling succeeded")
	}
	if !strings.Contains(err.Error(), "PgBouncer's pool_mode=transaction") {
		t.Errorf("New through transaction pooling: %v, want an error naming it", err)
	}
}

// TestRenewalNeedsNoPoolConnection holds every connection of a Locker's
// pool (as calls or the application's own queries can) for longer than
// the TTL while the Locker holds a grant: the session is renewed on the
// Locker's listening connection, so the grant's Deadline keeps moving
// and Lost stays open. (With renewals on the pool, tried, the grant was
// lost at its deadline.)
func TestRenewalNeedsNoPoolConnection(t *testing.T) {
	ctx := context.Background()
	pool, sp := setup(t, 2)
	l := newLocker(t, pool, string(sp.prefix))
	g, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	var held []*pgxpool.Conn
	release := func() {
		for _, c := range held {
			c.Release()
		}
		held = nil
	}
	defer release() // before the Locker's Close, which needs them
	for range 2 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	exhausted := time.Now()
	for deadline := time.Now().Add(20 * time.Second); !g.Deadline().After(exhausted.Add(lockTTL)); time.Sleep(10 * time.Millisecond) {
		if isClosed(g.Lost()) {
			t.Fatal("the grant was lost while the pool was busy")
		}
		if time.Now().After(deadline) {
			t.Fatalf("no renewal confirmed while the pool was busy (deadline %v)", g.Deadline())
		}
	}
	release()
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseIsNotALoss locks and unlocks keys for a second while a
// Locker with a short TTL renews its session every few tens of
// milliseconds: a renewal that finds the row of a grant being unlocked
// gone must not report it lost (nothing logged, no Lost closed, no
// ErrLost). (Without the mark Release sets, tried, the renewals logged
// such losses within the second.)
func TestReleaseIsNotALoss(t *testing.T) {
	ctx := context.Background()
	pool, sp := setup(t, 0)
	var logs strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelWarn}))
	l := newLocker(t, pool, string(sp.prefix), WithTTL(150*time.Millisecond), WithLogger(logger))
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			key := "k" + strconv.Itoa(i)
			for stop := time.Now().Add(time.Second); time.Now().Before(stop); {
				g, err := l.Lock(ctx, key)
				if err != nil {
					t.Error(err)
					return
				}
				if err := g.Unlock(ctx); err != nil {
					t.Errorf("Unlock: %v", err)
					return
				}
				if isClosed(g.Lost()) {
					t.Error("Lost closed by an Unlock")
					return
				}
			}
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if logs.Len() > 0 {
		t.Errorf("logged:\n%s", logs.String())
	}
}

// writerFunc is an io.Writer.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestNewSweepsDeadRows leaves the rows of a session that expired (a
// crashed process's) on keys that nobody locks again, and checks that a
// new Locker on the prefix deletes them, and the session, in the
// background of New.
func TestNewSweepsDeadRows(t *testing.T) {
	ctx := context.Background()
	pool, sp := setup(t, 0)
	prefix := string(sp.prefix)
	dead := newSession(t, pool, sp, testTTL)
	for _, key := range []string{"a", "b", "c"} {
		mustEnqueue(t, pool, sp, key, dead, modeExclusive, 0, 0, false)
	}
	expire(t, pool, dead)
	newLocker(t, pool, prefix)
	for _, key := range []string{"a", "b", "c"} {
		awaitRows(t, pool, prefix, key, 0, 10*time.Second)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM fairlock_sessions WHERE id = $1`, dead).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the expired session's row was not deleted")
		}
	}
}
