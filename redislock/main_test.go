package redislock_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	"github.com/fairlock/fairlock/redislock"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// TestMain runs a worker's role (process_test.go) instead of the tests
// in a re-executed test binary.
func TestMain(m *testing.M) {
	if w, ok := disttest.IsWorker(); ok {
		os.Exit(runWorker(w))
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

// queueLen returns the number of entries in key's queue under prefix,
// Waits included.
func queueLen(t testing.TB, client redis.UniversalClient, prefix, key string) int {
	t.Helper()
	n := 0
	for _, z := range []string{redislock.QueueKey(prefix, key), redislock.WaitsKey(prefix, key)} {
		m, err := client.ZCard(context.Background(), z).Result()
		if err != nil {
			t.Fatalf("ZCARD %s: %v", z, err)
		}
		n += int(m)
	}
	return n
}

// awaitQueue polls until key's queue under prefix has n entries, failing
// t after d. A poll, not an ordering: the count decides.
func awaitQueue(t testing.TB, c redis.UniversalClient, prefix, key string, n int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := queueLen(t, c, prefix, key)
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue of %q: %d entries, want %d within %v", key, got, n, d)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// newClient returns a client made with opts, closed by t.Cleanup: for
// the clients a test shapes itself (through a proxy, with a small pool,
// with long reads).
func newClient(t testing.TB, opts *redis.Options) *redis.Client {
	t.Helper()
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return c
}

// lockAsync calls l.Lock(ctx, key) in a goroutine and returns the
// channel its Lease comes on (buffered: the goroutine never blocks). A
// failed Lock fails t and sends nil.
func lockAsync(t testing.TB, ctx context.Context, l *redislock.Locker, key string) <-chan keylock.Lease {
	ch := make(chan keylock.Lease, 1)
	go func() {
		g, err := l.Lock(ctx, key)
		if err != nil {
			t.Error(err)
		}
		ch <- g
	}()
	return ch
}

// recvWithin returns the next value received from ch, failing t with msg
// (and the time waited) if none comes within d.
func recvWithin[T any](t testing.TB, ch <-chan T, d time.Duration, msg string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s (waited %v)", msg, d)
	}
	var zero T
	return zero
}

// awaitGrant returns the Lease that a channel of lockAsync delivers,
// failing t with msg if none comes within d, and ending the test at once
// if the Lock failed (lockAsync has reported its error).
func awaitGrant(t testing.TB, ch <-chan keylock.Lease, d time.Duration, msg string) keylock.Lease {
	t.Helper()
	g := recvWithin(t, ch, d, msg)
	if g == nil {
		t.FailNow()
	}
	return g
}

// isClosed reports whether ch is closed (a Lease's Lost, say), without
// waiting.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
