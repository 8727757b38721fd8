package etcdlock_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"github.com/fairlock/fairlock/keylock"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

// workerEnv names the role of a re-executed test binary: TestMain runs
// the worker (process_test.go) instead of the tests when it is set.
const workerEnv = "ETCDLOCK_TEST_WORKER"

func TestMain(m *testing.M) {
	if role := os.Getenv(workerEnv); role != "" {
		os.Exit(runWorker(role))
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

// startClient starts an embedded server and returns a client of it.
func startClient(t testing.TB) *clientv3.Client {
	t.Helper()
	return etcdtest.Start(t)
}

// isOwner is the IsOwner comparison of a grant: every Lease an etcdlock
// Locker or Semaphore returns is a *etcdlock.Guard.
func isOwner(l keylock.Lease) clientv3.Cmp { return l.(*etcdlock.Guard).IsOwner() }
