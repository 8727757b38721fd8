package etcdtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestStart(t *testing.T) {
	c := etcdtest.Start(t)
	ctx := context.Background()
	if _, err := c.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("%v %v", resp, err)
	}
}

// TestStopRestart: Stop cuts clients off at once; Restart serves the same
// data on the same endpoints, and the old clients reconnect.
func TestStopRestart(t *testing.T) {
	s := etcdtest.StartServer(t)
	c := s.Client(t)
	ctx := context.Background()
	if _, err := c.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s.Stop()
	t.Logf("Stop took %v", time.Since(start)) // without the relay: the server's 5.2 s graceful stop
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := c.Get(sctx, "k"); err == nil {
		t.Fatal("Get succeeded on a stopped server")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(); err == nil {
		t.Fatal("Restart of a running server succeeded")
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := c.Get(rctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("after the restart: %v %v", resp, err)
	}
	s.Stop()
	s.Stop()
}

// TestHandOff measures hand-offs of etcd's concurrency.Mutex between two
// clients: each is positive, the waiter is granted only after the
// holder's unlock began, and nothing is left in the queue.
func TestHandOff(t *testing.T) {
	srv := etcdtest.StartServer(t)
	var sides [2]etcdtest.LockFunc
	var unlockedAt time.Time
	for i := range sides {
		s, err := concurrency.NewSession(srv.Client(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		sides[i] = func(ctx context.Context) (func(), error) {
			m := concurrency.NewMutex(s, "/q")
			if err := m.Lock(ctx); err != nil {
				return nil, err
			}
			return func() { unlockedAt = time.Now(); _ = m.Unlock(ctx) }, nil
		}
	}
	client := srv.Client(t)
	ctx := context.Background()
	for range 3 {
		before := time.Now()
		d, err := etcdtest.HandOff(ctx, client, sides[0], sides[1], "/q/")
		if err != nil {
			t.Fatal(err)
		}
		// unlockedAt is the waiter's unlock, the last one HandOff made.
		if d <= 0 || d > unlockedAt.Sub(before) {
			t.Fatalf("hand-off of %v, in a call that unlocked the waiter %v after it began", d, unlockedAt.Sub(before))
		}
	}
	resp, err := client.Get(ctx, "/q/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("keys left in the queue: %v %v", resp, err)
	}
}

func TestQuantile(t *testing.T) {
	var sorted []time.Duration
	for i := 1; i <= 100; i++ {
		sorted = append(sorted, time.Duration(i))
	}
	for _, c := range []struct {
		q    float64
		want time.Duration
	}{{0, 1}, {0.5, 50}, {0.99, 99}, {1, 100}} {
		if got := etcdtest.Quantile(sorted, c.q); got != c.want {
			t.Errorf("Quantile(1..100, %v) = %v, want %v", c.q, got, c.want)
		}
	}
	if got := etcdtest.Quantile(nil, 0.5); got != 0 {
		t.Errorf("Quantile of nothing = %v", got)
	}
}

// TestHandOffWaiterFails: a waiter that fails before it queues ends the
// measurement with its error, at once, and the holder is unlocked.
func TestHandOffWaiterFails(t *testing.T) {
	srv := etcdtest.StartServer(t)
	client := srv.Client(t)
	s, err := concurrency.NewSession(client)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	holder := func(ctx context.Context) (func(), error) {
		m := concurrency.NewMutex(s, "/q")
		if err := m.Lock(ctx); err != nil {
			return nil, err
		}
		return func() { _ = m.Unlock(context.Background()) }, nil
	}
	boom := errors.New("the waiter failed")
	waiter := func(context.Context) (func(), error) { return nil, boom }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := etcdtest.HandOff(ctx, client, holder, waiter, "/q/"); !errors.Is(err, boom) {
		t.Fatalf("HandOff with a waiter that fails at once: %v, want the waiter's error", err)
	}
	resp, err := client.Get(ctx, "/q/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || resp.Count != 0 {
		t.Fatalf("the holder's key is left: %v %v", resp, err)
	}
}
