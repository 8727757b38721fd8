package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the name a Sentinel started by StartSentinel
// monitors its primary under.
const SentinelMaster = "redistest"

// Sentinel is a Redis Sentinel process monitoring one primary, started
// by StartSentinel: redis-server --sentinel, the same program as the
// redis-sentinel binary, which Debian ships in a package of its own
// (redis-sentinel) while redis-server is all redistest needs. Addr is its
// address.
type Sentinel struct {
	*Server
}

// StartSentinel starts one Sentinel on a free loopback port that
// monitors primary as SentinelMaster with a quorum of 1 (it alone
// decides), considers it down after 1 s without a reply
// (down-after-milliseconds 1000) and then fails it over to a replica
// (one started by StartReplica: Sentinel promotes it and points the
// others at it). It waits until the Sentinel knows every replica the
// primary had and sees their links up (at most 20 s), and stops the
// Sentinel in tb.Cleanup. Sentinel's own failover adds up to a second of
// random delay, so a failover completes a few seconds after the primary
// stops answering.
func StartSentinel(tb testing.TB, primary *Server) *Sentinel {
	tb.Helper()
	dir := tb.TempDir()
	host, port, _ := net.SplitHostPort(primary.Addr())
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]s 1\nsentinel down-after-milliseconds %[1]s 1000\n",
		SentinelMaster, host, port)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		tb.Fatal(err)
	}
	s := &Server{sentinel: conf}
	startProcess(tb, s)
	sn := &Sentinel{Server: s}

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	p := redis.NewClient(&redis.Options{Addr: primary.Addr()})
	defer p.Close()
	info, err := p.Info(ctx, "replication").Result()
	if err != nil {
		tb.Fatalf("redistest: INFO replication on %s: %v", primary.Addr(), err)
	}
	want, _ := strconv.Atoi(infoField(info, "connected_slaves"))
	c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr()})
	defer c.Close()
	err = poll(ctx, func() (bool, error) {
		reps, err := c.Replicas(ctx, SentinelMaster).Result()
		if err != nil {
			return false, err
		}
		up := 0
		for _, r := range reps {
			if r["flags"] == "slave" && r["master-link-status"] == "ok" {
				up++
			}
		}
		return up >= want, nil
	}, fmt.Sprintf("Sentinel %s knows the %d replicas of %s, their links up", sn.Addr(), want, primary.Addr()))
	if err != nil {
		tb.Fatal(err)
	}
	return sn
}

// NewFailoverClient returns go-redis's failover client of the primary
// the Sentinel monitors (redis.NewFailoverClient with SentinelMaster and
// the Sentinel's address), closed by tb.Cleanup: it asks the Sentinel for
// the primary's address and follows it to the replica the Sentinel
// promotes.
func (s *Sentinel) NewFailoverClient(tb testing.TB) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    SentinelMaster,
		SentinelAddrs: []string{s.Addr()},
	})
	tb.Cleanup(func() { c.Close() })
	return c
}

// MasterAddr returns the address of the primary as the Sentinel sees it
// now (SENTINEL GET-MASTER-ADDR-BY-NAME): after a failover, the promoted
// replica's.
func (s *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr()})
	defer c.Close()
	a, err := c.GetMasterAddrByName(ctx, SentinelMaster).Result()
	if err != nil {
		return "", err
	}
	if len(a) != 2 {
		return "", fmt.Errorf("redistest: SENTINEL GET-MASTER-ADDR-BY-NAME: %q", a)
	}
	return net.JoinHostPort(a[0], a[1]), nil
}
