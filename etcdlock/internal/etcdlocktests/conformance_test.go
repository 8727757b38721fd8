package etcdlock_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestConformance runs keylock's conformance suite against etcdlock on an
// embedded etcd server: every Locker and Semaphore the suite asks for has
// a client of its own (as another process would), the Lockers of one check
// share a prefix of their own, the suite learns that a call has queued
// from the keys in the key's range (Calls), and Lose deletes the grant's
// key, as someone with etcdctl, or the expiry of its lease, would.
func TestConformance(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	var mu sync.Mutex
	prefixes := map[testing.TB]string{}
	prefix := func(t testing.TB) string {
		mu.Lock()
		defer mu.Unlock()
		p, ok := prefixes[t]
		if !ok {
			p = "/conformance/" + strconv.Itoa(len(prefixes))
			prefixes[t] = p
		}
		return p
	}
	// The range of key's calls, in the layout keys.go documents.
	rangeOf := func(t testing.TB, key string) string { return rangeUnder(prefix(t), key) }
	keylocktest.Run(t, keylocktest.Harness{
		New: func(t testing.TB) keylock.Locker {
			l, err := etcdlock.New(srv.Client(t), prefix(t), etcdlock.WithTTL(testTTL))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { closeBounded(t, l) })
			return l
		},
		NewSemaphore: func(t testing.TB, n int64) keylock.Semaphore {
			s, err := etcdlock.NewSemaphore(srv.Client(t), prefix(t), n, etcdlock.WithTTL(testTTL))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { closeBounded(t, s) })
			return s
		},
		Calls: func(t testing.TB, key string) int {
			resp, err := admin.Get(context.Background(), rangeOf(t, key), clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil {
				t.Fatal(err)
			}
			return int(resp.Count)
		},
		Lose: func(t testing.TB, l keylock.Lease) {
			deleteGrant(t, admin, rangeOf(t, l.Key()), l)
		},
	})
}

// rangeUnder is the etcd key prefix under which key's calls queue for a
// Locker or Semaphore with prefix: prefix/<key, '%' and '/' escaped>/.
func rangeUnder(prefix, key string) string {
	return strings.TrimRight(prefix, "/") + "/" + strings.NewReplacer("%", "%25", "/", "%2F").Replace(key) + "/"
}

// deleteGrant deletes the etcd key of the grant l, found in the range r
// by its creation revision (the grant's token), as someone with etcdctl
// would: the grant is lost.
func deleteGrant(t testing.TB, client *clientv3.Client, r string, l keylock.Lease) {
	t.Helper()
	ctx := context.Background()
	resp, err := client.Get(ctx, r, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if uint64(kv.CreateRevision) == l.Token() {
			if _, err := client.Delete(ctx, string(kv.Key)); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no key in %q with the grant's token %d", r, l.Token())
}

// closeBounded closes c when a check ends, failing the check if a grant is
// still held after a bound (the suite unlocks every grant it took first).
func closeBounded(t testing.TB, c interface{ Close(context.Context) error }) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
}
