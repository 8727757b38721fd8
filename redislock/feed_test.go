package redislock_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// Every change of a key's holders on Redis (Locker.Follow, the
// keylock.Follower that package elect's Observe follows): every term in
// order, every kind of change (fast paths, hand-overs, shared holds,
// units, a purge of a dead holder), a gap where the key's change log lost
// what the feed had not read, and no log left behind by a key nobody
// follows.

// TestElectObserveEveryTerm: Observe, over redislock, reports each of 50
// terms that begin and end without a pause, and each vacancy between
// them, in order (disttest.ElectObserveEveryTerm).
func TestElectObserveEveryTerm(t *testing.T) {
	disttest.ElectObserveEveryTerm(t, newBackend(t, redistest.StartServer(t)), "elect-every-term")
}

// logKey is the Redis key of key's change log under prefix: the queue's
// name with its last letter "f" (keys.go).
func logKey(prefix, key string) string {
	return strings.TrimSuffix(redislock.QueueKey(prefix, key), "q") + "f"
}

// mustLock locks key through l with ctx, failing t on an error.
func mustLock(t *testing.T, ctx context.Context, l *redislock.Locker, key string) keylock.Lease {
	t.Helper()
	g, err := l.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// mustUnlock unlocks each of gs, failing t on an error.
func mustUnlock(t *testing.T, gs ...keylock.Lease) {
	t.Helper()
	for _, g := range gs {
		if err := g.Unlock(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFollowEveryChange: a feed reports each change of a key's holders,
// in order, whichever script made it, with each holder's label, process,
// mode and token: a grant on a free key and the release of the only
// entry (the scripts' fast paths); a hand-over to a queued call, as one
// change with no vacancy before it; readers one by one; a holder whose
// session expired, purged by another Locker's Locked, as a hand-over to
// the call queued behind it; and a Semaphore's units.
func TestFollowEveryChange(t *testing.T) {
	srv := redistest.StartServer(t)
	const prefix = "follow"
	admin := srv.NewClient(t)
	follower := newLocker(t, srv.NewClient(t), prefix)
	l := newLocker(t, srv.NewClient(t), prefix)
	other := newLocker(t, srv.NewClient(t), prefix)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := follower.Follow(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	disttest.ExpectChange(t, ch, false)

	g1 := mustLock(t, owner.NewLabeledContext(ctx, "one"), l, "k")
	c := disttest.ExpectChange(t, ch, false, g1.Token())
	if h := c.Holders[0]; h.Label != "one" || h.Mode != keylock.ModeExclusive || h.Process.Locker == "" || h.Process.PID == 0 || !h.Held {
		t.Fatalf("the holder: %+v", h)
	}
	queued := lockAsync(t, owner.NewLabeledContext(ctx, "two"), other, "k")
	awaitQueue(t, admin, prefix, "k", 2, 10*time.Second)
	mustUnlock(t, g1)
	g2 := awaitGrant(t, queued, 10*time.Second, "the queued Lock was not granted")
	if c := disttest.ExpectChange(t, ch, false, g2.Token()); c.Holders[0].Label != "two" {
		t.Fatalf("the holder after the hand-over: %+v", c.Holders[0])
	}
	mustUnlock(t, g2)
	disttest.ExpectChange(t, ch, false)

	r1, err := l.RLock(owner.NewLabeledContext(ctx, "r1"), "k")
	if err != nil {
		t.Fatal(err)
	}
	disttest.ExpectChange(t, ch, false, r1.Token())
	r2, err := other.RLock(owner.NewLabeledContext(ctx, "r2"), "k")
	if err != nil {
		t.Fatal(err)
	}
	if c := disttest.ExpectChange(t, ch, false, r1.Token(), r2.Token()); c.Holders[1].Label != "r2" || c.Holders[1].Mode != keylock.ModeShared {
		t.Fatalf("the second reader: %+v", c.Holders[1])
	}
	mustUnlock(t, r1)
	disttest.ExpectChange(t, ch, false, r2.Token())
	mustUnlock(t, r2)
	disttest.ExpectChange(t, ch, false)

	// A holder whose session expires: its marker deleted, as its TTL
	// would, with a call queued behind it. Another Locker's Locked
	// purges it, which grants the queued call: one change.
	g3 := mustLock(t, ctx, l, "k")
	disttest.ExpectChange(t, ch, false, g3.Token())
	queued = lockAsync(t, ctx, other, "k")
	awaitQueue(t, admin, prefix, "k", 2, 10*time.Second)
	if err := admin.Del(ctx, redislock.MarkerKey(prefix, g3)).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := follower.Locked(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	g4 := awaitGrant(t, queued, 10*time.Second, "the call behind the expired holder was not granted")
	disttest.ExpectChange(t, ch, false, g4.Token())
	mustUnlock(t, g4)
	disttest.ExpectChange(t, ch, false)
	g3.Unlock(ctx) // lost: its entry was purged

	s, err := redislock.NewSemaphore(srv.NewClient(t), "follow-units", 5, redislock.WithTTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	sch, err := s.Follow(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	disttest.ExpectChange(t, sch, false)
	a, err := s.Acquire(ctx, "k", 3)
	if err != nil {
		t.Fatal(err)
	}
	if c := disttest.ExpectChange(t, sch, false, a.Token()); c.Holders[0].Mode != keylock.ModeUnits || c.Holders[0].Units != 3 {
		t.Fatalf("a Semaphore's holder: %+v", c.Holders[0])
	}
	a.Unlock(ctx)
	disttest.ExpectChange(t, sch, false)
}

// gapAfterLoss runs a feed of a key under prefix, stops reading it while
// terms come and go, calls lose (which makes the key's change log lose
// what the feed had not read), and checks that the feed reports, in
// order and with no gap, what it had read before the loss (a prefix of
// the terms), then a gap with the holder when reading resumed, then
// every change again.
func gapAfterLoss(t *testing.T, prefix string, lose func(ctx context.Context, admin *redis.Client)) {
	srv := redistest.StartServer(t)
	admin := srv.NewClient(t)
	follower := newLocker(t, srv.NewClient(t), prefix)
	l := newLocker(t, srv.NewClient(t), prefix)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := follower.Follow(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	disttest.ExpectChange(t, ch, false)
	g1 := mustLock(t, ctx, l, "k")
	disttest.ExpectChange(t, ch, false, g1.Token())

	// Not reading: the changes wait in the log (and one of them in the
	// feed's send).
	var terms [][]uint64 // the holders' tokens after each change
	mustUnlock(t, g1)
	terms = append(terms, nil)
	for range 3 {
		g := mustLock(t, ctx, l, "k")
		mustUnlock(t, g)
		terms = append(terms, []uint64{g.Token()}, nil)
	}
	lose(ctx, admin)
	g5 := mustLock(t, owner.NewLabeledContext(ctx, "five"), l, "k")

	var seen [][]uint64
	for {
		c := disttest.RecvChange(t, ch)
		if c.Gap {
			if got := disttest.TokensOf(c); !slices.Equal(got, []uint64{g5.Token()}) || c.Holders[0].Label != "five" {
				t.Fatalf("the holders after the gap: %+v, want token %d labelled five", c.Holders, g5.Token())
			}
			break
		}
		seen = append(seen, disttest.TokensOf(c))
		if len(seen) > len(terms) || !slices.Equal(seen[len(seen)-1], terms[len(seen)-1]) {
			t.Fatalf("before the gap: %v; want a prefix of %v", seen, terms)
		}
	}
	t.Logf("%d of the %d changes read before the gap", len(seen), len(terms))
	mustUnlock(t, g5)
	disttest.ExpectChange(t, ch, false)
	g6 := mustLock(t, ctx, l, "k")
	disttest.ExpectChange(t, ch, false, g6.Token())
	mustUnlock(t, g6)
	disttest.ExpectChange(t, ch, false)
}

// TestFollowGapOnTrim: entries of the log that the feed had not read are
// trimmed away (XTRIM MAXLEN 0, as a reader more than the log's length
// behind finds them): the next entry does not follow the last the feed
// read, and the feed reports a gap with the holders read afresh.
func TestFollowGapOnTrim(t *testing.T) {
	gapAfterLoss(t, "trim", func(ctx context.Context, admin *redis.Client) {
		if err := admin.XTrimMaxLen(ctx, logKey("trim", "k"), 0).Err(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFollowGapOnDelete: the log is deleted (as it expires, or is lost
// with a restart): the scripts stop writing it, the feed finds it gone
// within a third of the TTL, and reports a gap with the holders read
// afresh, having created the log again.
func TestFollowGapOnDelete(t *testing.T) {
	gapAfterLoss(t, "del", func(ctx context.Context, admin *redis.Client) {
		if err := admin.Del(ctx, logKey("del", "k")).Err(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestFollowGapOnRestart: the server restarts without its data while a
// feed is open and a call holds the key: the feed's read fails, and once
// the server is back the feed reports a gap with the key's holders
// there (nobody), then every change again.
func TestFollowGapOnRestart(t *testing.T) {
	srv := redistest.StartServerWith(t, redistest.Options{Persistence: redistest.NoPersistence})
	follower := newLocker(t, srv.NewClient(t), "restart", redislock.WithLogger(quietLogger()))
	l := newLocker(t, srv.NewClient(t), "restart", redislock.WithLogger(quietLogger()))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := follower.Follow(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	disttest.ExpectChange(t, ch, false)
	g1 := mustLock(t, ctx, l, "k")
	disttest.ExpectChange(t, ch, false, g1.Token())
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// The server came back empty: nobody holds the key.
	disttest.ExpectChange(t, ch, true)
	g1.Unlock(ctx) // lost with the restart
	g2 := mustLock(t, ctx, l, "k")
	disttest.ExpectChange(t, ch, false, g2.Token())
	mustUnlock(t, g2)
	disttest.ExpectChange(t, ch, false)
}

// TestFollowEndsAndLogExpires: a feed's channel closes when its context
// ends and when its Locker's Close begins, at once (the feed's blocking
// read is ended for it), and Follow on a closed Locker fails with
// ErrClosed. The log a feed created expires once nobody follows the key,
// and a key nobody ever followed has none.
func TestFollowEndsAndLogExpires(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.NewClient(t)
	l, err := redislock.New(srv.NewClient(t), "ends", redislock.WithTTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	g := mustLock(t, ctx, l, "unfollowed")
	mustUnlock(t, g)
	if n, err := admin.Exists(ctx, logKey("ends", "unfollowed")).Result(); err != nil || n != 0 {
		t.Fatalf("a key nobody followed has a change log: %d, %v", n, err)
	}

	closed := func(ch <-chan keylock.Change, what string) {
		t.Helper()
		select {
		case _, ok := <-ch:
			if ok {
				t.Fatalf("a change after %s", what)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the feed did not close within 5 s of %s", what)
		}
	}
	fctx, cancel := context.WithCancel(ctx)
	ch, err := l.Follow(fctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	disttest.ExpectChange(t, ch, false)
	cancel()
	closed(ch, "its context's end")

	ch, err = l.Follow(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	disttest.ExpectChange(t, ch, false)
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	closed(ch, "Close")
	if _, err := l.Follow(ctx, "k"); !errors.Is(err, fairlock.ErrClosed) {
		t.Fatalf("Follow after Close: %v, want ErrClosed", err)
	}

	ttl, err := admin.PTTL(ctx, logKey("ends", "k")).Result()
	if err != nil || ttl <= 0 || ttl > 2*testTTL {
		t.Fatalf("the log's expiry once nobody follows: %v, %v; want within %v", ttl, err, 2*testTTL)
	}
}

// TestFollowCluster: on a Redis Cluster of three masters, feeds of keys
// whose slots are on different masters each report their key's changes,
// and close at once with their Locker.
func TestFollowCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	cl := redistest.StartNodes(t, 3)
	follower, err := redislock.New(cl.NewClient(t), "cluster", redislock.WithTTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	l := newLocker(t, cl.NewClient(t), "cluster")
	ctx := context.Background()
	keys := []string{"a", "b", "c", "d", "e", "f"}
	feeds := make([]<-chan keylock.Change, len(keys))
	for i, k := range keys {
		if feeds[i], err = follower.Follow(ctx, k); err != nil {
			t.Fatal(err)
		}
		disttest.ExpectChange(t, feeds[i], false)
	}
	for i, k := range keys {
		g := mustLock(t, owner.NewLabeledContext(ctx, k), l, k)
		if c := disttest.ExpectChange(t, feeds[i], false, g.Token()); c.Holders[0].Label != k {
			t.Fatalf("the holder of %q: %+v", k, c.Holders[0])
		}
		mustUnlock(t, g)
		disttest.ExpectChange(t, feeds[i], false)
	}
	if err := follower.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for i, ch := range feeds {
		select {
		case _, ok := <-ch:
			if ok {
				t.Fatalf("a change of %q after Close", keys[i])
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("the feed of %q did not close within 5 s of Close", keys[i])
		}
	}
}

// TestFollowWithoutClientCommand: where the server's ACL refuses the
// CLIENT command (so a feed can neither name its connection nor end its
// read with CLIENT UNBLOCK), a feed reads on the client's pool instead:
// it reports every change, and closes within its shorter read with
// Close.
func TestFollowWithoutClientCommand(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.NewClient(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "noclient", "on", ">secret", "~*", "&*", "+@all", "-client").Err(); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, &redis.Options{Addr: srv.Addr(), Username: "noclient", Password: "secret"})
	if err := c.ClientID(ctx).Err(); err == nil {
		t.Fatal("CLIENT ID allowed")
	}
	follower, err := redislock.New(c, "noclient", redislock.WithTTL(testTTL), redislock.WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	l := newLocker(t, srv.NewClient(t), "noclient")
	ch, err := follower.Follow(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	disttest.ExpectChange(t, ch, false)
	g := mustLock(t, ctx, l, "k")
	disttest.ExpectChange(t, ch, false, g.Token())
	mustUnlock(t, g)
	disttest.ExpectChange(t, ch, false)
	if err := follower.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("a change after Close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the feed did not close within 5 s of Close")
	}
}
