package etcdtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock/etcdtest"
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
