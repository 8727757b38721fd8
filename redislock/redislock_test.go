package redislock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
)

// TestKeysDoNotCollide: keys whose escaped forms could meet ("a" and
// "a/b", braces that would end a hash tag, percent signs) are
// independent locks, and leave nothing behind.
func TestKeysDoNotCollide(t *testing.T) {
	c := redistest.Start(t)
	const prefix = "esc/{p}"
	l := newLocker(t, c, prefix)
	ctx := context.Background()
	keys := []string{"a", "a/b", "a%2Fb", "{a}", "a}", "{", "}", "%", "%25", "", "a:b"}
	var held []keylock.Lease
	for _, k := range keys {
		g, err := l.TryLock(ctx, k)
		if err != nil {
			t.Fatalf("TryLock(%q) with the other keys held: %v", k, err)
		}
		held = append(held, g)
	}
	for i, k := range keys {
		if _, err := l.TryLock(owner.NewContext(ctx), k); !errors.Is(err, fairlock.ErrWouldBlock) {
			t.Errorf("a second TryLock(%q): %v, want ErrWouldBlock", k, err)
		}
		if err := held[i].Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if n := queueLen(t, c, prefix, k); n != 0 {
			t.Errorf("key %q: %d entries after Unlock", k, n)
		}
	}
}

// TestSemaphoreSizeMismatch: a Semaphore whose n differs from the one
// the key's queue was made with fails with ErrInvalidWeight naming both
// sizes, and writes nothing.
func TestSemaphoreSizeMismatch(t *testing.T) {
	c := redistest.Start(t)
	ctx := context.Background()
	s3, err := redislock.NewSemaphore(c, "sem", 3, redislock.WithTTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close(ctx)
	s2, err := redislock.NewSemaphore(c, "sem", 2, redislock.WithTTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close(ctx)
	g, err := s3.Acquire(ctx, "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := s2.Acquire(owner.NewContext(ctx), "k", 1)
	if !errors.Is(err, fairlock.ErrInvalidWeight) || l != nil {
		t.Fatalf("Acquire on a 2-unit Semaphore of a 3-unit key: %v, %v; want a nil Lease and ErrInvalidWeight", l, err)
	}
	if msg := err.Error(); !strings.Contains(msg, "2 units") || !strings.Contains(msg, "of 3") {
		t.Errorf("the error does not name both sizes: %s", msg)
	}
	if n := queueLen(t, c, "sem", "k"); n != 1 {
		t.Errorf("%d entries after the refused Acquire, want 1", n)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestLocked: Locked sees a holder in another process (here, another
// Locker), and stops seeing it when it unlocks.
func TestLocked(t *testing.T) {
	c := redistest.Start(t)
	a, b := newLocker(t, c, "locked"), newLocker(t, c, "locked")
	ctx := context.Background()
	if ok, err := b.Locked(ctx, "k"); err != nil || ok {
		t.Fatalf("Locked on a free key: %v %v", ok, err)
	}
	g, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Locked(ctx, "k"); err != nil || !ok {
		t.Fatalf("Locked on a held key: %v %v", ok, err)
	}
	g.Unlock(ctx)
	if ok, err := b.Locked(ctx, "k"); err != nil || ok {
		t.Fatalf("Locked after Unlock: %v %v", ok, err)
	}
}

// TestScriptFlush: SCRIPT FLUSH while a call waits; the holder's Unlock
// (EVALSHA answered NOSCRIPT, then EVAL) still hands the key over.
func TestScriptFlush(t *testing.T) {
	c := redistest.Start(t)
	a, b := newLocker(t, c, "flush"), newLocker(t, c, "flush")
	ctx := context.Background()
	g, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	done := lockAsync(t, ctx, b, "k")
	awaitQueue(t, c, "flush", "k", 2, 10*time.Second)
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatalf("Unlock after SCRIPT FLUSH: %v", err)
	}
	// Within testTTL, less than the re-read period's worst case: the
	// release's notice granted it.
	l := awaitGrant(t, done, testTTL, "the waiter was not granted after SCRIPT FLUSH")
	if l.Token() <= g.Token() {
		t.Errorf("token %d after %d", l.Token(), g.Token())
	}
	l.Unlock(ctx)
	awaitQueue(t, c, "flush", "k", 0, 10*time.Second)
}

// TestServerRestart: the server restarts (empty: no persistence) while
// one Locker holds a key and another waits. The holder's Lost closes
// (its session marker is gone), its Unlock returns ErrLost, the waiter
// queues again and is granted with a larger token (the counter starts
// again from the server's clock), and both Lockers work afterwards.
func TestServerRestart(t *testing.T) {
	srv := redistest.StartServer(t)
	ca, cb := srv.NewClient(t), srv.NewClient(t)
	la, lb := newLocker(t, ca, "restart"), newLocker(t, cb, "restart")
	ctx := context.Background()
	ga, err := la.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	granted := lockAsync(t, ctx, lb, "k")
	awaitQueue(t, ca, "restart", "k", 2, 10*time.Second)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	recvWithin(t, ga.Lost(), 3*testTTL, "the holder's Lost did not close after the server lost its state")
	gb := awaitGrant(t, granted, 3*testTTL, "the waiter was not granted after the restart")
	if gb.Token() <= ga.Token() {
		t.Errorf("token %d after the restart, not above the holder's %d", gb.Token(), ga.Token())
	}
	if err := ga.Unlock(ctx); !errors.Is(err, redislock.ErrLost) {
		t.Errorf("the old holder's Unlock: %v, want ErrLost", err)
	}
	if err := gb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*redislock.Locker{la, lb} {
		g, err := l.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	awaitQueue(t, ca, "restart", "k", 0, 10*time.Second)
}

// TestCancellationStorm: 200 calls on one key through four Lockers, each
// with a context that ends at a random moment within 300 ms, while the key passes from
// holder to holder; every call returns either a grant with a nil error or
// nothing with its context's error, never two holders at once, and the
// queue is empty at the end.
func TestCancellationStorm(t *testing.T) {
	c := redistest.Start(t)
	var ls []*redislock.Locker
	for range 4 {
		ls = append(ls, newLocker(t, c, "storm"))
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		inside  int
		grants  int
		timeout int
	)
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := time.Duration(rand.IntN(300)) * time.Millisecond
			ctx, cancel := context.WithTimeout(owner.NewContext(context.Background()), d)
			defer cancel()
			g, err := ls[i%len(ls)].Lock(ctx, "k")
			if err != nil {
				if g != nil || !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("a failed Lock: %v, %v", g, err)
				}
				mu.Lock()
				timeout++
				mu.Unlock()
				return
			}
			mu.Lock()
			inside++
			grants++
			if inside != 1 {
				t.Errorf("%d holders at once", inside)
			}
			mu.Unlock()
			time.Sleep(time.Millisecond) // hold the key: a span, not an ordering
			mu.Lock()
			inside--
			mu.Unlock()
			if err := g.Unlock(context.Background()); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d grants, %d calls cancelled", grants, timeout)
	if grants == 0 || timeout == 0 {
		t.Errorf("%d grants and %d cancelled calls: the storm did not mix both", grants, timeout)
	}
	awaitQueue(t, c, "storm", "k", 0, 10*time.Second)
}

// TestManyWaitersFIFO: 500 calls queue on one key through five Lockers,
// each seen in the queue before the next starts; they are granted in
// exactly that order, with strictly increasing tokens.
func TestManyWaitersFIFO(t *testing.T) {
	if testing.Short() {
		t.Skip("500 waiters")
	}
	c := redistest.Start(t)
	const n = 500
	var ls []*redislock.Locker
	for range 5 {
		ls = append(ls, newLocker(t, c, "many"))
	}
	ctx := context.Background()
	first, err := ls[0].Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []int
	var tokens []uint64
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := ls[i%len(ls)].Lock(owner.NewContext(ctx), "k")
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			tokens = append(tokens, g.Token())
			mu.Unlock()
			if err := g.Unlock(ctx); err != nil {
				t.Error(err)
			}
		}()
		awaitQueue(t, c, "many", "k", i+2, 30*time.Second)
	}
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i := range order {
		if order[i] != i {
			t.Fatalf("grant %d went to the call queued %d-th (order %v…)", i, order[i], order[:min(len(order), i+5)])
		}
		if i > 0 && tokens[i] <= tokens[i-1] {
			t.Fatalf("grant %d: token %d after %d", i, tokens[i], tokens[i-1])
		}
	}
	awaitQueue(t, c, "many", "k", 0, 10*time.Second)
}

// TestSubscriptionDropped: the server drops every pub/sub connection and
// the holder releases at once, so the release's notice is likely
// published while nobody listens. The waiter is granted all the same,
// well before its Locker's periodic re-read (TTL/3, 10 s here): go-redis
// resubscribes, and the Locker re-reads the queues of its waiting calls.
func TestSubscriptionDropped(t *testing.T) {
	c := redistest.Start(t)
	const ttl = 30 * time.Second
	a := newLocker(t, c, "dropped", redislock.WithTTL(ttl))
	w := newLocker(t, c, "dropped", redislock.WithTTL(ttl))
	ctx := context.Background()
	g, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	granted := lockAsync(t, ctx, w, "k")
	awaitQueue(t, c, "dropped", "k", 2, 10*time.Second)
	if err := c.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l := awaitGrant(t, granted, ttl/6, "the waiter was not granted after the release, with its subscription dropped")
	l.Unlock(ctx)
}

// TestSessionExpired: the holder's session marker on its key disappears
// (as when the server expires it: here DEL, so the test need not wait a
// TTL). The next renewal sees it gone: Lost closes, the waiter's Locker
// purges the dead entry when it re-reads the queue, the waiter is granted
// with a larger token, and the old holder's Unlock returns ErrLost. The
// marker is not brought back by the renewal.
func TestSessionExpired(t *testing.T) {
	c := redistest.Start(t)
	a, b := newLocker(t, c, "expired"), newLocker(t, c, "expired")
	ctx := context.Background()
	ga, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	granted := lockAsync(t, ctx, b, "k")
	awaitQueue(t, c, "expired", "k", 2, 10*time.Second)
	marker := redislock.MarkerKey("expired", ga)
	if n, err := c.Del(ctx, marker).Result(); err != nil || n != 1 {
		t.Fatalf("DEL %s: %v %v", marker, n, err)
	}
	recvWithin(t, ga.Lost(), 3*testTTL, "Lost did not close after the session's marker went")
	gb := awaitGrant(t, granted, 3*testTTL, "the waiter was not granted after the holder's session ended")
	if gb.Token() <= ga.Token() {
		t.Errorf("token %d after %d", gb.Token(), ga.Token())
	}
	if n, _ := c.Exists(ctx, marker).Result(); n != 0 {
		t.Errorf("the renewal brought the expired marker %s back", marker)
	}
	if err := ga.Unlock(ctx); !errors.Is(err, redislock.ErrLost) {
		t.Errorf("Unlock of the lost grant: %v, want ErrLost", err)
	}
	if err := gb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	awaitQueue(t, c, "expired", "k", 0, 10*time.Second)
}
