package etcdlock_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Tests against a three-member cluster with one member stopped or made
// unreachable (etcdtest.Cluster: Stop, Cut, Stall). The TTL is short, a
// little above the members' minimum (1.5 s), so that each test spans a
// few TTLs in a few seconds.

// faultTTL is the lease TTL of the Lockers in these tests.
const faultTTL = 2 * time.Second

// quiet is a logger that drops everything: these tests make the Lockers
// warn on purpose.
var quiet = slog.New(slog.DiscardHandler)

// TestUnlockAfterOnlyMemberStops: a Locker whose client knows one member
// holds two keys; that member stops. Once the lease's deadline passes,
// Lost closes, and an Unlock that cannot reach etcd says both things:
// the grant was lost (ErrLost) and the deletion failed (its context's
// error); so does an Unlock that was already running when the grant was
// lost. After the member returns, nothing is left under the prefix.
func TestUnlockAfterOnlyMemberStops(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	client := c.Client(t, 0)
	l, err := etcdlock.New(client, "/only", etcdlock.WithTTL(faultTTL), etcdlock.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before := mustLock(t, ctx, l, "before")
	while := mustLock(t, ctx, l, "while")

	c.Members[0].Stop()
	// Unlock of "while" starts before the grant is lost and runs past the
	// lease's deadline.
	whileErr := make(chan error, 1)
	go func() {
		uctx, cancel := context.WithTimeout(ctx, faultTTL+faultTTL/2)
		defer cancel()
		whileErr <- while.Unlock(uctx)
	}()
	awaitLost(t, before, 3*faultTTL, "after the only member the client knows stopped")
	uctx, cancel := context.WithTimeout(ctx, time.Second)
	err = before.Unlock(uctx)
	cancel()
	if !errors.Is(err, etcdlock.ErrLost) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Unlock of a lost grant, etcd unreachable: %v; want ErrLost and context.DeadlineExceeded", err)
	}
	if err == nil || !strings.Contains(err.Error(), `"before"`) {
		t.Errorf("Unlock's error %q does not name the key", err)
	}
	err = <-whileErr
	if !errors.Is(err, etcdlock.ErrLost) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Unlock running when the grant was lost, etcd unreachable: %v; want ErrLost and context.DeadlineExceeded", err)
	}
	select {
	case <-while.Lost():
	default:
		t.Error("Unlock returned ErrLost and Lost is open")
	}

	if err := c.Members[0].Restart(); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := l.Close(cctx); err != nil {
		t.Errorf("Close after the member returned: %v", err)
	}
	waitKeys(t, c.Client(t), "/only/", 0, 3*faultTTL)
}

// TestStalledMemberKeepsLease: a Locker whose client knows all three
// members holds a key while the path to one member is blackholed
// (connections open, no byte moving). Two members answer, so the lease
// is renewed through them: the grant is not lost over several TTLs, and
// it is still current in etcd.
func TestStalledMemberKeepsLease(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	l := newLocker(t, c.Client(t), "/stall", etcdlock.WithTTL(faultTTL), etcdlock.WithLogger(quiet))
	ctx := context.Background()
	g := mustLock(t, ctx, l, "k")
	c.Members[0].Stall()
	defer c.Members[0].Heal()
	select {
	case <-g.Lost():
		t.Fatal("grant lost with one member of three stalled")
	case <-time.After(4 * faultTTL):
	}
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := c.Client(t, 1).Txn(tctx).If(isOwner(g)).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("the grant is not current in etcd: %v %v", resp, err)
	}
	c.Members[0].Heal()
	mustUnlock(t, tctx, g)
}

// TestStalledWatchReplaced: a waiter's Locker knows members p and q, and
// its prefix watch runs over p; p's path is blackholed while q answers.
// The holder, on a healthy client, releases: the waiter is granted in its
// place (its token is the revision of the key it queued with: it did not
// queue again) well inside a few TTLs, as the Locker notices its silent
// watch and moves it to q.
func TestStalledWatchReplaced(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	p, q := c.Members[0], c.Members[1]
	holders := newLocker(t, c.Client(t, 2), "/watch", etcdlock.WithTTL(faultTTL), etcdlock.WithLogger(quiet))

	// With q refusing connections, every stream of the waiter's client,
	// its watch included, goes to p. Then q comes back, and the client
	// reconnects to it.
	q.Cut()
	accepted := q.Accepted()
	waiters := newLocker(t, c.Client(t, 0, 1), "/watch", etcdlock.WithTTL(faultTTL), etcdlock.WithLogger(quiet))
	q.Heal()
	deadline := time.Now().Add(10 * time.Second)
	for q.Accepted() == accepted {
		if time.Now().After(deadline) {
			t.Fatal("the waiter's client did not reconnect to q")
		}
		time.Sleep(10 * time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held := mustLock(t, ctx, holders, "k")
	waiter := startLock(ctx, waiters.Lock, "k")
	waitKeys(t, c.Client(t, 2), "/watch/", 2, 10*time.Second)
	resp, err := c.Client(t, 2).Get(ctx, "/watch/", clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	queuedAt := resp.Kvs[1].CreateRevision

	p.Stall()
	defer p.Heal()
	released := time.Now()
	mustUnlock(t, ctx, held)
	g, err := waiter.within(t, 3*faultTTL, "the waiter, after the release, its watch's member stalled")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("granted %v after the release", waiter.at.Sub(released))
	if got := int64(g.Token()); got != queuedAt {
		t.Errorf("granted with token %d, want %d, the revision of the key it queued with: it lost its place", got, queuedAt)
	}
	p.Heal()
	mustUnlock(t, ctx, g)
}

// TestKeyTooLarge: a key larger than etcd takes (2 MiB; the client sends
// at most 2 MiB a request) fails at once, with an error that names the
// key by its first bytes and its size rather than embedding all of it,
// and leaves nothing to clean up.
func TestKeyTooLarge(t *testing.T) {
	client := startClient(t)
	l := newLocker(t, client, "/large", etcdlock.WithLogger(quiet))
	key := strings.Repeat("k", 2<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, call := range []func() error{
		func() error { _, err := l.Lock(ctx, key); return err },
		func() error { _, err := l.TryLock(ctx, key); return err },
		func() error { return l.Wait(ctx, key) },
	} {
		err := call()
		if err == nil {
			t.Fatal("a 2 MiB key was locked")
		}
		if ctx.Err() != nil {
			t.Fatalf("a 2 MiB key failed only at its context's end: %v", err)
		}
		msg := err.Error()
		if len(msg) > 1024 || !strings.Contains(msg, "… (2097152 bytes)") {
			t.Errorf("error of %d bytes for a 2 MiB key, want its first bytes and its size: %.300q", len(msg), msg)
		}
	}
	if keys := keysUnder(t, client, "/large/"); len(keys) != 0 {
		t.Errorf("keys left: %d", len(keys))
	}
}
