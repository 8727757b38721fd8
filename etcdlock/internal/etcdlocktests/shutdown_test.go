package etcdlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	"github.com/fairlock/fairlock/owner"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestUnlockWithDoneContextReleases: an Unlock whose ctx is already done
// (a deferred Unlock after the request's deadline) still releases: it
// returns the context's error, the key leaves etcd (the janitor deletes
// it), and the next Lock is granted.
func TestUnlockWithDoneContextReleases(t *testing.T) {
	c := startClient(t)
	l := newLocker(t, c, "/unlockdone")
	done, cancel := context.WithCancel(context.Background())
	cancel()
	// A select between a free Guard and a done ctx would pick either at
	// random: ten rounds would all pass that way once in a thousand.
	for i := range 10 {
		g := mustLock(t, context.Background(), l, "k")
		if err := g.Unlock(done); !errors.Is(err, context.Canceled) {
			t.Fatalf("round %d: Unlock with a done ctx: %v, want context.Canceled", i, err)
		}
		if err := g.Unlock(done); err != nil {
			t.Fatalf("round %d: second Unlock: %v, want nil", i, err)
		}
		waitKeys(t, c, "/unlockdone/", 0, 5*time.Second)
	}
}

// stall is a gRPC interceptor that holds the queue re-reads of
// Locker.check (a Txn with a Range bounded by MaxCreateRevision) once on
// is set, as an etcd that does not answer would (clientv3 calls wait for
// a connection), until release is closed or the call's ctx ends.
type stall struct {
	mu      sync.Mutex
	on      bool
	held    int
	release chan struct{}
}

func (s *stall) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if tr, ok := req.(*etcdserverpb.TxnRequest); ok {
		for _, op := range tr.Success {
			if r := op.GetRequestRange(); r != nil && r.MaxCreateRevision > 0 {
				s.mu.Lock()
				on := s.on
				if on {
					s.held++
				}
				s.mu.Unlock()
				if on {
					select {
					case <-s.release:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
			}
		}
	}
	return invoke(ctx, method, req, reply, cc, opts...)
}

func (s *stall) stalled() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// TestCloseEndsAStalledQueueRead: a queued call with more than eight keys
// ahead reads its queue again when the nearest eight are gone. If etcd
// does not answer that read, Close still returns within its ctx and the
// call returns ErrClosed.
func TestCloseEndsAStalledQueueRead(t *testing.T) {
	srv := etcdtest.StartServer(t)
	c := srv.Client(t)
	st := &stall{release: make(chan struct{})}
	defer close(st.release)
	stalling := interceptedClient(t, srv, st.intercept)

	ahead := newLocker(t, c, "/stalled")
	ctx := context.Background()
	h := mustLock(t, ctx, ahead, "k")
	defer h.Unlock(ctx)
	const queued = 9
	cancels := make([]context.CancelFunc, queued)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range cancels {
		qctx, cancel := context.WithCancel(owner.NewContext(ctx))
		cancels[i] = cancel
		defer cancel()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if g, err := ahead.Lock(qctx, "k"); err == nil {
				_ = g.Unlock(ctx)
			}
		}()
		waitKeys(t, c, "/stalled/", i+2, 5*time.Second)
	}

	l, err := etcdlock.New(stalling, "/stalled", etcdlock.WithTTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	waiter := startLock(ctx, l.Lock, "k") // ten keys ahead: it watches the nearest eight
	waitKeys(t, c, "/stalled/", queued+2, 5*time.Second)
	st.mu.Lock()
	st.on = true
	st.mu.Unlock()
	for _, cancel := range cancels[1:] { // the nearest eight leave
		cancel()
	}
	for deadline := time.Now().Add(5 * time.Second); st.stalled() == 0; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiter did not read its queue again")
		}
	}

	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- l.Close(cctx) }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close with a 1 s ctx still waits 10 s later, for a read etcd does not answer")
	}
	if _, err := waiter.wait(); !errors.Is(err, fairlock.ErrClosed) {
		t.Errorf("the queued call: %v, want ErrClosed", err)
	}
}

// holdOnOwnServer starts a server of the test's own (the test may stop
// it), and a Locker on it under prefix that holds "k". The test closes
// the Locker.
func holdOnOwnServer(t *testing.T, prefix string) (*etcdtest.Server, *clientv3.Client, *etcdlock.Locker, keylock.Lease) {
	t.Helper()
	srv := etcdtest.StartServer(t)
	c := srv.Client(t)
	l, err := etcdlock.New(c, prefix, etcdlock.WithTTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	g := mustLock(t, context.Background(), l, "k")
	return srv, c, l, g
}

// TestCloseIsBoundedWithEtcdDown: with etcd unreachable and deletions of
// cancelled calls' keys left to the janitor, Close returns within its ctx
// plus the 5 s bound of the lease's revoke, however many deletions are
// left: they are not tried for 5 s each.
func TestCloseIsBoundedWithEtcdDown(t *testing.T) {
	srv, c, l, _ := holdOnOwnServer(t, "/down")
	ctx := context.Background()
	const n = 3
	errs := make(chan error, n)
	for range n {
		go func() {
			wctx, cancel := context.WithTimeout(owner.NewContext(ctx), 1500*time.Millisecond)
			defer cancel()
			_, err := l.Lock(wctx, "k")
			errs <- err
		}()
	}
	waitKeys(t, c, "/down/", n+1, 5*time.Second)
	srv.Stop()
	for range n {
		// A waiter's key can be visible to waitKeys before the reply to
		// its enqueueing transaction reaches it; a Stop in between fails
		// that transaction with etcd's error (Unavailable), as Lock says,
		// and leaves its key, of unknown outcome, to the janitor.
		if err := <-errs; !errors.Is(err, context.DeadlineExceeded) && status.Code(err) != codes.Unavailable {
			t.Fatalf("waiter: %v, want DeadlineExceeded (or Unavailable, cut mid-enqueue)", err)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	start := time.Now()
	err := l.Close(cctx)
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close with a grant held: %v, want DeadlineExceeded", err)
	}
	// 1 s of ctx, 5 s for the revoke and the last deletions together,
	// and 2 s of slack; a deletion tried for 5 s each takes 16 s or more.
	if took > 8*time.Second {
		t.Fatalf("Close with a 1 s ctx and etcd down took %v (%d deletions left to the janitor)", took.Round(time.Millisecond), n)
	}
}

// TestCloseIsBoundedAfterLeaseLost: with etcd down long enough that the
// Locker abandons its lease (its grants are lost) and keeps trying to
// revoke it, and a cancelled waiter's key left to the janitor, Close
// still returns within its ctx plus the 5 s bound: the abandoned lease's
// revoke ends when Close begins.
func TestCloseIsBoundedAfterLeaseLost(t *testing.T) {
	srv, c, l, g := holdOnOwnServer(t, "/abandoned")
	ctx := context.Background()
	wctx, cancelWaiter := context.WithCancel(owner.NewContext(ctx))
	waiter := startLock(wctx, l.Lock, "k")
	waitKeys(t, c, "/abandoned/", 2, 5*time.Second)
	srv.Stop()
	cancelWaiter() // its key's deletion fails and is left to the janitor
	if _, err := waiter.wait(); !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiter: %v", err)
	}
	// The renewal deadline passes: the lease is abandoned.
	awaitLost(t, g, 4*testTTL, "with etcd down for four TTLs")
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	start := time.Now()
	_ = l.Close(cctx)
	// 1 s of ctx and 5 s for the revoke and the last deletions, all timed
	// by timers, and 1 s of slack; an abandoned lease's revoke left
	// running would add most of another 5 s.
	if took := time.Since(start); took > 7*time.Second {
		t.Fatalf("Close with a 1 s ctx, after the lease was abandoned with etcd down, took %v", took.Round(time.Millisecond))
	}
}

// TestUnlockDuringCloseIsNotReportedLate: an Unlock whose deletion is in
// flight while Close gives up and unregisters the observer does not
// report its Release to the observer afterwards.
func TestUnlockDuringCloseIsNotReportedLate(t *testing.T) {
	srv := etcdtest.StartServer(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var held atomic.Bool
	holdDeletes := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		tr, ok := req.(*etcdserverpb.TxnRequest)
		if ok && len(tr.Success) == 1 && tr.Success[0].GetRequestDeleteRange() != nil && held.CompareAndSwap(false, true) {
			close(entered)
			<-release // only the first deletion: the Unlock's
		}
		return invoke(ctx, method, req, reply, cc, opts...)
	}
	c := interceptedClient(t, srv, holdDeletes)
	o := &disttest.Observer{}
	l, err := etcdlock.New(c, "/unlockclose", etcdlock.WithTTL(testTTL), etcdlock.WithObserver(o))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	g := mustLock(t, ctx, l, "k")
	unlocked := make(chan error, 1)
	go func() { unlocked <- g.Unlock(ctx) }()
	<-entered // the Unlock's deletion is in flight
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_ = l.Close(cctx) // gives up on the grant and unregisters the observer
	close(release)
	<-unlocked
	if _, late := o.Released(); !o.Unregistered() || late != 0 {
		t.Fatalf("observer unregistered %v, %d Releases heard after Unregister; want true, 0", o.Unregistered(), late)
	}
}
