package etcdlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
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
		g, err := l.Lock(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
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
	stalling, err := clientv3.New(clientv3.Config{
		Endpoints: srv.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(st.intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stalling.Close()

	ahead := newLocker(t, c, "/stalled")
	ctx := context.Background()
	h, err := ahead.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
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
	waiter := make(chan error, 1)
	go func() {
		_, err := l.Lock(ctx, "k") // ten keys ahead: it watches the nearest eight
		waiter <- err
	}()
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
	if err := <-waiter; !errors.Is(err, fairlock.ErrClosed) {
		t.Errorf("the queued call: %v, want ErrClosed", err)
	}
}

// TestCloseIsBoundedWithEtcdDown: with etcd unreachable and deletions of
// cancelled calls' keys left to the janitor, Close returns within its ctx
// plus the 5 s bound of the lease's revoke, however many deletions are
// left: they are not tried for 5 s each.
func TestCloseIsBoundedWithEtcdDown(t *testing.T) {
	srv := etcdtest.StartServer(t)
	c := srv.Client(t)
	l, err := etcdlock.New(c, "/down", etcdlock.WithTTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := l.Lock(ctx, "k"); err != nil {
		t.Fatal(err)
	}
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
		if err := <-errs; !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("waiter: %v", err)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	start := time.Now()
	err = l.Close(cctx)
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

// TestCancelledWaitReturnsWithEtcdDown: a queued Lock whose ctx ends
// while etcd does not answer returns at its deadline, not after its key's
// deletion (which goes on in the background, bounded by 5 s).
func TestCancelledWaitReturnsWithEtcdDown(t *testing.T) {
	srv := etcdtest.StartServer(t)
	c := srv.Client(t)
	l, err := etcdlock.New(c, "/late", etcdlock.WithTTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := l.Lock(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(owner.NewContext(ctx))
	done := make(chan error, 1)
	go func() { _, err := l.Lock(wctx, "k"); done <- err }()
	waitKeys(t, c, "/late/", 2, 5*time.Second)
	srv.Stop()
	start := time.Now()
	cancel()
	err = <-done
	if took := time.Since(start); took > time.Second {
		t.Errorf("a cancelled waiter returned %v after its cancel, with etcd down", took.Round(time.Millisecond))
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("the waiter: %v, want context.Canceled", err)
	}
	cctx, cancelClose := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancelClose()
	_ = l.Close(cctx) // the grant is still held: Close gives up and revokes
}
