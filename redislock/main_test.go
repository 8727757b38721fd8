package redislock_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/fairlock/fairlock/redislock"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// workerEnv names the role of a re-executed test binary: TestMain runs
// the worker (process_test.go) instead of the tests when it is set.
const workerEnv = "REDISLOCK_TEST_WORKER"

func TestMain(m *testing.M) {
	if role := os.Getenv(workerEnv); role != "" {
		os.Exit(runWorker(role))
	}
	goleak.VerifyTestMain(m)
}

// testTTL is the session TTL of the tests' Lockers: short, so that tests
// of lost sessions run fast, yet long enough that a renewal (every TTL/3)
// delayed by the race detector and a loaded machine still lands in time.
const testTTL = 2 * time.Second

// newLocker returns a Locker on client under prefix, closed by t.Cleanup
// (which fails the test if Close fails).
func newLocker(t testing.TB, client redis.UniversalClient, prefix string, opts ...redislock.Option) *redislock.Locker {
	t.Helper()
	l, err := redislock.New(client, prefix, append([]redislock.Option{redislock.WithTTL(testTTL)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}

// queueLen returns the number of entries in key's queue under prefix.
func queueLen(t testing.TB, client redis.UniversalClient, prefix, key string) int {
	t.Helper()
	n, err := client.ZCard(context.Background(), redislock.QueueKey(prefix, key)).Result()
	if err != nil {
		t.Fatalf("ZCARD %s: %v", redislock.QueueKey(prefix, key), err)
	}
	return int(n)
}
