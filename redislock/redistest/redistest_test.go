package redistest_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStartRestart checks that a started server answers, keeps no data
// across Restart (no persistence), and answers again after it.
func TestStartRestart(t *testing.T) {
	ctx := context.Background()
	s := redistest.StartServer(t)
	c := s.NewClient(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	n, err := c.Exists(ctx, "k").Result()
	if err != nil {
		t.Fatalf("after Restart: %v", err)
	}
	if n != 0 {
		t.Errorf("after Restart: key k survived a restart without persistence")
	}
}

// TestCluster checks that a three-master cluster serves keys of every
// node through one cluster client.
func TestCluster(t *testing.T) {
	ctx := context.Background()
	c := redistest.StartCluster(t, 3)
	for i := range 30 {
		k := fmt.Sprint("key-", i)
		if err := c.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	var mu sync.Mutex
	var sizes []int64
	err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		size, err := n.DBSize(ctx).Result()
		mu.Lock()
		sizes = append(sizes, size)
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(sizes) != 3 || slices.Contains(sizes, 0) {
		t.Errorf("keys per master: %v; want three masters, each with some of the 30 keys", sizes)
	}
}

// TestPersistence checks what a killed server brings back: an RDB server
// the last snapshot (SAVE), not the writes after it; an AOF server every
// acknowledged write; and an AOF server restarted on a copy of its data
// taken earlier (a disk that lost its unflushed writes) only the writes
// before the copy.
func TestPersistence(t *testing.T) {
	ctx := context.Background()
	has := func(t *testing.T, c *redis.Client, key string) bool {
		t.Helper()
		n, err := c.Exists(ctx, key).Result()
		if err != nil {
			t.Fatalf("EXISTS %s: %v", key, err)
		}
		return n == 1
	}
	set := func(t *testing.T, c *redis.Client, key string) {
		t.Helper()
		if err := c.Set(ctx, key, "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("RDB", func(t *testing.T) {
		s := redistest.StartServerWith(t, redistest.Options{Persistence: redistest.RDB})
		c := s.NewClient(t)
		set(t, c, "before")
		if err := c.Save(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		set(t, c, "after")
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
		if !has(t, c, "before") || has(t, c, "after") {
			t.Errorf("after a restart from the snapshot: before %v, after %v; want true, false", has(t, c, "before"), has(t, c, "after"))
		}
	})
	t.Run("AOF", func(t *testing.T) {
		s := redistest.StartServerWith(t, redistest.Options{Persistence: redistest.AOF})
		c := s.NewClient(t)
		set(t, c, "before")
		disk := s.CopyData(t)
		set(t, c, "after")
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
		if !has(t, c, "before") || !has(t, c, "after") {
			t.Errorf("after a kill and restart: before %v, after %v; want both", has(t, c, "before"), has(t, c, "after"))
		}
		if err := s.RestartFrom(disk); err != nil {
			t.Fatal(err)
		}
		if !has(t, c, "before") || has(t, c, "after") {
			t.Errorf("after a restart from the earlier copy: before %v, after %v; want true, false", has(t, c, "before"), has(t, c, "after"))
		}
	})
}

// TestOptionsArgs checks that Options.Args reach the server.
func TestOptionsArgs(t *testing.T) {
	s := redistest.StartServerWith(t, redistest.Options{Args: []string{"--maxmemory", "5mb", "--maxmemory-policy", "volatile-ttl"}})
	got, err := s.NewClient(t).ConfigGet(context.Background(), "maxmemory-policy").Result()
	if err != nil {
		t.Fatal(err)
	}
	if got["maxmemory-policy"] != "volatile-ttl" {
		t.Errorf("maxmemory-policy %q, want volatile-ttl", got["maxmemory-policy"])
	}
}

// TestReplicaStallPromote checks that a replica has what the primary
// wrote before Stall (after Sync), misses what it wrote after, and keeps
// only the former once promoted, where it takes writes.
func TestReplicaStallPromote(t *testing.T) {
	ctx := context.Background()
	p := redistest.StartServer(t)
	r := p.StartReplica(t)
	pc, rc := p.NewClient(t), r.NewClient(t)
	if err := pc.Set(ctx, "before", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.Sync(); err != nil {
		t.Fatal(err)
	}
	r.Stall()
	if err := pc.Set(ctx, "after", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	// WAIT: the replica does not acknowledge the write while stalled.
	if n, err := pc.Wait(ctx, 1, 300*time.Millisecond).Result(); err != nil || n != 0 {
		t.Errorf("WAIT 1 while stalled: %d replicas acknowledged (%v); want 0", n, err)
	}
	p.Stop()
	if err := r.Promote(); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]int64{"before": 1, "after": 0} {
		if n, err := rc.Exists(ctx, key).Result(); err != nil || n != want {
			t.Errorf("EXISTS %s on the promoted replica: %d (%v); want %d", key, n, err, want)
		}
	}
	if err := rc.Set(ctx, "new", "v", 0).Err(); err != nil {
		t.Errorf("a write on the promoted replica: %v", err)
	}
}

// TestSentinelFailover checks that Sentinel fails a killed primary over
// to its replica and that go-redis's failover client follows: what was
// written (and synced) before the kill is read through it afterwards.
func TestSentinelFailover(t *testing.T) {
	ctx := context.Background()
	p := redistest.StartServer(t)
	r := p.StartReplica(t)
	s := redistest.StartSentinel(t, p)
	c := s.NewFailoverClient(t)
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := r.Sync(); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	deadline := time.Now().Add(30 * time.Second)
	for {
		a, err := s.MasterAddr(ctx)
		if err == nil && a == r.Addr() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Sentinel names %q (%v) as the primary 30 s after the kill; want the replica %s", a, err, r.Addr())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if v, err := c.Get(ctx, "k").Result(); err != nil || v != "v" {
		t.Errorf("GET k through the failover client after the failover: %q, %v", v, err)
	}
}
