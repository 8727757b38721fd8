package etcdlock_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"github.com/fairlock/fairlock/etcdlock/internal/testhook"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// TestLockBehindWaitsGrantedBeforeTheirKeysGo: with every deletion of a
// Wait's key held back (a gRPC interceptor on the client of the Locker
// the Waits come through), the holder's release still grants the Lock
// queued behind more Waits than it reads when it queues (manyWaits), on
// another client: a Wait whose turn has come is transparent to the calls
// behind it, so they are granted at the release, not one deletion after
// another. Every Wait's key is still there when the Lock is granted, and
// every Wait has returned.
func TestLockBehindWaitsGrantedBeforeTheirKeysGo(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	holdWaitDeletes, releaseDeletes := waitDeletesHeld()
	defer releaseDeletes() // before the Lockers' Close, in t.Cleanup
	const prefix, key, n = "/waits", "hot", manyWaits
	waiters := newLocker(t, interceptedClient(t, srv, holdWaitDeletes), prefix)
	holder, behind := newLocker(t, srv.Client(t), prefix), newLocker(t, srv.Client(t), prefix)
	ctx := context.Background()
	h := mustLock(t, ctx, holder, key)
	waits := make(chan error, n)
	for i := range n {
		go func() { waits <- waiters.Wait(ctx, key) }()
		waitKeys(t, admin, prefix+"/", i+2, 10*time.Second)
	}
	lock := startLock(ctx, behind.Lock, key)
	waitKeys(t, admin, prefix+"/", n+2, 10*time.Second)
	mustUnlock(t, ctx, h)
	g, err := lock.within(t, 10*time.Second, "the Lock behind the Waits, their keys' deletions held back")
	if err != nil {
		t.Fatalf("the Lock behind the Waits: %v", err)
	}
	keys := keysUnder(t, admin, prefix+"/")
	if len(keys) != n+1 {
		t.Fatalf("keys when the Lock behind the Waits was granted: %q, want the %d Waits' and the Lock's", keys, n)
	}
	for _, k := range keys[:n] {
		if !strings.HasSuffix(k, "-w") {
			t.Fatalf("keys when the Lock behind the Waits was granted: %q, want the %d Waits' first", keys, n)
		}
	}
	for range n {
		select {
		case err := <-waits:
			if err != nil {
				t.Fatalf("Wait: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a Wait did not return at the release, its key's deletion held back")
		}
	}
	releaseDeletes()
	mustUnlock(t, ctx, g)
	waitKeys(t, admin, prefix+"/", 0, 10*time.Second)
}

// waitDeletesHeld returns a gRPC client interceptor that holds back every
// transaction deleting a Wait's key until release is called (or the
// request's context ends).
func waitDeletesHeld() (hold grpc.UnaryClientInterceptor, release func()) {
	released := make(chan struct{})
	var once sync.Once
	hold = func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if tr, ok := req.(*etcdserverpb.TxnRequest); ok {
			for _, op := range append(tr.Success, tr.Failure...) {
				if d := op.GetRequestDeleteRange(); d != nil && strings.HasSuffix(string(d.Key), "-w") {
					select {
					case <-released:
					case <-ctx.Done():
						return ctx.Err()
					}
					break
				}
			}
		}
		return invoke(ctx, method, req, reply, cc, opts...)
	}
	return hold, func() { once.Do(func() { close(released) }) }
}

// manyWaits is more Waits than the keys ahead an exclusive call reads
// when it queues (aheadLimit), so that the keys it reads are all Waits'.
const manyWaits = 12

// TestTryFormsAroundWaits: a Try form is granted only where its call,
// queued, would be granted at once. While a holder holds the key, with
// more Waits queued behind it than an exclusive call reads when it
// queues, TryLock fails with ErrWouldBlock. Once the holder is gone, with
// only the Waits' keys left in the range (their turn has come; their
// deletions held back), Locked reports the key free, TryLock and
// TryRLock are granted, and so is a Lock, at once: a Wait whose turn has
// come is transparent to every call, however many such keys are ahead.
func TestTryFormsAroundWaits(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	holdWaitDeletes, releaseDeletes := waitDeletesHeld()
	defer releaseDeletes()
	ctx := context.Background()
	const prefix, key = "/try-lock", "k"
	rng := rangeUnder(prefix, key)
	waiters := newLocker(t, interceptedClient(t, srv, holdWaitDeletes), prefix)
	holder, other := newLocker(t, srv.Client(t), prefix), newLocker(t, srv.Client(t), prefix)
	h := mustLock(t, ctx, holder, key)
	ws := queueWaits(t, ctx, admin, waiters, rng, key, 1, manyWaits)
	if g, err := other.TryLock(ctx, key); !errors.Is(err, fairlock.ErrWouldBlock) {
		mustUnlock(t, ctx, g)
		t.Fatalf("TryLock while held: (%v, %v), want ErrWouldBlock", g, err)
	}
	mustUnlock(t, ctx, h)
	waitsReturned(t, "a Wait behind the released holder", ws...)
	if keys := keysUnder(t, admin, rng); len(keys) != manyWaits {
		t.Fatalf("keys after the Waits returned, their deletions held back: %q, want the %d Waits'", keys, manyWaits)
	}
	if locked, err := other.Locked(ctx, key); err != nil || locked {
		t.Fatalf("Locked with only Waits whose turn came on the key: (%v, %v), want false", locked, err)
	}
	g, err := other.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock with only Waits whose turn came on the key: %v", err)
	}
	if locked, err := other.Locked(ctx, key); err != nil || !locked {
		t.Fatalf("Locked while held: (%v, %v), want true", locked, err)
	}
	mustUnlock(t, ctx, g)
	r, err := other.TryRLock(ctx, key)
	if err != nil {
		t.Fatalf("TryRLock with only Waits whose turn came on the key: %v", err)
	}
	mustUnlock(t, ctx, r)
	mustUnlock(t, ctx, startLock(ctx, other.Lock, key).granted(t, "Lock with only Waits whose turn came on the key"))
}

// TestLockBehindManyWaitsSettles: a Lock queued behind a holder and more
// Waits than it reads when it queues (all it reads weigh nothing for it)
// reads on until it finds the holder, subscribes to it, and then waits
// for the watch, with no more requests: it settles (testhook.Unsettled)
// while the holder holds the key. Judged on the nearest keys alone, it
// would read them again and again for as long as the holder held. At the
// release it is granted.
func TestLockBehindManyWaitsSettles(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	const prefix, key = "/settles", "k"
	rng := rangeUnder(prefix, key)
	holder, waiters, other := newLocker(t, srv.Client(t), prefix), newLocker(t, srv.Client(t), prefix), newLocker(t, srv.Client(t), prefix)
	ctx := context.Background()
	h := mustLock(t, ctx, holder, key)
	ws := queueWaits(t, ctx, admin, waiters, rng, key, 1, manyWaits)
	lock := startLock(ctx, other.Lock, key)
	waitKeysQueued(t, admin, rng, manyWaits+2, append(ws, lock)...)
	deadline := time.Now().Add(10 * time.Second)
	for testhook.Unsettled(other, key) > 0 {
		if lock.returned() {
			t.Fatalf("the Lock behind the holder returned: (%v, %v)", lock.lease, lock.err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the Lock behind the holder and the Waits never settled: it keeps reading its queue")
		}
		time.Sleep(time.Millisecond) // a poll: Unsettled decides
	}
	mustUnlock(t, ctx, h)
	mustUnlock(t, ctx, lock.granted(t, "the Lock behind the Waits"))
	waitsReturned(t, "a Wait", ws...)
}

// fillerWaits is how many Waits the tests below queue ahead of the ones
// they watch: more than the keys ahead a Wait reads when it queues, so
// that those Waits must learn the rest of their queue another way.
const fillerWaits = 40

// queueWaits starts n Waits on key through l, one after another, each
// once the one before has its key under prefix (have keys there before
// the first), and returns their results. It fails the test if one of
// them returns meanwhile: the key's holder holds it.
func queueWaits(t *testing.T, ctx context.Context, admin *clientv3.Client, l *etcdlock.Locker, prefix, key string, have, n int) []*pending {
	t.Helper()
	ps := make([]*pending, n)
	for i := range n {
		ps[i] = startWait(ctx, l, key)
		waitKeysQueued(t, admin, prefix, have+i+1, ps[:i+1]...)
	}
	return ps
}

// waitsReturned waits up to 10 s for each of ps, Waits, to return, and
// fails the test, naming what, unless each returned nil.
func waitsReturned(t *testing.T, what string, ps ...*pending) {
	t.Helper()
	for i, p := range ps {
		if _, err := p.within(t, 10*time.Second, what); err != nil {
			t.Fatalf("%s %d: %v", what, i, err)
		}
	}
}

// startWait runs l.Wait(ctx, key) on a goroutine of its own.
func startWait(ctx context.Context, l *etcdlock.Locker, key string) *pending {
	return start(ctx, func(ctx context.Context) (keylock.Lease, error) { return nil, l.Wait(ctx, key) })
}

// waitKeysQueued polls etcd until exactly n keys are under prefix, and
// fails the test if one of ps returns first (the key's holder holds it,
// so none may), or after 10 s.
func waitKeysQueued(t *testing.T, admin *clientv3.Client, prefix string, n int, ps ...*pending) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for i, p := range ps {
			if p.returned() {
				t.Fatalf("Wait %d of %d returned (%v) while the holder holds the key", i+1, len(ps), p.err)
			}
		}
		keys := keysUnder(t, admin, prefix)
		if len(keys) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys under %q after 10s, want %d: %q", len(keys), prefix, n, keys)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// rangeWatcher is a gRPC interceptor that notices a client's reads of
// one key's range (the shared read of a Wait's whole queue), and can
// hold back their answers: reads counts them; the answer of read i (from
// 1), once it has come, waits until release[i-1] is closed, if there is
// one, after sending i on held. It also counts the Waits' keys the
// client writes.
type rangeWatcher struct {
	rng     string
	release []chan struct{}
	held    chan int
	mu      sync.Mutex
	reads   int
	waits   int // the Waits' keys the client's transactions wrote
}

// newRangeWatcher returns a rangeWatcher of the range rng that holds
// back the answers of the first hold reads.
func newRangeWatcher(rng string, hold int) *rangeWatcher {
	rw := &rangeWatcher{rng: rng, held: make(chan int, hold)}
	for range hold {
		rw.release = append(rw.release, make(chan struct{}))
	}
	return rw
}

func (rw *rangeWatcher) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if tr, ok := req.(*etcdserverpb.TxnRequest); ok {
		for _, op := range append(tr.Success, tr.Failure...) {
			if p := op.GetRequestPut(); p != nil && strings.HasSuffix(string(p.Key), "-w") {
				rw.mu.Lock()
				rw.waits++
				rw.mu.Unlock()
			}
		}
	}
	r, ok := req.(*etcdserverpb.RangeRequest)
	if !ok || string(r.Key) != rw.rng {
		return invoke(ctx, method, req, reply, cc, opts...)
	}
	rw.mu.Lock()
	rw.reads++
	i := rw.reads
	rw.mu.Unlock()
	err := invoke(ctx, method, req, reply, cc, opts...)
	if i <= len(rw.release) {
		rw.held <- i
		select {
		case <-rw.release[i-1]:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return err
}

func (rw *rangeWatcher) count() (reads, waits int) {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return rw.reads, rw.waits
}

// awaitHeld waits for the answer of read i to be held back.
func (rw *rangeWatcher) awaitHeld(t *testing.T, i int, p *pending) {
	t.Helper()
	select {
	case j := <-rw.held:
		if j != i {
			t.Fatalf("read %d of the queue held back, want %d", j, i)
		}
	case <-p.done:
		t.Fatalf("the Wait returned (%v) while the holder holds the key, before its read %d of its queue was answered", p.err, i)
	case <-time.After(10 * time.Second):
		t.Fatalf("no read %d of the queue", i)
	}
}

// TestWaitBehindManyKnowsTheFront: a Wait queued behind more keys than
// it reads when it queues, all of them Waits of other Lockers, is not
// granted while the holder in front of them holds the key. It reads its
// whole queue (the answer held back here): until it has the answer it
// must not count the keys it did not read as gone. A second Wait of the
// same Locker, queued while the first one's answer is held back, must
// not take its view from the first (which does not know the front yet),
// nor from that read, made before its own key was written (its own key
// is not in it): it waits for the holder too, under the key it queued
// with.
func TestWaitBehindManyKnowsTheFront(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	const prefix, key = "/front", "k"
	rng := prefix + "/" + key + "/"
	rw := newRangeWatcher(rng, 1)
	holder, fillers := newLocker(t, srv.Client(t), prefix), newLocker(t, srv.Client(t), prefix)
	waiters := newLocker(t, interceptedClient(t, srv, rw.intercept), prefix)
	ctx := context.Background()
	h := mustLock(t, ctx, holder, key)
	ahead := queueWaits(t, ctx, admin, fillers, rng, key, 1, fillerWaits)

	w1 := startWait(ctx, waiters, key)
	rw.awaitHeld(t, 1, w1)
	w2 := startWait(ctx, waiters, key)
	waitKeysQueued(t, admin, rng, fillerWaits+3, w1, w2)
	keys := keysUnder(t, admin, rng)
	w2Key := keys[len(keys)-1]
	keysUnder(t, admin, rng) // a round trip more for the Waits to settle
	for i, p := range []*pending{w1, w2} {
		if p.returned() {
			t.Fatalf("Wait %d returned (%v) while the holder holds the key", i+1, p.err)
		}
	}
	close(rw.release[0])
	keysUnder(t, admin, rng)
	keysUnder(t, admin, rng)
	if w2.returned() {
		t.Fatalf("the second Wait returned (%v) while the holder holds the key", w2.err)
	}
	if keys := keysUnder(t, admin, rng); !slices.Contains(keys, w2Key) {
		t.Fatalf("the second Wait's key %q is gone before the holder's release (%q): it queued again", w2Key, keys)
	}
	released := time.Now()
	mustUnlock(t, ctx, h)
	for i, p := range append(ahead, w1, w2) {
		if _, err := p.within(t, 10*time.Second, "a Wait after the release"); err != nil {
			t.Fatalf("Wait %d: %v", i, err)
		}
		if p.at.Before(released) {
			t.Fatalf("Wait %d returned %v before the holder's release", i, released.Sub(p.at))
		}
	}
	if _, n := rw.count(); n != 2 {
		t.Fatalf("%d Wait keys written through the Waits' Locker, want 2: the second Wait queued again", n)
	}
	waitKeys(t, admin, rng, 0, 10*time.Second)
}

// TestWaitBuildsOnAWaitAhead: a Wait queued behind more keys than it
// reads when it queues, among them an earlier Wait of its Locker that
// knows the rest of the queue, takes its view from that Wait, and still
// waits for what is between the two: the holder's release grants the
// Waits and the Lock queued between them, and the second Wait returns
// once that Lock is released, with no read of its queue (it knew the
// front from the first Wait).
func TestWaitBuildsOnAWaitAhead(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	const prefix, key = "/base", "k"
	// The first Wait has few enough keys ahead to read them all; the
	// second, behind both groups of Waits and the Lock, too many, but
	// the first Wait's key is among those it reads.
	const before, after = 20, 15
	rng := prefix + "/" + key + "/"
	rw := newRangeWatcher(rng, 0)
	holder, fillers, between := newLocker(t, srv.Client(t), prefix), newLocker(t, srv.Client(t), prefix), newLocker(t, srv.Client(t), prefix)
	waiters := newLocker(t, interceptedClient(t, srv, rw.intercept), prefix)
	ctx := context.Background()
	h := mustLock(t, ctx, holder, key)
	ahead := queueWaits(t, ctx, admin, fillers, rng, key, 1, before)
	w1 := startWait(ctx, waiters, key)
	waitKeysQueued(t, admin, rng, before+2, append(ahead, w1)...)
	ahead = append(ahead, queueWaits(t, ctx, admin, fillers, rng, key, before+2, after)...)
	x := startLock(ctx, between.Lock, key)
	waitKeysQueued(t, admin, rng, before+after+3, append(ahead, w1)...)
	w2 := startWait(ctx, waiters, key)
	waitKeysQueued(t, admin, rng, before+after+4, append(ahead, w1, w2)...)

	mustUnlock(t, ctx, h)
	waitsReturned(t, "a Wait ahead of the Lock", append(ahead, w1)...)
	g := x.granted(t, "the Lock between the Waits")
	keysUnder(t, admin, rng)
	if w2.returned() {
		t.Fatalf("the second Wait returned (%v) while the Lock queued ahead of it holds the key", w2.err)
	}
	released := time.Now()
	mustUnlock(t, ctx, g)
	if _, err := w2.within(t, 10*time.Second, "the second Wait"); err != nil {
		t.Fatalf("the second Wait: %v", err)
	}
	if w2.at.Before(released) {
		t.Fatalf("the second Wait returned %v before the Lock ahead of it was released", released.Sub(w2.at))
	}
	if n, _ := rw.count(); n != 0 {
		t.Fatalf("%d reads of the whole queue through the Waits' Locker, want none: the second Wait read it once the Lock was released, not knowing the front from the first Wait", n)
	}
	waitKeys(t, admin, rng, 0, 10*time.Second)
}

// forgetAll writes and then deletes, in one deletion, more keys under
// prefix than a Locker's hub remembers deletions of (4096): a read of a
// queue made before them can no longer be judged against the deletions
// since, and the hub refuses its subscription.
func forgetAll(t *testing.T, admin *clientv3.Client, prefix string) {
	t.Helper()
	ctx := context.Background()
	const n, batch = 4200, 100
	for i := 0; i < n; i += batch {
		var ops []clientv3.Op
		for j := i; j < i+batch; j++ {
			ops = append(ops, clientv3.OpPut(prefix+strconv.Itoa(j), ""))
		}
		if _, err := admin.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Delete(ctx, prefix, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
}

// TestWaitDoesNotBuildOnARefusedRead: a Wait whose read of its whole
// queue came back too late to be judged (more deletions since than the
// hub remembers) reads again; until then, a Wait of the same Locker
// queued behind it must not take its view from it (that read says the
// queue's front is known, but the first Wait is subscribed to none of
// it): both wait for the holder.
func TestWaitDoesNotBuildOnARefusedRead(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	const prefix, key = "/refused", "k"
	rng := prefix + "/" + key + "/"
	rw := newRangeWatcher(rng, 2)
	holder, fillers, other := newLocker(t, srv.Client(t), prefix), newLocker(t, srv.Client(t), prefix), newLocker(t, srv.Client(t), prefix)
	waiters := newLocker(t, interceptedClient(t, srv, rw.intercept), prefix)
	ctx := context.Background()
	h := mustLock(t, ctx, holder, key)
	ahead := queueWaits(t, ctx, admin, fillers, rng, key, 1, fillerWaits)
	// A Lock through the Waits' Locker behind another holder: its grant
	// says that Locker's hub has dispatched every deletion before that
	// holder's release.
	h2 := mustLock(t, ctx, other, "mark")
	mark := startLock(ctx, waiters.Lock, "mark")
	waitKeys(t, admin, prefix+"/mark/", 2, 10*time.Second)

	w1 := startWait(ctx, waiters, key)
	rw.awaitHeld(t, 1, w1)
	forgetAll(t, admin, prefix+"/forget/")
	mustUnlock(t, ctx, h2)
	mustUnlock(t, ctx, mark.granted(t, "the Lock behind the deletions"))
	close(rw.release[0])   // too late to be judged: the Wait reads again,
	rw.awaitHeld(t, 2, w1) // and that answer is held back too
	w2 := startWait(ctx, waiters, key)
	waitKeysQueued(t, admin, rng, fillerWaits+3, w1, w2)
	keysUnder(t, admin, rng) // a round trip more for the Waits to settle
	for i, p := range []*pending{w1, w2} {
		if p.returned() {
			t.Fatalf("Wait %d returned (%v) while the holder holds the key", i+1, p.err)
		}
	}
	close(rw.release[1])
	keysUnder(t, admin, rng)
	keysUnder(t, admin, rng)
	for i, p := range []*pending{w1, w2} {
		if p.returned() {
			t.Fatalf("Wait %d returned (%v) while the holder holds the key", i+1, p.err)
		}
	}
	released := time.Now()
	mustUnlock(t, ctx, h)
	for i, p := range append(ahead, w1, w2) {
		if _, err := p.within(t, 10*time.Second, "a Wait after the release"); err != nil {
			t.Fatalf("Wait %d: %v", i, err)
		}
		if p.at.Before(released) {
			t.Fatalf("Wait %d returned %v before the holder's release", i, released.Sub(p.at))
		}
	}
	waitKeys(t, admin, rng, 0, 10*time.Second)
}
