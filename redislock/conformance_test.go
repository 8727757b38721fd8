package redislock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest"
	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// harness returns the conformance harness over clients made by
// newClient: every Locker and Semaphore gets a client of its own, all on
// one prefix; Calls counts the entries of the key's queue; Lose removes
// the grant's entry, as another process's purge of a dead session would.
func harness(newClient func(t testing.TB) redis.UniversalClient) keylocktest.Harness {
	const prefix, semPrefix = "conformance", "conformance-semaphore"
	var mu sync.Mutex
	admins := map[testing.TB]redis.UniversalClient{}
	admin := func(t testing.TB) redis.UniversalClient { // one per t
		mu.Lock()
		defer mu.Unlock()
		c, ok := admins[t]
		if !ok {
			c = newClient(t)
			admins[t] = c
			t.Cleanup(func() {
				mu.Lock()
				delete(admins, t)
				mu.Unlock()
			})
		}
		return c
	}
	return keylocktest.Harness{
		New: func(t testing.TB) keylock.Locker {
			return newLocker(t, newClient(t), prefix)
		},
		Calls: func(t testing.TB, key string) int {
			c := admin(t)
			return queueLen(t, c, prefix, key) + queueLen(t, c, semPrefix, key)
		},
		Lose: func(t testing.TB, l keylock.Lease) {
			ctx := context.Background()
			if err := admin(t).ZRem(ctx, redislock.QueueKey(prefix, l.Key()), redislock.Member(l)).Err(); err != nil {
				t.Fatal(err)
			}
		},
		NewSemaphore: func(t testing.TB, n int64) keylock.Semaphore {
			s, err := redislock.NewSemaphore(newClient(t), semPrefix, n, redislock.WithTTL(testTTL))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := s.Close(ctx); err != nil {
					t.Errorf("Semaphore.Close: %v", err)
				}
			})
			return s
		},
	}
}

// TestConformance runs the keylock conformance suite on one Redis node.
func TestConformance(t *testing.T) {
	srv := redistest.StartServer(t)
	keylocktest.Run(t, harness(func(t testing.TB) redis.UniversalClient { return srv.NewClient(t) }))
}

// TestConformanceCluster runs the keylock conformance suite on a Redis
// Cluster of three masters, so that the keys of the suite spread over
// nodes and every script runs within one hash slot.
func TestConformanceCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	cl := redistest.StartNodes(t, 3)
	keylocktest.Run(t, harness(func(t testing.TB) redis.UniversalClient { return cl.NewClient(t) }))
}
