package etcdlock_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// TestMain runs a worker's role (process_test.go) instead of the tests
// in a re-executed test binary.
func TestMain(m *testing.M) {
	if w, ok := disttest.IsWorker(); ok {
		os.Exit(runWorker(w))
	}
	// No goroutine is ignored: with etcd v3.7.3, a closed client, a
	// stopped embedded server (etcdtest cuts its client connections
	// first) and a closed Locker leave none behind.
	goleak.VerifyTestMain(m)
}

// testTTL is the lease TTL of the tests' Lockers: short, so that tests of
// lost leases run fast, yet long enough that a keep-alive (every TTL/3)
// delayed by the race detector and a loaded machine still lands in time.
const testTTL = 3 * time.Second

// newLocker returns a Locker on client under prefix, closed by t.Cleanup
// (which fails the test if Close fails).
func newLocker(t testing.TB, client *clientv3.Client, prefix string, opts ...etcdlock.Option) *etcdlock.Locker {
	t.Helper()
	l, err := etcdlock.New(client, prefix, append([]etcdlock.Option{etcdlock.WithTTL(testTTL)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := l.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return l
}

// keysUnder returns the etcd keys under prefix, oldest first.
func keysUnder(t testing.TB, client *clientv3.Client, prefix string) []string {
	t.Helper()
	resp, err := client.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		keys[i] = string(kv.Key)
	}
	return keys
}

// waitKeys polls etcd until exactly n keys are under prefix, and fails
// the test after d.
func waitKeys(t testing.TB, client *clientv3.Client, prefix string, n int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		keys := keysUnder(t, client, prefix)
		if len(keys) == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d keys under %q after %v, want %d: %q", len(keys), prefix, d, n, keys)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// interceptedClient returns a client of srv whose unary calls pass
// through intercept, closed by t.Cleanup: after the Lockers made on it
// later, whose Cleanups run first.
func interceptedClient(t testing.TB, srv *etcdtest.Server, intercept grpc.UnaryClientInterceptor) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{
		Endpoints: srv.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startClient starts an embedded server and returns a client of it.
func startClient(t testing.TB) *clientv3.Client {
	t.Helper()
	return etcdtest.Start(t)
}

// isOwner is the IsOwner comparison of a grant: every Lease an etcdlock
// Locker or Semaphore returns is a *etcdlock.Guard.
func isOwner(l keylock.Lease) clientv3.Cmp { return l.(*etcdlock.Guard).IsOwner() }

// mustLock locks key through l for ctx's owner and returns the grant,
// failing the test if Lock fails.
func mustLock(t testing.TB, ctx context.Context, l *etcdlock.Locker, key string) keylock.Lease {
	t.Helper()
	g, err := l.Lock(ctx, key)
	if err != nil {
		t.Fatalf("Lock(%q): %v", key, err)
	}
	return g
}

// mustAcquire acquires w units of key through s for ctx's owner and
// returns the grant, failing the test if Acquire fails.
func mustAcquire(t testing.TB, ctx context.Context, s *etcdlock.Semaphore, key string, w int64) keylock.Lease {
	t.Helper()
	g, err := s.Acquire(ctx, key, w)
	if err != nil {
		t.Fatalf("Acquire(%q, %d): %v", key, w, err)
	}
	return g
}

// mustUnlock unlocks each grant in turn, failing the test at the first
// Unlock that returns an error.
func mustUnlock(t testing.TB, ctx context.Context, gs ...keylock.Lease) {
	t.Helper()
	for _, g := range gs {
		if err := g.Unlock(ctx); err != nil {
			t.Fatalf("Unlock of %q (token %d): %v", g.Key(), g.Token(), err)
		}
	}
}

// awaitLost waits up to d for g's Lost to close, and fails the test,
// saying what should have closed it, if it is still open then.
func awaitLost(t testing.TB, g keylock.Lease, d time.Duration, after string) {
	t.Helper()
	select {
	case <-g.Lost():
	case <-time.After(d):
		t.Fatalf("Lost of %q (token %d) still open %v %s", g.Key(), g.Token(), d, after)
	}
}

// notLost fails the test if g's Lost is closed now; it does not wait.
func notLost(t testing.TB, g keylock.Lease, what string) {
	t.Helper()
	select {
	case <-g.Lost():
		t.Fatalf("%s: Lost of %q (token %d) is closed", what, g.Key(), g.Token())
	default:
	}
}

// pending is a lock call running on a goroutine of its own.
type pending struct {
	done  chan struct{} // closed once the call has returned
	lease keylock.Lease
	err   error
	at    time.Time // when the call returned
}

// start runs f(ctx) on a goroutine of its own.
func start(ctx context.Context, f func(context.Context) (keylock.Lease, error)) *pending {
	p := &pending{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.lease, p.err = f(ctx)
		p.at = time.Now()
	}()
	return p
}

// startLock runs lock(ctx, key) on a goroutine of its own: lock is a
// Locker's Lock, TryLock, RLock or TryRLock.
func startLock(ctx context.Context, lock func(context.Context, string) (keylock.Lease, error), key string) *pending {
	return start(ctx, func(ctx context.Context) (keylock.Lease, error) { return lock(ctx, key) })
}

// startAcquire runs s.Acquire(ctx, key, w) on a goroutine of its own.
func startAcquire(ctx context.Context, s *etcdlock.Semaphore, key string, w int64) *pending {
	return start(ctx, func(ctx context.Context) (keylock.Lease, error) { return s.Acquire(ctx, key, w) })
}

// returned reports whether p's call has returned; it does not wait.
func (p *pending) returned() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// wait waits for p's call to return, with no bound of its own (the
// test binary's -timeout is the bound), and returns its result.
func (p *pending) wait() (keylock.Lease, error) {
	<-p.done
	return p.lease, p.err
}

// within waits up to d for p's call to return and returns its result;
// it fails the test, naming what, if the call is still running then.
func (p *pending) within(t *testing.T, d time.Duration, what string) (keylock.Lease, error) {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("%s: still waiting after %v", what, d)
	}
	return p.lease, p.err
}

// granted waits up to 10 s for p and fails unless it returned a grant.
func (p *pending) granted(t *testing.T, what string) keylock.Lease {
	t.Helper()
	l, err := p.within(t, 10*time.Second, what)
	if err != nil || l == nil {
		t.Fatalf("%s: (%v, %v), want a grant", what, l, err)
	}
	return l
}
