package redislock_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// Redis's own operations under the lock: a server restored from an RDB
// snapshot or from an append-only file that lost its last writes, and a
// failover to a replica that had not received the latest writes, on real
// redis-server processes (redistest). What the lock promises across them
// is in docs/distributed.md's Redis failure model.

// lockUnlock locks and unlocks key n times through l and returns the
// largest token it was granted.
func lockUnlock(t testing.TB, l *redislock.Locker, key string, n int) uint64 {
	t.Helper()
	ctx := context.Background()
	var last uint64
	for range n {
		g, err := l.Lock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if g.Token() <= last {
			t.Fatalf("token %d after %d", g.Token(), last)
		}
		last = g.Token()
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return last
}

// TestTokensAfterRestore: three grants, a snapshot of the server's data,
// three more grants, the server killed and restarted on that data: the
// next grant's token is larger than every token handed out before, the
// three the snapshot missed included, as a store that fences by token
// needs (a smaller one would have its writes refused, or a lost grant's
// accepted). RDB: a SAVE, then a restart from the snapshot (Redis's
// default persistence). AOF: appendfsync everysec, restarted on a copy of
// its files taken after the first three grants: what a disk holds after
// a power loss that lost the last second of appends.
func TestTokensAfterRestore(t *testing.T) {
	for _, tc := range []struct {
		name    string
		persist redistest.Persistence
	}{{"RDB", redistest.RDB}, {"AOF", redistest.AOF}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.StartServerWith(t, redistest.Options{Persistence: tc.persist})
			c := srv.NewClient(t)
			l := newLocker(t, c, "restore")
			ctx := context.Background()
			lockUnlock(t, l, "k", 3)
			var disk string
			if tc.persist == redistest.RDB {
				if err := c.Save(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			} else {
				disk = srv.CopyData(t)
			}
			last := lockUnlock(t, l, "k", 3)
			var err error
			if tc.persist == redistest.RDB {
				err = srv.Restart()
			} else {
				err = srv.RestartFrom(disk)
			}
			if err != nil {
				t.Fatal(err)
			}
			g, err := l.Lock(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("last token before the restart %d, first after %d", last, g.Token())
			if g.Token() <= last {
				t.Errorf("token %d after a restart from data older than the last grant; the last token handed out was %d", g.Token(), last)
			}
			if err := g.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// pointedClient returns a client whose connections go to the address in
// addr at the time they are dialled, closed by t.Cleanup: a client that
// follows a failover when the test points addr at the promoted replica,
// as go-redis's failover client does when Sentinel names it.
func pointedClient(t testing.TB, addr *atomic.Value) *redis.Client {
	return newClient(t, &redis.Options{
		Addr: addr.Load().(string),
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr.Load().(string))
		},
	})
}

// TestTokensAfterFailover: three grants replicated to a replica, its
// replication link stalled, three more grants, the primary killed and
// the replica promoted: the next grant, on the promoted replica, has a
// larger token than every token the old primary handed out, the three
// the replica missed included.
func TestTokensAfterFailover(t *testing.T) {
	primary := redistest.StartServer(t)
	replica := primary.StartReplica(t)
	l := newLocker(t, primary.NewClient(t), "failover-tokens")
	lockUnlock(t, l, "k", 3)
	if err := replica.Sync(); err != nil {
		t.Fatal(err)
	}
	replica.Stall()
	last := lockUnlock(t, l, "k", 3)
	primary.Stop()
	if err := replica.Promote(); err != nil {
		t.Fatal(err)
	}
	next := newLocker(t, replica.NewClient(t), "failover-tokens")
	ctx := context.Background()
	g, err := next.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("last token of the old primary %d, first of the promoted replica %d", last, g.Token())
	if g.Token() <= last {
		t.Errorf("token %d on the promoted replica; the old primary had handed out %d", g.Token(), last)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestFailoverToStalledReplicaGrantsAgain shows the risk that
// docs/distributed.md states for a failover without WithReplicas: a
// grant made on the primary after its replica's link stalled is not on
// the replica, and once the replica is promoted another Locker is
// granted the same key at once, while the first holder's Lost is still
// open (it closes at its next renewal on the new primary, which finds
// its entry gone, or at its renewal deadline). What fencing still gives:
// the second grant's token is larger, so a store that fences refuses the
// first holder's writes once it has taken the second's. This setup is
// the one a WithReplicas test uses to show that a confirmed grant
// survives.
func TestFailoverToStalledReplicaGrantsAgain(t *testing.T) {
	primary := redistest.StartServer(t)
	replica := primary.StartReplica(t)
	const prefix = "failover-twice"
	var addr atomic.Value
	addr.Store(primary.Addr())
	first := newLocker(t, pointedClient(t, &addr), prefix, redislock.WithTTL(10*time.Second))
	lockUnlock(t, first, "k", 1) // the key's counter reaches the replica
	if err := replica.Sync(); err != nil {
		t.Fatal(err)
	}
	replica.Stall()
	ctx := context.Background()
	g1, err := first.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	primary.Stop()
	if err := replica.Promote(); err != nil {
		t.Fatal(err)
	}
	second := newLocker(t, replica.NewClient(t), prefix)
	g2, err := second.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if isClosed(g1.Lost()) {
		t.Fatal("the first holder's Lost closed before the second grant: no double grant to show")
	}
	t.Logf("granted twice: token %d on the old primary, %d on the promoted replica; the first holder's Lost still open", g1.Token(), g2.Token())
	if g2.Token() <= g1.Token() {
		t.Errorf("the promoted replica handed out token %d, not above the old primary's %d: fencing cannot tell the two grants apart", g2.Token(), g1.Token())
	}
	// The first holder's client follows the failover only now, so that
	// its renewal could not find its entry gone before the second grant.
	addr.Store(replica.Addr())
	recvWithin(t, g1.Lost(), 10*time.Second, "the first holder's Lost did not close after the failover")
	if err := g1.Unlock(ctx); !errors.Is(err, redislock.ErrLost) {
		t.Errorf("the first holder's Unlock: %v, want ErrLost", err)
	}
	if err := g2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReleasedEntryRestored: a grant released after a snapshot comes back
// when the server restarts from it, with its session's marker; its
// Locker, which no longer knows the entry, goes on using the key (its
// new call renews the marker). Another Locker's call and the first
// Locker's own new call queue behind the restored entry; it must stop
// blocking them within one renewal period (TTL/3) of the Locker's next
// call, not when that Locker closes. RDB restore on one node, and a
// failover to a replica whose link stalled before the release.
func TestReleasedEntryRestored(t *testing.T) {
	const ttl = 6 * time.Second // the restored marker must outlive the restart
	bound := ttl/3 + 2*time.Second
	// queueBehind makes a second Locker on c2 and then l queue on k, behind
	// the restored entry, and checks that both are granted, in that
	// order, within bound of l's call.
	queueBehind := func(t *testing.T, l *redislock.Locker, c, c2 redis.UniversalClient, prefix string) {
		t.Helper()
		ctx := context.Background()
		if n := queueLen(t, c, prefix, "k"); n != 1 {
			t.Fatalf("the queue holds %d entries after the restore; want the released grant's", n)
		}
		other := newLocker(t, c2, prefix, redislock.WithTTL(ttl))
		otherGranted := lockAsync(t, ctx, other, "k")
		awaitQueue(t, c, prefix, "k", 2, 10*time.Second)
		start := time.Now()
		ownGranted := lockAsync(t, ctx, l, "k")
		g := awaitGrant(t, otherGranted, 3*ttl, "the other Locker's call stays behind the restored entry")
		t.Logf("the other Locker's call was granted %v after the restored entry's Locker called again (TTL %v)", time.Since(start), ttl)
		if d := time.Since(start); d > bound {
			t.Errorf("the other Locker's call was granted %v after the restored entry's Locker called again; want within %v (TTL/3 and a margin)", d, bound)
		}
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		own := awaitGrant(t, ownGranted, 3*ttl, "the Locker's own call stays behind its restored entry")
		if err := own.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		awaitQueue(t, c, prefix, "k", 0, 10*time.Second)
	}

	t.Run("RDB", func(t *testing.T) {
		srv := redistest.StartServerWith(t, redistest.Options{Persistence: redistest.RDB})
		c := srv.NewClient(t)
		const prefix = "restored"
		l := newLocker(t, c, prefix, redislock.WithTTL(ttl))
		ctx := context.Background()
		g, err := l.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Save(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		queueBehind(t, l, c, srv.NewClient(t), prefix)
	})

	t.Run("failover", func(t *testing.T) {
		primary := redistest.StartServer(t)
		replica := primary.StartReplica(t)
		const prefix = "restored-failover"
		var addr atomic.Value
		addr.Store(primary.Addr())
		c := pointedClient(t, &addr)
		l := newLocker(t, c, prefix, redislock.WithTTL(ttl))
		ctx := context.Background()
		g, err := l.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if err := replica.Sync(); err != nil {
			t.Fatal(err)
		}
		replica.Stall()
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		primary.Stop()
		if err := replica.Promote(); err != nil {
			t.Fatal(err)
		}
		addr.Store(replica.Addr())
		queueBehind(t, l, replica.NewClient(t), replica.NewClient(t), prefix)
	})
}

// TestSentinelFailover: a Locker and a waiter on go-redis's failover
// client, through a Sentinel (redistest). The primary is killed while a
// grant is held (its entry and marker replicated); Sentinel promotes the
// replica; the client follows it. The holder keeps its grant (its Lost
// stays open, its Unlock succeeds on the new primary), the waiter is
// granted once it unlocks, with a larger token, and both Lockers work on.
func TestSentinelFailover(t *testing.T) {
	primary := redistest.StartServer(t)
	replica := primary.StartReplica(t)
	sentinel := redistest.StartSentinel(t, primary)
	const prefix, ttl = "sentinel", 15 * time.Second // the grant outlives the failover
	ca, cb := sentinel.NewFailoverClient(t), sentinel.NewFailoverClient(t)
	la := newLocker(t, ca, prefix, redislock.WithTTL(ttl))
	lb := newLocker(t, cb, prefix, redislock.WithTTL(ttl))
	ctx := context.Background()
	g, err := la.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	waiter := lockAsync(t, ctx, lb, "k")
	awaitQueue(t, ca, prefix, "k", 2, 10*time.Second)
	if err := replica.Sync(); err != nil {
		t.Fatal(err)
	}
	primary.Stop()
	// Wait until Sentinel names the replica and the holder's client talks
	// to it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		a, err := sentinel.MasterAddr(ctx)
		if err == nil && a == replica.Addr() {
			info, err := ca.Info(ctx, "server").Result()
			if err == nil && strings.Contains(info, "tcp_port:"+strings.TrimPrefix(replica.Addr(), "127.0.0.1:")+"\r\n") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failover to the replica %s within 30 s (Sentinel names %q, %v)", replica.Addr(), a, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if isClosed(g.Lost()) {
		t.Fatal("the holder's grant was lost in a failover that kept its entry")
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatalf("the holder's Unlock on the promoted replica: %v", err)
	}
	gb := awaitGrant(t, waiter, ttl/3+5*time.Second, "the waiter was not granted after the failover and the holder's Unlock")
	if gb.Token() <= g.Token() {
		t.Errorf("the waiter's token %d after the holder's %d", gb.Token(), g.Token())
	}
	if err := gb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	last := lockUnlock(t, la, "k", 1)
	if last <= gb.Token() {
		t.Errorf("token %d after %d", last, gb.Token())
	}
	awaitQueue(t, ca, prefix, "k", 0, 10*time.Second)
}
