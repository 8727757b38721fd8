package etcdlock_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Tests of what fault injection found (issue 42's defects 7 and 9).

// TestNewUnreachable: New against endpoints that refuse connections
// returns at once with the dials' error, not after its 10 s bound with
// "context deadline exceeded".
func TestNewUnreachable(t *testing.T) {
	srv := etcdtest.StartServer(t)
	eps := srv.Endpoints()
	srv.Stop()
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	l, err := etcdlock.New(c, "/unreachable")
	took := time.Since(start)
	if err == nil {
		l.Close(context.Background())
		t.Fatal("New against a stopped server succeeded")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("New: %v; want an error wrapping the dial's connection refused", err)
	}
	if took >= 5*time.Second {
		t.Errorf("New took %v to fail against endpoints that refuse connections", took)
	}
}

// TestStalledMemberRequestsBounded: with one member of three blackholed
// (connections open, nothing comes back) and a quorum answering, every
// request a call makes is bounded and retried on another connection:
// Lock and Unlock cycles, whose requests the client spreads round-robin
// over its connections, the stalled one included, each finish well inside
// their generous context. (Before the fix an Unlock whose deletion went
// to the stalled connection waited until its context ended.)
func TestStalledMemberRequestsBounded(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	l := newLocker(t, c.Client(t), "/stall-req", etcdlock.WithTTL(faultTTL), etcdlock.WithLogger(quiet))
	other := newLocker(t, c.Client(t, 1, 2), "/stall-req", etcdlock.WithTTL(faultTTL), etcdlock.WithLogger(quiet))
	c.Members[0].Stall()
	defer c.Members[0].Heal()
	for i := range 12 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		start := time.Now()
		g, err := l.Lock(ctx, "k")
		if err != nil {
			cancel()
			t.Fatalf("cycle %d: Lock: %v", i, err)
		}
		if err := g.Unlock(ctx); err != nil {
			cancel()
			t.Fatalf("cycle %d: Unlock: %v", i, err)
		}
		if _, err := l.Locked(ctx, "k"); err != nil {
			cancel()
			t.Fatalf("cycle %d: Locked: %v", i, err)
		}
		cancel()
		if took := time.Since(start); took > 20*time.Second {
			t.Fatalf("cycle %d: Lock, Unlock and Locked took %v with one member stalled; each request should be bounded and retried", i, took)
		}
	}
	// The key is free for a Locker that never used the stalled member.
	tctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	g, err := other.TryLock(tctx, "k")
	if err != nil {
		t.Fatalf("TryLock through the healthy client after the cycles: %v", err)
	}
	mustUnlock(t, tctx, g)
}
