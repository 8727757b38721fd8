package redistest_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

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
