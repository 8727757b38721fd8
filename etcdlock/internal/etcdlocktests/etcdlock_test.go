package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/internal/testhook"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	"github.com/fairlock/fairlock/owner"
	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestLockUnlock(t *testing.T) {
	c := startClient(t)
	l := newLocker(t, c, "/t")
	ctx := context.Background()
	g := mustLock(t, ctx, l, "k")
	if g.Key() != "k" || g.Token() == 0 {
		t.Fatalf("Key %q Token %d", g.Key(), g.Token())
	}
	if locked, err := l.Locked(ctx, "k"); err != nil || !locked {
		t.Fatalf("Locked = %v, %v while held", locked, err)
	}
	keys := keysUnder(t, c, "/t/")
	if len(keys) != 1 || !strings.HasPrefix(keys[0], "/t/k/") {
		t.Fatalf("keys under the prefix: %q", keys)
	}
	resp, err := c.Txn(ctx).If(isOwner(g)).Then(clientv3.OpPut("/data/k", "1")).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("fenced write while held: %v, %v", resp, err)
	}
	mustUnlock(t, ctx, g)
	if err := g.Unlock(ctx); err != nil {
		t.Fatalf("second Unlock: %v", err)
	}
	if locked, err := l.Locked(ctx, "k"); err != nil || locked {
		t.Fatalf("Locked = %v, %v after Unlock", locked, err)
	}
	if keys := keysUnder(t, c, "/t/"); len(keys) != 0 {
		t.Fatalf("keys left: %q", keys)
	}
	notLost(t, g, "after Unlock")
}

// TestMisuse: New refuses a nil client and a prefix that is empty or only
// slashes, naming it, and ignores a nil Option as fairlock.New does;
// Locked with a nil ctx panics naming the call.
func TestMisuse(t *testing.T) {
	c := startClient(t)
	if _, err := etcdlock.New(nil, "/t"); err == nil || !strings.Contains(err.Error(), "nil client") {
		t.Errorf("New(nil client): %v", err)
	}
	for _, prefix := range []string{"", "/", "///"} {
		if _, err := etcdlock.New(c, prefix); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("prefix %q", prefix)) {
			t.Errorf("New(%q): %v, want an error naming the prefix", prefix, err)
		}
	}
	l := newLocker(t, c, "/misuse", nil)
	ctx := context.Background()
	g, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatalf("Lock on a Locker made with a nil Option: %v", err)
	}
	mustUnlock(t, ctx, g)
	defer func() {
		if r := recover(); r != "etcdlock: Locked with a nil context" {
			t.Fatalf("Locked(nil) recovered %v", r)
		}
	}()
	var nilCtx context.Context // the misuse under test
	l.Locked(nilCtx, "k")
}

// TestFIFO queues waiters in a known order (each waiter's key is seen in
// etcd before the next one starts) and checks that they are granted in
// that order with increasing tokens.
func TestFIFO(t *testing.T) {
	c := startClient(t)
	l := newLocker(t, c, "/fifo")
	ctx := context.Background()
	first := mustLock(t, ctx, l, "k")
	const n = 12 // more than the eight keys a waiter subscribes to
	var (
		mu     sync.Mutex
		order  []int
		tokens []uint64
		wg     sync.WaitGroup
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := l.Lock(ctx, "k")
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
		waitKeys(t, c, "/fifo/", i+2, 5*time.Second)
	}
	mustUnlock(t, ctx, first)
	wg.Wait()
	want := make([]int, n)
	for i := range want {
		want[i] = i
	}
	if diff := cmp.Diff(want, order); diff != "" {
		t.Errorf("grant order (-queued +granted):\n%s", diff)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Errorf("tokens not increasing: %v", tokens)
			break
		}
	}
	if tokens[0] <= first.Token() {
		t.Errorf("token %d after %d", tokens[0], first.Token())
	}
	waitKeys(t, c, "/fifo/", 0, 5*time.Second)
}

// TestTryLockNeverOvertakes: once a waiter is queued, TryLock fails even
// in the instant after the holder released, until the waiter is done.
func TestTryLockNeverOvertakes(t *testing.T) {
	c := startClient(t)
	l := newLocker(t, c, "/try")
	other := newLocker(t, c, "/try")
	ctx := context.Background()
	g, err := l.TryLock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryLock(ctx, "k"); !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatalf("TryLock of a held key: %v", err)
	}
	waiter := startLock(ctx, other.Lock, "k")
	waitKeys(t, c, "/try/", 2, 5*time.Second)
	mustUnlock(t, ctx, g)
	if _, err := l.TryLock(ctx, "k"); !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatalf("TryLock behind a waiter after the release: %v", err)
	}
	w, err := waiter.wait()
	if err != nil {
		t.Fatalf("the waiter's Lock: %v", err)
	}
	if _, err := l.TryLock(ctx, "k"); !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatalf("TryLock while the waiter holds: %v", err)
	}
	var le *fairlock.LockError
	_, err = l.TryLock(ctx, "k")
	if !errors.As(err, &le) || le.Op != "TryLock" || le.Key != "k" || !strings.Contains(err.Error(), `"k"`) {
		t.Fatalf("error %v does not name the call and key", err)
	}
	mustUnlock(t, ctx, w)
	g, err = l.TryLock(ctx, "k")
	if err != nil {
		t.Fatalf("TryLock of a free key: %v", err)
	}
	mustUnlock(t, ctx, g)
	waitKeys(t, c, "/try/", 0, 5*time.Second)
}

// TestReentrant: an owner that holds a key gets ErrReentrant at once; a
// different owner waits.
func TestReentrant(t *testing.T) {
	c := startClient(t)
	l := newLocker(t, c, "/re", etcdlock.WithDebug())
	ctx := owner.NewContext(context.Background())
	g := mustLock(t, ctx, l, "k")
	for name, call := range map[string]func() error{
		"Lock":     func() error { _, err := l.Lock(ctx, "k"); return err },
		"TryLock":  func() error { _, err := l.TryLock(ctx, "k"); return err },
		"Wait":     func() error { return l.Wait(ctx, "k") },
		"LockMany": func() error { _, err := keylock.LockMany(ctx, l, "j", "k"); return err },
	} {
		if err := call(); !errors.Is(err, fairlock.ErrReentrant) {
			t.Errorf("%s by the holder: %v, want ErrReentrant", name, err)
		}
	}
	if keys := keysUnder(t, c, "/re/"); len(keys) != 1 {
		t.Errorf("reentrant calls left keys: %q", keys)
	}
	// Another flow waits for the holder.
	other := owner.NewContext(context.Background())
	tctx, cancel := context.WithTimeout(other, 100*time.Millisecond)
	defer cancel()
	if _, err := l.Lock(tctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock by another owner: %v, want a deadline", err)
	}
	mustUnlock(t, ctx, g)
	g2 := mustLock(t, other, l, "k")
	mustUnlock(t, other, g2)
	st := registry.Snapshot("", 0)
	var found bool
	for _, s := range st {
		if s.Kind == "etcdlock.Locker" && s.Reentrant == 4 {
			found = true
		}
	}
	if !found {
		t.Errorf("debug state does not count 4 reentrant calls: %+v", st)
	}
}

// TestStaleUnlock: a second Unlock of a Guard, after the key was granted
// again, does nothing to the new grant.
func TestStaleUnlock(t *testing.T) {
	c := startClient(t)
	l := newLocker(t, c, "/stale")
	ctx := context.Background()
	g1 := mustLock(t, ctx, l, "k")
	mustUnlock(t, ctx, g1)
	g2 := mustLock(t, ctx, l, "k")
	if err := g1.Unlock(ctx); err != nil {
		t.Fatalf("stale Unlock: %v", err)
	}
	resp, err := c.Txn(ctx).If(isOwner(g2)).Commit()
	if err != nil || !resp.Succeeded {
		t.Fatalf("the new grant is gone after a stale Unlock: %v %v", resp, err)
	}
	if resp, _ := c.Txn(ctx).If(isOwner(g1)).Commit(); resp.Succeeded {
		t.Fatal("the old grant's IsOwner holds")
	}
	notLost(t, g2, "the new grant after a stale Unlock")
	mustUnlock(t, ctx, g2)
}

// TestWait: Wait returns at once on a free key, waits for the holder, and
// later calls queue behind it.
func TestWait(t *testing.T) {
	c := startClient(t)
	l := newLocker(t, c, "/wait")
	ctx := context.Background()
	if err := l.Wait(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if keys := keysUnder(t, c, "/wait/"); len(keys) != 0 {
		t.Fatalf("Wait on a free key wrote %q", keys)
	}
	g := mustLock(t, ctx, l, "k")
	waiter := start(owner.NewContext(ctx), func(ctx context.Context) (keylock.Lease, error) { return nil, l.Wait(ctx, "k") })
	waitKeys(t, c, "/wait/", 2, 5*time.Second)
	if _, err := l.TryLock(owner.NewContext(ctx), "k"); !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatalf("TryLock behind a Wait: %v", err)
	}
	if waiter.returned() {
		t.Fatalf("Wait returned %v while the key is held", waiter.err)
	}
	mustUnlock(t, ctx, g)
	if _, err := waiter.wait(); err != nil {
		t.Fatal(err)
	}
	waitKeys(t, c, "/wait/", 0, 5*time.Second)
}

// TestKeyEscaping: "a", "a/b" and keys holding '%' are independent.
func TestKeyEscaping(t *testing.T) {
	c := startClient(t)
	l := newLocker(t, c, "/esc/")
	ctx := context.Background()
	keys := []string{"a", "a/b", "a%2Fb", "a/", "", "%", "/"}
	var gs []keylock.Lease
	for _, k := range keys {
		g, err := l.TryLock(ctx, k)
		if err != nil {
			t.Fatalf("TryLock(%q) beside the others: %v", k, err)
		}
		gs = append(gs, g)
	}
	for _, name := range keysUnder(t, c, "/esc/") {
		k, ok := etcdlock.UnescapeKey("/esc", name)
		if !ok {
			t.Errorf("UnescapeKey(%q) failed", name)
		}
		found := false
		for _, g := range gs {
			found = found || g.Key() == k
		}
		if !found {
			t.Errorf("UnescapeKey(%q) = %q, not a locked key", name, k)
		}
	}
	mustUnlock(t, ctx, gs...)
}

// TestCancelLeavesNoKeys: 100 waiters with random timeouts, some granted,
// most not; when all have returned and the grants are released, nothing
// is left under the prefix. Close leaves nothing either.
func TestCancelLeavesNoKeys(t *testing.T) {
	c := startClient(t)
	l := newLocker(t, c, "/cancel")
	ctx := context.Background()
	g := mustLock(t, ctx, l, "k")
	var wg sync.WaitGroup
	var granted, canceled sync.Map
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tctx, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(300))*time.Millisecond)
			defer cancel()
			w, err := l.Lock(tctx, "k")
			switch {
			case err == nil:
				granted.Store(i, true)
				time.Sleep(time.Millisecond)
				if err := w.Unlock(ctx); err != nil {
					t.Error(err)
				}
			case errors.Is(err, context.DeadlineExceeded):
				canceled.Store(i, true)
			default:
				t.Error(err)
			}
		}()
	}
	time.Sleep(150 * time.Millisecond) // let some time out while the key is held
	mustUnlock(t, ctx, g)
	wg.Wait()
	var ng, nc int
	granted.Range(func(any, any) bool { ng++; return true })
	canceled.Range(func(any, any) bool { nc++; return true })
	t.Logf("%d granted, %d timed out", ng, nc)
	if nc == 0 {
		t.Error("no waiter timed out: the test did not test cancellation")
	}
	waitKeys(t, c, "/cancel/", 0, 10*time.Second)

	// Close with queued waiters: they get ErrClosed, and nothing stays.
	h := mustLock(t, ctx, l, "k")
	waiters := make([]*pending, 10)
	for i := range waiters {
		waiters[i] = startLock(owner.NewContext(ctx), l.Lock, "k")
	}
	waitKeys(t, c, "/cancel/", 11, 5*time.Second)
	closed := make(chan error)
	go func() { closed <- l.Close(ctx) }()
	for _, w := range waiters {
		if _, err := w.wait(); !errors.Is(err, fairlock.ErrClosed) {
			t.Errorf("waiter at Close: %v, want ErrClosed", err)
		}
	}
	waitKeys(t, c, "/cancel/", 1, 5*time.Second) // the holder's
	mustUnlock(t, ctx, h)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if keys := keysUnder(t, c, "/cancel/"); len(keys) != 0 {
		t.Fatalf("keys after Close: %q", keys)
	}
	if _, err := l.Lock(ctx, "k"); !errors.Is(err, fairlock.ErrClosed) {
		t.Fatalf("Lock after Close: %v", err)
	}
}

// TestCloseRevokesHolders: Close whose ctx ends with a grant still held
// revokes the lease: the grant is lost and nothing stays in etcd.
func TestCloseRevokesHolders(t *testing.T) {
	c := startClient(t)
	l, err := etcdlock.New(c, "/close", etcdlock.WithTTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	g := mustLock(t, ctx, l, "k")
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := l.Close(cctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a holder: %v", err)
	}
	<-g.Lost()
	if keys := keysUnder(t, c, "/close/"); len(keys) != 0 {
		t.Fatalf("keys after Close: %q", keys)
	}
	if err := g.Unlock(ctx); !errors.Is(err, etcdlock.ErrLost) {
		t.Fatalf("Unlock after Close: %v, want ErrLost", err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestLostOnDelete: a grant whose key someone else deletes is lost.
func TestLostOnDelete(t *testing.T) {
	c := startClient(t)
	l := newLocker(t, c, "/del")
	ctx := context.Background()
	g := mustLock(t, ctx, l, "k")
	if _, err := c.Delete(ctx, "/del/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	awaitLost(t, g, 5*time.Second, "after the key was deleted")
	if err := g.Unlock(ctx); !errors.Is(err, etcdlock.ErrLost) {
		t.Fatalf("Unlock of a lost grant: %v, want ErrLost", err)
	}
	// A queued call whose key is deleted queues again, at the back.
	g = mustLock(t, ctx, l, "k")
	waiter := startLock(owner.NewContext(ctx), l.Lock, "k")
	waitKeys(t, c, "/del/", 2, 5*time.Second)
	waiterKey := keysUnder(t, c, "/del/")[1]
	if _, err := c.Delete(ctx, waiterKey); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for keys := keysUnder(t, c, "/del/"); len(keys) != 2 || keys[1] == waiterKey; keys = keysUnder(t, c, "/del/") {
		if time.Now().After(deadline) {
			t.Fatalf("the waiter did not queue again: %q", keys)
		}
		time.Sleep(2 * time.Millisecond)
	}
	notLost(t, g, "the holder, once a waiter's key was deleted")
	mustUnlock(t, ctx, g)
	w, err := waiter.wait()
	if err != nil {
		t.Fatalf("the waiter whose key was deleted: %v", err)
	}
	mustUnlock(t, ctx, w)
	waitKeys(t, c, "/del/", 0, 5*time.Second)
}

// TestRevokedLease: a lease revoked under a live holder: Lost closes,
// Unlock returns ErrLost, a write fenced by the grant fails, and the
// Locker goes on with a new lease.
func TestRevokedLease(t *testing.T) {
	c := startClient(t)
	l := newLocker(t, c, "/revoke")
	ctx := context.Background()
	g := mustLock(t, ctx, l, "k")
	resp, err := c.Get(ctx, "/revoke/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("%v %v", resp, err)
	}
	lease := clientv3.LeaseID(resp.Kvs[0].Lease)
	revoked := time.Now()
	if _, err := c.Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	awaitLost(t, g, 5*time.Second, "after the revoke")
	t.Logf("Lost closed %v after the revoke", time.Since(revoked))
	if tr, err := c.Txn(ctx).If(isOwner(g)).Then(clientv3.OpPut("/data", "x")).Commit(); err != nil || tr.Succeeded {
		t.Fatalf("fenced write with a revoked grant: %v %v", tr, err)
	}
	if err := g.Unlock(ctx); !errors.Is(err, etcdlock.ErrLost) {
		t.Fatalf("Unlock of a revoked grant: %v, want ErrLost", err)
	}
	g2 := mustLock(t, ctx, l, "k")
	resp, err = c.Get(ctx, "/revoke/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 || clientv3.LeaseID(resp.Kvs[0].Lease) == lease {
		t.Fatalf("after the revoke: %v %v", resp, err)
	}
	if g2.Token() <= g.Token() {
		t.Fatalf("token %d after %d", g2.Token(), g.Token())
	}
	mustUnlock(t, ctx, g2)
}

// TestLockMany: keylock.LockMany over etcdlock (which has no LockMany of
// its own) locks sorted, all or nothing, across Lockers.
func TestLockMany(t *testing.T) {
	c := startClient(t)
	l := newLocker(t, c, "/many")
	ctx := context.Background()
	m, err := keylock.LockMany(ctx, l, "c", "a", "b", "a")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range m {
		got = append(got, g.Key())
	}
	if diff := cmp.Diff([]string{"a", "b", "c"}, got); diff != "" {
		t.Fatalf("keys (-want +got):\n%s", diff)
	}
	// All or nothing: "c" is held, so a LockMany of b..d by another owner
	// that times out holds nothing afterwards.
	other := owner.NewContext(ctx)
	tctx, cancel := context.WithTimeout(other, 100*time.Millisecond)
	defer cancel()
	if _, err := keylock.LockMany(tctx, l, "d", "c", "b"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LockMany over held keys: %v", err)
	}
	if err := m.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	waitKeys(t, c, "/many/", 0, 5*time.Second)
	// Two flows locking overlapping sets in opposite orders never deadlock.
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keys := []string{"x", "y", "z"}
			if i%2 == 1 {
				keys = []string{"z", "y", "x"}
			}
			for range 5 {
				m, err := keylock.LockMany(owner.NewContext(ctx), l, keys...)
				if err != nil {
					t.Error(err)
					return
				}
				if err := m.Unlock(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	if _, err := keylock.LockMany(ctx, l); err != nil {
		t.Fatalf("LockMany of nothing: %v", err)
	}
}

// TestContextCauseIsNotTheResult: a waiter cancelled with a cause that
// names ErrClosed (another call's result, as errgroup passes it on) is
// reported as canceled, and its error carries the cause.
func TestContextCauseIsNotTheResult(t *testing.T) {
	c := startClient(t)
	obs := &disttest.Observer{}
	l := newLocker(t, c, "/cause", etcdlock.WithObserver(obs))
	ctx := context.Background()
	g := mustLock(t, ctx, l, "k")
	wctx, cancel := context.WithCancelCause(owner.NewContext(ctx))
	waiter := startLock(wctx, l.Lock, "k")
	waitKeys(t, c, "/cause/", 2, 5*time.Second)
	cause := fmt.Errorf("a sibling call failed: %w", fairlock.ErrClosed)
	cancel(cause)
	if _, err := waiter.wait(); !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
		t.Fatalf("the waiter: %v, want context.Canceled with the cause", err)
	}
	mustUnlock(t, ctx, g)
	if canceled, closed := obs.Count(fairlock.Canceled), obs.Count(fairlock.Closed); canceled != 1 || closed != 0 {
		t.Fatalf("observer: %d canceled, %d closed; want 1, 0", canceled, closed)
	}
}

// TestWatchRestart: while the Locker's watch is down, the holder unlocks
// and another grant's key is deleted; the restarted watch's listing
// grants the next waiter, keeps the FIFO order, and loses the grant whose
// key is gone.
func TestWatchRestart(t *testing.T) {
	c := startClient(t)
	l := newLocker(t, c, "/rewatch")
	ctx := context.Background()
	g1 := mustLock(t, ctx, l, "k")
	other := mustLock(t, ctx, l, "other")
	order := make(chan int, 3)
	var wg sync.WaitGroup
	// queue starts waiter i, which sends i on order once granted.
	queue := func(i int) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := l.Lock(owner.NewContext(ctx), "k")
			if err != nil {
				t.Error(err)
				return
			}
			order <- i
			if err := w.Unlock(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	for i := range 2 {
		queue(i)
		waitKeys(t, c, "/rewatch/k/", i+2, 5*time.Second)
	}
	resume := testhook.PauseWatch(l)
	mustUnlock(t, ctx, g1)
	if _, err := c.Delete(ctx, "/rewatch/other/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	// A call that queues while the watch is down subscribes once it is
	// back, reading its queue again.
	queue(2)
	waitKeys(t, c, "/rewatch/k/", 3, 5*time.Second)
	select {
	case i := <-order:
		t.Fatalf("waiter %d granted while the watch was down", i)
	case <-other.Lost():
		t.Fatal("Lost closed while the watch was down")
	case <-time.After(100 * time.Millisecond):
	}
	resume()
	awaitLost(t, other, 5*time.Second, "after the watch restarted, its key deleted during the outage")
	wg.Wait()
	if a, b, c := <-order, <-order, <-order; a != 0 || b != 1 || c != 2 {
		t.Fatalf("granted %d, %d, %d after the watch restarted", a, b, c)
	}
	if err := other.Unlock(ctx); !errors.Is(err, etcdlock.ErrLost) {
		t.Fatalf("Unlock of the lost grant: %v", err)
	}
	waitKeys(t, c, "/rewatch/", 0, 5*time.Second)
}
