package etcdlock_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// TestLockBehindWaitsGrantedBeforeTheirKeysGo: with every deletion of a
// Wait's key held back (a gRPC interceptor on the client of the Locker
// the Waits come through), the holder's release still grants the Lock
// queued behind five Waits, on another client: a Wait whose turn has
// come is transparent to the calls behind it, so they are granted at
// the release, not one deletion after another. Every Wait's key is still
// there when the Lock is granted; once the deletions go through, the
// Waits return.
func TestLockBehindWaitsGrantedBeforeTheirKeysGo(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	release := make(chan struct{})
	var once sync.Once
	releaseDeletes := func() { once.Do(func() { close(release) }) }
	defer releaseDeletes() // before the Lockers' Close, in t.Cleanup
	holdWaitDeletes := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if tr, ok := req.(*etcdserverpb.TxnRequest); ok {
			for _, op := range append(tr.Success, tr.Failure...) {
				if d := op.GetRequestDeleteRange(); d != nil && strings.HasSuffix(string(d.Key), "-w") {
					select {
					case <-release:
					case <-ctx.Done():
						return ctx.Err()
					}
					break
				}
			}
		}
		return invoke(ctx, method, req, reply, cc, opts...)
	}
	const prefix, key, n = "/waits", "hot", 5
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
	releaseDeletes()
	for range n {
		select {
		case err := <-waits:
			if err != nil {
				t.Fatalf("Wait: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a Wait did not return once its key could go")
		}
	}
	mustUnlock(t, ctx, g)
	waitKeys(t, admin, prefix+"/", 0, 10*time.Second)
}
