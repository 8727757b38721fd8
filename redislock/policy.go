package redislock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The server's eviction policy. With maxmemory set, Redis evicts keys
// under memory pressure as its maxmemory-policy says: allkeys-* any key,
// volatile-* the keys with an expiry, which the session markers and the
// counters have. An evicted marker kills its session's entries, an
// evicted queue every entry of the key: the key can be granted to
// another while its holder's Lost stays open until the holder's next
// renewal. Only noeviction (writes fail instead when memory is full,
// which the Locker reports as errors) keeps the lock's keys. New reads
// the policy of every primary the client reaches and refuses any other;
// where CONFIG is not allowed (renamed, or denied by an ACL, as managed
// services often do) it cannot know, and warns once.
// (redis.io/docs/latest/develop/reference/eviction.)

// policyTimeout bounds New's reading of the eviction policy.
const policyTimeout = 10 * time.Second

// checkEviction reads maxmemory-policy (CONFIG GET) on every primary
// client reaches: a Cluster's masters, a Ring's shards, or the one server
// of a Client (a failover client's primary). It returns an error naming
// each server whose policy is not noeviction, its policy and the setting
// to make; or, if a server cannot be reached, that error. A server that
// answers CONFIG with an error (the command renamed or denied) or with
// no policy is not known to keep the lock's keys: checkEviction then
// logs one warning through logger, with the Locker's name, and returns
// nil. It takes one round trip per primary, bounded by policyTimeout.
func checkEviction(client redis.UniversalClient, logger *slog.Logger, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), policyTimeout)
	defer cancel()
	var (
		mu         sync.Mutex
		evicting   []string
		unreadable error
	)
	check := func(ctx context.Context, c redis.Cmdable, where string) error {
		m, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		var rerr redis.Error
		if err != nil && !errors.As(err, &rerr) {
			return fmt.Errorf("read maxmemory-policy%s: %w", where, err)
		}
		mu.Lock()
		defer mu.Unlock()
		switch policy := m["maxmemory-policy"]; {
		case err != nil:
			unreadable = fmt.Errorf("CONFIG GET maxmemory-policy%s: %w", where, err)
		case policy == "":
			unreadable = fmt.Errorf("CONFIG GET maxmemory-policy%s: no value", where)
		case policy != "noeviction":
			evicting = append(evicting, policy+where)
		}
		return nil
	}
	node := func(ctx context.Context, c *redis.Client) error { return check(ctx, c, " on "+c.Options().Addr) }
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, node)
	case *redis.Ring:
		err = c.ForEachShard(ctx, node)
	default:
		err = check(ctx, client, "")
	}
	if err != nil {
		return err
	}
	if len(evicting) > 0 {
		return fmt.Errorf("maxmemory-policy %s: Redis may evict the lock's keys (a session marker, a queue) under memory pressure and grant a key twice; set maxmemory-policy noeviction", strings.Join(evicting, ", "))
	}
	if unreadable != nil {
		logger.Warn("redislock: cannot read the server's maxmemory-policy; it must be noeviction, or Redis may evict the lock's keys under memory pressure and grant a key twice",
			"locker", name, "error", unreadable)
	}
	return nil
}
