package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"github.com/fairlock/fairlock/etcdlock/internal/testhook"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// TestSemaphoreSizeOwnerKeepsKey: a call of the size that reached the key
// first is not refused because of a call of another size that queued
// behind it and is about to leave (it saw the first size ahead, so it
// fails and deletes its key). Such a key is written here by hand, in the
// layout a 5-unit Semaphore writes (keys.go), standing for that call in
// the instant between its enqueueing transaction and its deletion. The
// 3-unit Acquire behind it waits for it to go, and is then granted; a
// 3-unit TryAcquire meanwhile would block; a 5-unit call is still
// refused, naming the key's size, 3.
func TestSemaphoreSizeOwnerKeepsKey(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	three := newSemaphore(t, srv.Client(t), "/owner", 3)
	five := newSemaphore(t, srv.Client(t), "/owner", 5)
	ctx := context.Background()
	held := mustAcquire(t, owner.NewContext(ctx), three, "k", 1)
	leaving := rangeUnder("/owner", "k") + "7-1-u1.5"
	if _, err := admin.Put(ctx, leaving, "a 5-unit call on its way out"); err != nil {
		t.Fatal(err)
	}
	if l, err := three.TryAcquire(owner.NewContext(ctx), "k", 1); l != nil || !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatalf("3-unit TryAcquire(1) behind a 5-unit call that queued behind a 3-unit holder: (%v, %v), want ErrWouldBlock", l, err)
	}
	q := startAcquire(owner.NewContext(ctx), three, "k", 1)
	queued(t, admin, "/owner", "k", 3, q)
	if l, err := five.Acquire(ctx, "k", 1); l != nil || !errors.Is(err, fairlock.ErrInvalidWeight) || !strings.Contains(err.Error(), "one of 3") {
		t.Fatalf("5-unit Acquire(1) on a key a 3-unit call reached first: (%v, %v), want ErrInvalidWeight naming 3", l, err)
	}
	if _, err := admin.Delete(ctx, leaving); err != nil {
		t.Fatal(err)
	}
	g := q.granted(t, "the 3-unit Acquire(1) once the 5-unit call left")
	mustUnlock(t, ctx, held, g)
	waitKeys(t, admin, "/owner/", 0, 5*time.Second)
}

// TestWatchRestartModes: while the watch is down, the writer that holds a
// key unlocks; the listing the restarted watch rebuilds from grants the
// two readers queued behind it together, and not the reader behind the
// writer queued after them. On a Semaphore, the units given back while
// the watch was down grant the head-of-line calls that now fit, and not
// the one behind that does not.
func TestWatchRestartModes(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	l := newLocker(t, srv.Client(t), "/rw-restart")
	s := newSemaphore(t, srv.Client(t), "/sem-restart", 4)
	ctx := context.Background()

	w1 := mustLock(t, owner.NewContext(ctx), l, "k")
	r1 := startLock(owner.NewContext(ctx), l.RLock, "k")
	queued(t, admin, "/rw-restart", "k", 2, r1)
	r2 := startLock(owner.NewContext(ctx), l.RLock, "k")
	queued(t, admin, "/rw-restart", "k", 3, r1, r2)
	w2 := startLock(owner.NewContext(ctx), l.Lock, "k")
	queued(t, admin, "/rw-restart", "k", 4, r1, r2, w2)
	r3 := startLock(owner.NewContext(ctx), l.RLock, "k")
	queued(t, admin, "/rw-restart", "k", 5, r1, r2, w2, r3)

	a := mustAcquire(t, owner.NewContext(ctx), s, "k", 3)
	b := startAcquire(owner.NewContext(ctx), s, "k", 2)
	queued(t, admin, "/sem-restart", "k", 2, b)
	c := startAcquire(owner.NewContext(ctx), s, "k", 2)
	queued(t, admin, "/sem-restart", "k", 3, b, c)
	d := startAcquire(owner.NewContext(ctx), s, "k", 1)
	queued(t, admin, "/sem-restart", "k", 4, b, c, d)

	resumeL := testhook.PauseWatch(l)
	resumeS := testhook.PauseWatch(s)
	mustUnlock(t, ctx, w1, a)
	resumeL()
	resumeS()
	g1 := r1.granted(t, "the first reader after the watch restarted")
	g2 := r2.granted(t, "the second reader after the watch restarted")
	gb := b.granted(t, "Acquire(2) after the watch restarted")
	gc := c.granted(t, "Acquire(2) behind it")
	// Still queued: the writer behind the readers, the reader behind it,
	// and 1 unit behind 4 of 4 held.
	queued(t, admin, "/rw-restart", "k", 4, w2, r3)
	queued(t, admin, "/sem-restart", "k", 3, d)
	mustUnlock(t, ctx, g1, g2)
	gw := w2.granted(t, "the writer behind the readers")
	queued(t, admin, "/rw-restart", "k", 2, r3)
	mustUnlock(t, ctx, gw)
	mustUnlock(t, ctx, r3.granted(t, "the reader behind the writer"))
	mustUnlock(t, ctx, gb)
	mustUnlock(t, ctx, d.granted(t, "Acquire(1) once 2 units came back"))
	mustUnlock(t, ctx, gc)
	waitKeys(t, admin, "/rw-restart/", 0, 5*time.Second)
	waitKeys(t, admin, "/sem-restart/", 0, 5*time.Second)
}

// TestModesExclusionAcrossLockers: Lockers on clients of their own (as
// many processes would) take the same keys in every mode at once, in
// queues longer than the eight keys ahead a Lock reads, while the watch
// of one of them is ended and restarted again and again; at no instant
// are two writers, or a writer and a reader, inside one key. Semaphores
// likewise never have more than n units of a key held.
func TestModesExclusionAcrossLockers(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	const (
		lockers = 3
		workers = 6 // per Locker: 18 calls, most queued behind each other
		rounds  = 12
		units   = 5
	)
	var ls []*etcdlock.Locker
	var ss []*etcdlock.Semaphore
	for range lockers {
		ls = append(ls, newLocker(t, srv.Client(t), "/stress"))
		ss = append(ss, newSemaphore(t, srv.Client(t), "/stress-sem", units))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// Per key: writers and readers inside; units held.
	var mu sync.Mutex
	writers := map[string]int{}
	readers := map[string]int{}
	held := map[string]int64{}
	var bad atomic.Value
	fail := func(format string, args ...any) { bad.CompareAndSwap(nil, fmt.Sprintf(format, args...)) }
	enter := func(key, mode string, w int64) {
		mu.Lock()
		defer mu.Unlock()
		switch mode {
		case "w":
			if writers[key] > 0 || readers[key] > 0 {
				fail("a writer granted %q beside %d writers and %d readers", key, writers[key], readers[key])
			}
			writers[key]++
		case "r":
			if writers[key] > 0 {
				fail("a reader granted %q beside a writer", key)
			}
			readers[key]++
		case "u":
			held[key] += w
			if held[key] > units {
				fail("%d of %d units of %q held", held[key], units, key)
			}
		}
	}
	leave := func(key, mode string, w int64) {
		mu.Lock()
		defer mu.Unlock()
		switch mode {
		case "w":
			writers[key]--
		case "r":
			readers[key]--
		case "u":
			held[key] -= w
		}
	}

	var wg sync.WaitGroup
	stop := make(chan struct{})
	restarts := make(chan struct{})
	go func() {
		// Restart the first Locker's and Semaphore's watches while the
		// others work: their waiters are then served from the listing.
		defer close(restarts)
		for {
			select {
			case <-stop:
				return
			default:
			}
			resumeL := testhook.PauseWatch(ls[0])
			resumeS := testhook.PauseWatch(ss[0])
			runtime.Gosched()
			resumeL()
			resumeS()
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond): // spacing between restarts, not ordering
			}
		}
	}()
	for i := range lockers * workers {
		l, s := ls[i%lockers], ss[i%lockers]
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for range rounds {
				key := []string{"a", "b"}[rng.IntN(2)]
				octx := owner.NewContext(ctx)
				var g keylock.Lease
				var err error
				mode, w := "", int64(0)
				switch op := rng.IntN(8); op {
				case 0:
					mode = "w"
					g, err = l.Lock(octx, key)
				case 1:
					mode = "w"
					g, err = l.TryLock(octx, key)
				case 2, 3:
					mode = "r"
					g, err = l.RLock(octx, key)
				case 4:
					mode = "r"
					g, err = l.TryRLock(octx, key)
				case 5:
					// Queued like a writer; its instant of holding
					// is over (its key deleted) when it returns.
					err = l.Wait(octx, key)
				case 6:
					mode, w = "u", rng.Int64N(units)+1
					g, err = s.Acquire(octx, key, w)
				case 7:
					mode, w = "u", rng.Int64N(units)+1
					g, err = s.TryAcquire(octx, key, w)
				}
				if errors.Is(err, fairlock.ErrWouldBlock) {
					continue
				}
				if err != nil {
					fail("%s on %q: %v", mode, key, err)
					return
				}
				if g == nil {
					continue
				}
				enter(key, mode, w)
				runtime.Gosched()
				leave(key, mode, w)
				if err := g.Unlock(ctx); err != nil {
					fail("Unlock: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-restarts
	if msg := bad.Load(); msg != nil {
		t.Fatal(msg)
	}
	waitKeys(t, admin, "/stress/", 0, 5*time.Second)
	waitKeys(t, admin, "/stress-sem/", 0, 5*time.Second)
}

// TestSemaphoreHugeWeights: with units near the int64 limit, the units of
// the calls ahead are summed without overflowing: a call behind a holder
// and a queued call, each of more than half the units, waits (Acquire)
// or would block (TryAcquire) rather than be granted beside the holder,
// beyond the Semaphore's size.
func TestSemaphoreHugeWeights(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	s := newSemaphore(t, srv.Client(t), "/huge", math.MaxInt64)
	ctx := context.Background()
	const half = 1 << 62 // two are more than MaxInt64 units
	a := mustAcquire(t, owner.NewContext(ctx), s, "k", half)
	b := startAcquire(owner.NewContext(ctx), s, "k", half)
	queued(t, admin, "/huge", "k", 2, b)
	if l, err := s.TryAcquire(owner.NewContext(ctx), "k", half); l != nil || !errors.Is(err, fairlock.ErrWouldBlock) {
		if l != nil {
			l.Unlock(ctx)
		}
		t.Fatalf("TryAcquire(2^62) behind 2^62 units held and 2^62 queued, of MaxInt64: (%v, %v), want ErrWouldBlock", l, err)
	}
	c := startAcquire(owner.NewContext(ctx), s, "k", half)
	queued(t, admin, "/huge", "k", 3, b, c)
	// c is judged from the same keys ahead as b, before a's release:
	// c must still be queued after b's grant.
	mustUnlock(t, ctx, a)
	gb := b.granted(t, "the first queued Acquire(2^62)")
	queued(t, admin, "/huge", "k", 2, c)
	mustUnlock(t, ctx, gb)
	mustUnlock(t, ctx, c.granted(t, "the second queued Acquire(2^62)"))
	waitKeys(t, admin, "/huge/", 0, 5*time.Second)
}

// betweenTries is a gRPC interceptor that runs join once, after the
// first transaction of a TryRLock or TryAcquire that found calls on the
// key (its Else reads the range) has been answered and before the call
// sees the answer: a call that joins the key between its two
// transactions.
type betweenTries struct {
	once sync.Once
	join func()
}

func (b *betweenTries) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoke(ctx, method, req, reply, cc, opts...)
	if tr, ok := req.(*etcdserverpb.TxnRequest); ok && err == nil && len(tr.Failure) == 1 && tr.Failure[0].GetRequestRange() != nil {
		if resp, ok := reply.(*etcdserverpb.TxnResponse); ok && !resp.Succeeded {
			b.once.Do(b.join)
		}
	}
	return err
}

// TestTryNeverOvertakesAJoiner: a writer that queues between the two
// transactions of a TryRLock beside a reader makes it fail with
// ErrWouldBlock, writing nothing, and the writer is granted next; a
// Semaphore call that joins between TryAcquire's two transactions and
// takes the last units makes it fail likewise.
func TestTryNeverOvertakesAJoiner(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	ctx := context.Background()
	hook := &betweenTries{}
	tried := interceptedClient(t, srv, hook.intercept) // closed after the Lockers on it

	l := newLocker(t, tried, "/joiner")
	other := newLocker(t, srv.Client(t), "/joiner")
	r, err := other.RLock(owner.NewContext(ctx), "k")
	if err != nil {
		t.Fatal(err)
	}
	var w *pending
	hook.join = func() {
		w = startLock(owner.NewContext(ctx), other.Lock, "k")
		queued(t, admin, "/joiner", "k", 2, w)
	}
	if g, err := l.TryRLock(owner.NewContext(ctx), "k"); g != nil || !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatalf("TryRLock beside a reader, a writer queued between its transactions: (%v, %v), want ErrWouldBlock", g, err)
	}
	if w == nil {
		t.Fatal("the writer did not join between TryRLock's transactions")
	}
	queued(t, admin, "/joiner", "k", 2, w)
	mustUnlock(t, ctx, r)
	mustUnlock(t, ctx, w.granted(t, "the writer that joined"))
	waitKeys(t, admin, "/joiner/", 0, 5*time.Second)

	hook.once = sync.Once{}
	s := newSemaphore(t, tried, "/joiner-sem", 3)
	s2 := newSemaphore(t, srv.Client(t), "/joiner-sem", 3)
	u := mustAcquire(t, owner.NewContext(ctx), s2, "k", 1)
	var j keylock.Lease
	hook.join = func() {
		var err error
		if j, err = s2.Acquire(owner.NewContext(ctx), "k", 2); err != nil {
			t.Error(err)
		}
	}
	if g, err := s.TryAcquire(owner.NewContext(ctx), "k", 1); g != nil || !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatalf("TryAcquire(1) of 3 beside 1 held, 2 taken between its transactions: (%v, %v), want ErrWouldBlock", g, err)
	}
	if j == nil {
		t.Fatal("no Acquire joined between TryAcquire's transactions")
	}
	mustUnlock(t, ctx, u, j)
	waitKeys(t, admin, "/joiner-sem/", 0, 5*time.Second)
}
