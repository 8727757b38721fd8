package redislock_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// enqueueRequest is how an enqueue's EVALSHA starts: the command, the
// script's SHA1 and three keys.
var enqueueRequest = []byte("$7\r\nevalsha\r\n$40\r\n")

// isEnqueue reports whether a request is an EVALSHA with three keys: the
// enqueueing script (the renewal, the release and the check take fewer).
func isEnqueue(req []byte) bool {
	i := bytes.Index(bytes.ToLower(req), enqueueRequest)
	if i < 0 {
		return false
	}
	rest := req[i+len(enqueueRequest):]
	return len(rest) >= 40+2+8 && bytes.HasPrefix(rest[42:], []byte("$1\r\n3\r\n"))
}

// awaitRenewals waits until the Locker that owns marker has renewed it n
// times (its PTTL went up n times), failing t after d.
func awaitRenewals(t testing.TB, c redis.UniversalClient, marker string, n int, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(d)
	last := time.Duration(-1)
	for seen := 0; seen < n; {
		ttl, err := c.PTTL(ctx, marker).Result()
		if err != nil {
			t.Fatal(err)
		}
		if last >= 0 && ttl > last {
			seen++
		}
		last = ttl
		if time.Now().After(deadline) {
			t.Fatalf("%s renewed %d times within %v; want %d", marker, seen, d, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRenewalKeepsInFlightEntry: the renewal removes the entries of its
// session that hold the key and that its Locker does not know
// (TestReleasedEntryRestored), but not one whose enqueue has run on the
// server while its reply is still on the way: a second RLock of a key the
// Locker holds shared is granted at once by its script, whose reply is
// held back while the Locker renews its session twice. The entry stays,
// and once the reply arrives the call holds the key and unlocks without
// ErrLost.
func TestRenewalKeepsInFlightEntry(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.NewClient(t)
	p := newReplyDropper(t, srv.Addr(), isEnqueue)
	const prefix = "inflight"
	l := newLocker(t, p.NewClient(t), prefix)
	ctx := context.Background()
	g1, err := l.RLock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	p.arm()
	second := make(chan error, 1)
	var g2 *redislock.Guard
	go func() {
		g, err := l.RLock(owner.NewContext(ctx), "k")
		if err == nil {
			g2 = g.(*redislock.Guard)
		}
		second <- err
	}()
	recvWithin(t, p.held, 10*time.Second, "the second RLock's enqueue was not held")
	awaitQueue(t, admin, prefix, "k", 2, 10*time.Second)
	awaitRenewals(t, admin, redislock.MarkerKey(prefix, g1), 2, 3*testTTL)
	if n := queueLen(t, admin, prefix, "k"); n != 2 {
		t.Errorf("the queue holds %d entries after two renewals while the second RLock's reply was held; want both", n)
	}
	p.deliver()
	if err := recvWithin(t, second, 10*time.Second, "the second RLock did not return"); err != nil {
		t.Fatal(err)
	}
	if isClosed(g2.Lost()) {
		t.Error("the second RLock's grant is lost")
	}
	if err := g2.Unlock(ctx); err != nil {
		t.Errorf("the second RLock's Unlock: %v", err)
	}
	if err := g1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	awaitQueue(t, admin, prefix, "k", 0, 10*time.Second)
}
