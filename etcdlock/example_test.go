package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// exampleClient starts an embedded server for an example and returns a
// client and the function that stops both. Real code dials its cluster
// with clientv3.New.
func exampleClient() (*clientv3.Client, func()) {
	dir, err := os.MkdirTemp("", "etcdlock-example-")
	if err != nil {
		panic(err)
	}
	srv, err := etcdtest.NewServer(dir)
	if err != nil {
		panic(err)
	}
	client, err := etcdtest.NewClient(srv.Endpoints())
	if err != nil {
		panic(err)
	}
	return client, func() {
		_ = client.Close()
		srv.Close()
		_ = os.RemoveAll(dir)
	}
}

// Writes to etcd made under a grant are fenced with IsOwner: they happen
// only if the grant is still current when etcd applies them.
func Example() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()

	locks, err := etcdlock.New(client, "/locks/orders")
	if err != nil {
		panic(err)
	}
	defer locks.Close(ctx)

	g, err := locks.Lock(ctx, "order-7")
	if err != nil {
		panic(err)
	}
	resp, err := client.Txn(ctx).
		If(g.IsOwner()).
		Then(clientv3.OpPut("/orders/order-7", "paid")).
		Commit()
	if err != nil {
		panic(err)
	}
	fmt.Println("written under the grant:", resp.Succeeded)
	if err := g.Unlock(ctx); err != nil {
		panic(err)
	}

	// The same transaction with the released grant writes nothing.
	resp, err = client.Txn(ctx).If(g.IsOwner()).Then(clientv3.OpPut("/orders/order-7", "stale")).Commit()
	if err != nil {
		panic(err)
	}
	fmt.Println("written after Unlock:", resp.Succeeded)
	// Output:
	// written under the grant: true
	// written after Unlock: false
}

// fencedStore is a store outside etcd that refuses writes from grants
// older than the newest it has accepted (Kleppmann's fencing tokens).
type fencedStore struct {
	mu     sync.Mutex
	tokens map[string]uint64 // largest token accepted per key
	data   map[string]string
}

var errStale = errors.New("stale fencing token")

func (s *fencedStore) Put(key, value string, token uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if token < s.tokens[key] {
		return errStale
	}
	s.tokens[key] = token
	s.data[key] = value
	return nil
}

// A store outside etcd keeps the largest token it has seen for a key and
// refuses smaller ones: a holder that lost its grant (paused past its
// lease, say) cannot overwrite what a later holder wrote.
func ExampleGuard_Token() {
	client, stop := exampleClient()
	defer stop()
	ctx := context.Background()
	locks, err := etcdlock.New(client, "/locks/files")
	if err != nil {
		panic(err)
	}
	defer locks.Close(ctx)
	store := &fencedStore{tokens: map[string]uint64{}, data: map[string]string{}}

	first, err := locks.Lock(ctx, "report.pdf")
	if err != nil {
		panic(err)
	}
	// Suppose the first holder stalls and loses its grant; here it simply
	// unlocks, and a second holder takes the key.
	_ = first.Unlock(ctx)
	second, err := locks.Lock(ctx, "report.pdf")
	if err != nil {
		panic(err)
	}
	fmt.Println("second holder:", store.Put("report.pdf", "v2", second.Token()))
	fmt.Println("first holder, late:", store.Put("report.pdf", "v1", first.Token()))
	_ = second.Unlock(ctx)
	// Output:
	// second holder: <nil>
	// first holder, late: stale fencing token
}
