package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// WithReplicas (issue 42, item 10): a grant and each renewal count only
// once the replicas acknowledged them.

// TestWithReplicasRefusesUnconfirmed: with the replication link stalled,
// a Lock made WithReplicas(1, …) fails with an error wrapping
// ErrNotReplicated and leaves nothing in the queue, where a Locker
// without the option is granted (a grant a failover would forget); once
// the link is back, it is granted.
func TestWithReplicasRefusesUnconfirmed(t *testing.T) {
	primary := redistest.StartServer(t)
	replica := primary.StartReplica(t)
	c := primary.NewClient(t)
	const prefix = "replicas-refuse"
	careful := newLocker(t, c, prefix, redislock.WithReplicas(1, 200*time.Millisecond), redislock.WithLogger(quietLogger()))
	plain := newLocker(t, c, prefix)
	ctx := context.Background()
	awaitAcks(t, c)
	lockUnlock(t, careful, "k", 1) // acknowledged while the link is up
	replica.Stall()
	g, err := careful.Lock(ctx, "k")
	var le *fairlock.LockError
	if g != nil || !errors.Is(err, redislock.ErrNotReplicated) || !errors.As(err, &le) || le.Key != "k" {
		t.Fatalf("Lock WithReplicas with the link stalled: %v, %v; want a nil Lease and a *fairlock.LockError on \"k\" wrapping ErrNotReplicated", g, err)
	}
	awaitQueue(t, c, prefix, "k", 0, 10*time.Second)
	g, err = plain.Lock(ctx, "k")
	if err != nil {
		t.Fatalf("Lock without WithReplicas, link stalled: %v; want a grant", err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	replica.Resume()
	if err := replica.Sync(); err != nil {
		t.Fatal(err)
	}
	lockUnlock(t, careful, "k", 1)
}

// TestWithReplicasFailover: a holder granted WithReplicas(1, …), the
// replication link then stalled, the primary killed and the replica
// promoted after a renewal ran on the primary alone. The grant was
// acknowledged, so it is on the promoted replica: another Locker there is
// not granted the key until the first holder's Deadline has passed (the
// renewal, unacknowledged, did not move it: without the option it does,
// and the second grant comes while the first holder's Deadline is still
// ahead), and its token is larger. Compare TestFailoverToStalledReplicaGrantsAgain,
// where without the option the key is granted twice.
func TestWithReplicasFailover(t *testing.T) {
	primary := redistest.StartServer(t)
	replica := primary.StartReplica(t)
	const prefix = "replicas-failover"
	const ttl = 3 * time.Second
	pc := primary.NewClient(t)
	awaitAcks(t, pc)
	// Closed by hand: its primary is gone by then, so its Close cannot
	// remove its entry (which its session's TTL removes).
	first, err := redislock.New(pc, prefix, redislock.WithTTL(ttl),
		redislock.WithReplicas(1, 200*time.Millisecond), redislock.WithLogger(quietLogger()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = first.Close(cctx)
	}()
	ctx := context.Background()
	lockUnlock(t, first, "k", 1)
	g1, err := first.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	replica.Stall()
	// A renewal runs on the primary during the stall (the marker's TTL
	// there goes back up): unacknowledged, it must not move g1's
	// Deadline past what the replica has.
	marker := redislock.MarkerKey(prefix, g1)
	mon := primary.NewClient(t)
	prev, err := mon.PTTL(ctx, marker).Result()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * ttl)
	for {
		now, err := mon.PTTL(ctx, marker).Result()
		if err != nil {
			t.Fatal(err)
		}
		if now > prev {
			break // the TTL went back up: a renewal
		}
		prev = now
		if time.Now().After(deadline) {
			t.Fatal("no renewal reached the primary during the stall")
		}
		time.Sleep(20 * time.Millisecond) // a poll: the marker's TTL decides
	}
	primary.Stop()
	if err := replica.Promote(); err != nil {
		t.Fatal(err)
	}
	second := newLocker(t, replica.NewClient(t), prefix, redislock.WithTTL(ttl))
	granted := lockAsync(t, ctx, second, "k")
	g2 := awaitGrant(t, granted, 5*ttl, "the second Locker was not granted the key once the first holder's session expired")
	at := time.Now()
	if d := g1.Deadline(); !at.After(d) {
		t.Errorf("the promoted replica granted the key at %v, before the first holder's Deadline %v: granted twice", at, d)
	}
	if !isClosed(g1.Lost()) && keyValid(g1) {
		t.Error("the first holder's grant is still Valid after the second grant")
	}
	if g2.Token() <= g1.Token() {
		t.Errorf("token %d on the promoted replica, not above the first grant's %d", g2.Token(), g1.Token())
	}
	if err := g2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	uctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_ = g1.Unlock(uctx) // its primary is gone: lost, or a failed release
}

// keyValid is keylock.Valid.
func keyValid(l keylock.Lease) bool { return keylock.Valid(l) }

// awaitAcks waits until the replicas of c's server acknowledge writes
// (WAIT 1 answers 1): right after its first sync, a replica may take a
// while to acknowledge.
func awaitAcks(t testing.TB, c *redis.Client) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for {
		p := c.Pipeline()
		p.Set(ctx, "redislock-test-ack", 1, 0)
		w := p.Do(ctx, "WAIT", 1, 100)
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		if n, _ := w.Int64(); n >= 1 {
			c.Del(ctx, "redislock-test-ack")
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica does not acknowledge writes")
		}
	}
}
