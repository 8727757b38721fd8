package etcdtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock/etcdtest"
)

// TestCluster: three members serve one keyspace; a stalled member's
// clients hang without an error while the others answer, and go on after
// Heal; a cut member's clients fail; the two others go on writing while
// one member is stopped, and it restarts on its own data and rejoins.
func TestCluster(t *testing.T) {
	c := etcdtest.StartCluster(t, 3)
	if got := len(c.Endpoints()); got != 3 {
		t.Fatalf("%d endpoints, want 3", got)
	}
	all := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := all.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	only0, only1 := c.Client(t, 0), c.Client(t, 1)
	if _, err := only0.Get(ctx, "k"); err != nil {
		t.Fatal(err)
	}

	c.Members[0].Stall()
	sctx, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := only0.Get(sctx, "k")
	scancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get through a stalled member: %v, want it to hang until its deadline", err)
	}
	if resp, err := only1.Get(ctx, "k"); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("Get through a healthy member while another is stalled: %v %v", resp, err)
	}
	c.Members[0].Heal()
	if _, err := only0.Get(ctx, "k"); err != nil {
		t.Fatalf("Get after Heal: %v", err)
	}

	c.Members[0].Cut()
	cctx, ccancel := context.WithTimeout(ctx, time.Second)
	_, err = only0.Get(cctx, "k")
	ccancel()
	if err == nil {
		t.Fatal("Get through a cut member succeeded")
	}
	c.Members[0].Heal()

	// A stopped leader is not replaced at once (an election timeout):
	// a write meanwhile may fail, and is not retried by the client.
	c.Members[1].Stop()
	for {
		_, err := all.Put(ctx, "k", "v2")
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("Put with one member of three stopped: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := c.Members[1].Restart(); err != nil {
		t.Fatal(err)
	}
	resp, err := only1.Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v2" {
		t.Fatalf("Get from the restarted member: %v %v", resp, err)
	}
}
