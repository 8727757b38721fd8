package etcdlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	"github.com/fairlock/fairlock/owner"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// newSemaphore returns a Semaphore of n units on client under prefix,
// closed by t.Cleanup.
func newSemaphore(t testing.TB, client *clientv3.Client, prefix string, n int64, opts ...etcdlock.Option) *etcdlock.Semaphore {
	t.Helper()
	s, err := etcdlock.NewSemaphore(client, prefix, n, append([]etcdlock.Option{etcdlock.WithTTL(testTTL)}, opts...)...)
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
}

// queued polls until n keys are in key's range under prefix, failing if
// any of ps returns meanwhile: each must still be queued.
func queued(t *testing.T, c *clientv3.Client, prefix, key string, n int, ps ...*pending) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, p := range ps {
			if p.returned() {
				t.Fatalf("a call returned (%v, %v) while it should have stayed queued", p.lease, p.err)
			}
		}
		if got := len(keysUnder(t, c, rangeUnder(prefix, key))); got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys for %q never appeared under %q", n, key, prefix)
		}
		time.Sleep(2 * time.Millisecond) // a poll: the count decides
	}
}

// TestSemaphoreSizeMismatch: a Semaphore whose size differs from that of
// the calls already on a key fails with an error that wraps
// ErrInvalidWeight and names both sizes, leaves no key behind, and never
// shares the key's units.
func TestSemaphoreSizeMismatch(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	three := newSemaphore(t, srv.Client(t), "/mixed", 3)
	five := newSemaphore(t, srv.Client(t), "/mixed", 5)
	ctx := context.Background()
	held := mustAcquire(t, owner.NewContext(ctx), three, "k", 1)
	check := func(what string, l keylock.Lease, err error) {
		t.Helper()
		var le *fairlock.LockError
		if l != nil || !errors.As(err, &le) || le.Key != any("k") || !errors.Is(err, fairlock.ErrInvalidWeight) {
			t.Fatalf("%s beside a 3-unit Semaphore's call: (%v, %v), want a nil Lease and a *fairlock.LockError on k wrapping ErrInvalidWeight", what, l, err)
		}
		if msg := err.Error(); !strings.Contains(msg, "has 5 units") || !strings.Contains(msg, "one of 3") {
			t.Fatalf("%s: %q does not name both sizes", what, msg)
		}
		if keys := keysUnder(t, admin, "/mixed/"); len(keys) != 1 {
			t.Fatalf("%s left keys behind: %q", what, keys)
		}
	}
	l, err := five.Acquire(ctx, "k", 1)
	check("Acquire(1) of a 5-unit Semaphore", l, err)
	l, err = five.TryAcquire(ctx, "k", 1)
	check("TryAcquire(1) of a 5-unit Semaphore", l, err)
	// Also when the 3-unit Semaphore's units are all taken and a call of
	// its own is queued: the 5-unit call does not queue behind them.
	rest := mustAcquire(t, owner.NewContext(ctx), three, "k", 2)
	q := startAcquire(owner.NewContext(ctx), three, "k", 3)
	queued(t, admin, "/mixed", "k", 3, q)
	l, err = five.Acquire(ctx, "k", 5)
	var le *fairlock.LockError
	if l != nil || !errors.As(err, &le) || !errors.Is(err, fairlock.ErrInvalidWeight) || !strings.Contains(err.Error(), "has 5 units") {
		t.Fatalf("Acquire(5) of a 5-unit Semaphore behind 3-unit calls: (%v, %v)", l, err)
	}
	queued(t, admin, "/mixed", "k", 3, q)
	mustUnlock(t, ctx, held, rest)
	mustUnlock(t, ctx, q.granted(t, "the queued Acquire(3)"))
	waitKeys(t, admin, "/mixed/", 0, 5*time.Second)
	// On a free key the 5-unit Semaphore is first, and the 3-unit one fails.
	first := mustAcquire(t, ctx, five, "k", 4)
	if l, err := three.Acquire(ctx, "k", 1); l != nil || !errors.Is(err, fairlock.ErrInvalidWeight) || !strings.Contains(err.Error(), "has 3 units") || !strings.Contains(err.Error(), "one of 5") {
		t.Fatalf("Acquire(1) of a 3-unit Semaphore beside a 5-unit call: (%v, %v)", l, err)
	}
	mustUnlock(t, ctx, first)
	waitKeys(t, admin, "/mixed/", 0, 5*time.Second)
}

// TestReadersShareAcrossClients: readers through Lockers on different
// clients hold a key together; a writer waits for all of them, and
// readers that come after a queued writer wait for it.
func TestReadersShareAcrossClients(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	var ls []*etcdlock.Locker
	for range 4 {
		ls = append(ls, newLocker(t, srv.Client(t), "/rw"))
	}
	ctx := context.Background()
	var readers []keylock.Lease
	for i, l := range ls[:3] {
		r, err := l.RLock(ctx, "k")
		if err != nil {
			t.Fatalf("RLock through Locker %d beside %d readers: %v", i, i, err)
		}
		readers = append(readers, r)
	}
	if r, err := ls[3].TryRLock(ctx, "k"); err != nil {
		t.Fatalf("TryRLock beside readers: %v", err)
	} else {
		readers = append(readers, r)
	}
	if l, err := ls[3].TryLock(owner.NewContext(ctx), "k"); l != nil || !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatalf("TryLock beside readers: (%v, %v), want ErrWouldBlock", l, err)
	}
	w := startLock(owner.NewContext(ctx), ls[0].Lock, "k")
	queued(t, admin, "/rw", "k", 5, w)
	// The reader behind the queued writer waits, and TryRLock refuses.
	r := startLock(owner.NewContext(ctx), ls[1].RLock, "k")
	queued(t, admin, "/rw", "k", 6, w, r)
	if l, err := ls[2].TryRLock(owner.NewContext(ctx), "k"); l != nil || !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatalf("TryRLock behind a queued writer: (%v, %v), want ErrWouldBlock", l, err)
	}
	for i, g := range readers {
		if w.returned() {
			t.Fatalf("the writer was granted with %d of 4 readers still holding", 4-i)
		}
		mustUnlock(t, ctx, g)
	}
	wg := w.granted(t, "the writer")
	queued(t, admin, "/rw", "k", 2, r)
	mustUnlock(t, ctx, wg)
	lr := r.granted(t, "the reader behind the writer")
	if lr.Token() <= wg.Token() {
		t.Fatalf("reader's token %d not above the writer's %d", lr.Token(), wg.Token())
	}
	mustUnlock(t, ctx, lr)
	waitKeys(t, admin, "/rw/", 0, 5*time.Second)
}

// TestSemaphoreHeadOfLine: a request that would fit waits behind a larger
// one at the head of the queue, across Semaphores on different clients,
// and both are granted when the units are given back.
func TestSemaphoreHeadOfLine(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	var ss []*etcdlock.Semaphore
	for range 3 {
		ss = append(ss, newSemaphore(t, srv.Client(t), "/hol", 4))
	}
	ctx := context.Background()
	a := mustAcquire(t, ctx, ss[0], "k", 3)
	b := startAcquire(owner.NewContext(ctx), ss[1], "k", 2)
	queued(t, admin, "/hol", "k", 2, b)
	c := startAcquire(owner.NewContext(ctx), ss[2], "k", 1)
	queued(t, admin, "/hol", "k", 3, b, c) // 1 unit is free, but 2 are asked first
	if l, err := ss[0].TryAcquire(owner.NewContext(ctx), "k", 1); l != nil || !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatalf("TryAcquire(1) with a unit free behind a queued request: (%v, %v), want ErrWouldBlock", l, err)
	}
	mustUnlock(t, ctx, a)
	lb := b.granted(t, "Acquire(2)")
	lc := c.granted(t, "Acquire(1) behind it") // 2+1 fit in 4: together
	// 3 of 4 units held: one more fits, two do not.
	d, err := ss[0].TryAcquire(owner.NewContext(ctx), "k", 1)
	if err != nil {
		t.Fatalf("TryAcquire(1) with one unit free: %v", err)
	}
	if l, err := ss[0].TryAcquire(owner.NewContext(ctx), "k", 1); l != nil || !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatalf("TryAcquire(1) with every unit held: (%v, %v)", l, err)
	}
	mustUnlock(t, ctx, lb, lc, d)
	for _, w := range []int64{0, 5} {
		if l, err := ss[0].Acquire(ctx, "k", w); l != nil || !errors.Is(err, fairlock.ErrInvalidWeight) || !strings.Contains(err.Error(), "of 4 units") {
			t.Fatalf("Acquire(%d) of a 4-unit Semaphore: (%v, %v)", w, l, err)
		}
	}
	waitKeys(t, admin, "/hol/", 0, 5*time.Second)
}

// TestModesTokensAndLoss: grants in every mode have tokens that are their
// keys' creation revisions, growing across modes; their IsOwner holds
// while they are current; deleting a reader's or a semaphore holder's key
// closes its Lost and its Unlock returns ErrLost; debug shows each mode.
func TestModesTokensAndLoss(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	lobs, sobs := &disttest.Observer{}, &disttest.Observer{}
	l := newLocker(t, srv.Client(t), "/modes", etcdlock.WithDebug(), etcdlock.WithName("modes-locker"), etcdlock.WithObserver(lobs))
	s := newSemaphore(t, srv.Client(t), "/modes-sem", 2, etcdlock.WithDebug(), etcdlock.WithName("modes-sem"), etcdlock.WithObserver(sobs))
	ctx := context.Background()
	var last uint64
	next := func(what string, g keylock.Lease, err error) keylock.Lease {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if _, ok := g.(*etcdlock.Guard); !ok {
			t.Fatalf("%s returned a %T, want a *etcdlock.Guard", what, g)
		}
		if g.Token() <= last {
			t.Fatalf("%s: token %d, not above the last grant's %d", what, g.Token(), last)
		}
		last = g.Token()
		resp, err := admin.Txn(ctx).If(isOwner(g)).Commit()
		if err != nil || !resp.Succeeded {
			t.Fatalf("%s: IsOwner of a current grant does not hold (%v)", what, err)
		}
		return g
	}
	g, err := l.Lock(ctx, "k")
	mustUnlock(t, ctx, next("Lock", g, err))
	g, err = l.TryLock(ctx, "k")
	mustUnlock(t, ctx, next("TryLock", g, err))
	r1, err := l.RLock(owner.NewContext(ctx), "k")
	r1 = next("RLock", r1, err)
	r2, err := l.TryRLock(owner.NewContext(ctx), "k")
	r2 = next("TryRLock", r2, err)
	u1, err := s.Acquire(owner.NewContext(ctx), "k", 1)
	u1 = next("Acquire(1)", u1, err)
	u2, err := s.TryAcquire(owner.NewContext(ctx), "k", 1)
	u2 = next("TryAcquire(1)", u2, err)

	modes := func(name string) (string, int64, int) {
		st := registry.Snapshot(name, 0)
		if len(st) != 1 || len(st[0].Held) != 1 {
			t.Fatalf("debug snapshot of %s: %+v", name, st)
		}
		k := st[0].Held[0]
		return k.Mode, k.Units, len(k.Holders)
	}
	if mode, _, n := modes("modes-locker"); mode != registry.Shared || n != 2 {
		t.Errorf("debug shows the readers' key as %q with %d holders, want %q with 2", mode, n, registry.Shared)
	}
	if mode, units, n := modes("modes-sem"); mode != registry.Units || units != 2 || n != 2 {
		t.Errorf("debug shows the semaphore's key as %q, %d units, %d holders; want %q, 2, 2", mode, units, n, registry.Units)
	}
	if st := registry.Snapshot("modes-sem", 0); st[0].Kind != "etcdlock.Semaphore" || st[0].Units != 2 {
		t.Errorf("debug shows the Semaphore as kind %q of %d units", st[0].Kind, st[0].Units)
	}

	// A reader's and a semaphore holder's grants are lost like a Lock's.
	for _, g := range []keylock.Lease{r1, u1} {
		prefix := "/modes"
		if g == u1 {
			prefix = "/modes-sem"
		}
		deleteGrant(t, admin, rangeUnder(prefix, "k"), g)
		awaitLost(t, g, 10*time.Second, "after the grant's key was deleted")
		if err := g.Unlock(ctx); !errors.Is(err, fairlock.ErrLost) {
			t.Fatalf("Unlock of a lost grant: %v, want ErrLost", err)
		}
	}
	mustUnlock(t, ctx, r2, u2)
	waitKeys(t, admin, "/modes", 0, 5*time.Second)
	// The observer hears every mode: each grant and each release, the
	// lost ones' included.
	for _, o := range []struct {
		name     string
		obs      *disttest.Observer
		acquired int
	}{{"Locker", lobs, 4}, {"Semaphore", sobs, 2}} {
		acq := o.obs.Count(fairlock.Acquired)
		if rel, _ := o.obs.Released(); acq != o.acquired || rel != o.acquired {
			t.Errorf("the %s's observer heard %d grants and %d releases, want %d of each", o.name, acq, rel, o.acquired)
		}
	}
}

// TestReentrantInEveryMode: an owner that holds a key in any mode gets
// ErrReentrant from every call on it through the same Locker or
// Semaphore, at once and with nothing written.
func TestReentrantInEveryMode(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	l := newLocker(t, srv.Client(t), "/re-modes")
	s := newSemaphore(t, srv.Client(t), "/re-modes-sem", 3)
	ctx := owner.NewContext(context.Background())
	calls := map[string]func() (keylock.Lease, error){
		"Lock":     func() (keylock.Lease, error) { return l.Lock(ctx, "k") },
		"TryLock":  func() (keylock.Lease, error) { return l.TryLock(ctx, "k") },
		"RLock":    func() (keylock.Lease, error) { return l.RLock(ctx, "k") },
		"TryRLock": func() (keylock.Lease, error) { return l.TryRLock(ctx, "k") },
		"Wait":     func() (keylock.Lease, error) { return nil, l.Wait(ctx, "k") },
	}
	for _, hold := range []string{"Lock", "RLock"} {
		g, err := calls[hold]()
		if err != nil {
			t.Fatal(err)
		}
		for name, call := range calls {
			if l, err := call(); l != nil || !errors.Is(err, fairlock.ErrReentrant) {
				t.Errorf("%s by an owner that holds the key through %s: (%v, %v), want ErrReentrant", name, hold, l, err)
			}
		}
		if keys := keysUnder(t, admin, "/re-modes/"); len(keys) != 1 {
			t.Errorf("reentrant calls left keys: %q", keys)
		}
		mustUnlock(t, ctx, g)
	}
	u := mustAcquire(t, ctx, s, "k", 1)
	if l, err := s.Acquire(ctx, "k", 1); l != nil || !errors.Is(err, fairlock.ErrReentrant) {
		t.Errorf("Acquire by an owner that holds units: (%v, %v), want ErrReentrant", l, err)
	}
	if l, err := s.TryAcquire(ctx, "k", 1); l != nil || !errors.Is(err, fairlock.ErrReentrant) {
		t.Errorf("TryAcquire by an owner that holds units: (%v, %v), want ErrReentrant", l, err)
	}
	mustUnlock(t, ctx, u)
}
