package redistest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// slots is the number of hash slots of a Redis Cluster.
const slots = 16384

// Cluster is a local Redis Cluster of masters only, started by
// StartNodes.
type Cluster struct {
	Nodes []*Server // the masters; Nodes[i] serves the i'th range of slots
}

// StartCluster starts a Redis Cluster of masters nodes (no replicas) on
// loopback and returns a cluster client of it, both stopped by
// tb.Cleanup. It is StartNodes(tb, masters).NewClient(tb).
func StartCluster(tb testing.TB, masters int) *redis.ClusterClient {
	tb.Helper()
	return StartNodes(tb, masters).NewClient(tb)
}

// StartNodes starts masters redis-server processes with cluster-enabled
// yes, splits the 16384 hash slots among them in equal ranges (CLUSTER
// ADDSLOTSRANGE), joins them (CLUSTER MEET), and waits until every node
// reports cluster_state:ok and knows every other (at most 20 s). It fails
// tb if masters < 1 or the cluster does not form.
func StartNodes(tb testing.TB, masters int) *Cluster {
	tb.Helper()
	if masters < 1 {
		tb.Fatalf("redistest: StartCluster with %d masters", masters)
	}
	c := &Cluster{}
	for range masters {
		c.Nodes = append(c.Nodes, startServer(tb, true))
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	clients := make([]*redis.Client, masters)
	for i, n := range c.Nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: n.Addr()})
		defer clients[i].Close()
	}
	for i, cl := range clients {
		lo, hi := i*slots/masters, (i+1)*slots/masters-1
		if err := cl.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			tb.Fatalf("redistest: CLUSTER ADDSLOTSRANGE %d %d on %s: %v", lo, hi, c.Nodes[i].Addr(), err)
		}
	}
	for i := 1; i < masters; i++ {
		if err := clients[0].ClusterMeet(ctx, "127.0.0.1", fmt.Sprint(c.Nodes[i].port)).Err(); err != nil {
			tb.Fatalf("redistest: CLUSTER MEET %s: %v", c.Nodes[i].Addr(), err)
		}
	}
	for i, cl := range clients {
		for {
			info, err := cl.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d\r", masters)) {
				break
			}
			select {
			case <-ctx.Done():
				tb.Fatalf("redistest: node %s: cluster not ready within %v: %v\n%s", c.Nodes[i].Addr(), startTimeout, err, info)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return c
}

// NewClient returns a cluster client of c, closed by tb.Cleanup.
func (c *Cluster) NewClient(tb testing.TB) *redis.ClusterClient {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	tb.Cleanup(func() { cl.Close() })
	return cl
}
