// Package etcdtestuser tests etcdlock on the embedded etcd server that
// etcdtest starts, as a user's tests would, both installed from their tags.
package etcdtestuser

import (
	"context"
	"testing"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
)

func TestLock(t *testing.T) {
	ctx := context.Background()
	l, err := etcdlock.New(etcdtest.Start(t), "/user/locks")
	if err != nil {
		t.Fatal(err)
	}
	g, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if locked, err := l.Locked(ctx, "k"); err != nil || !locked {
		t.Fatalf("Locked while held: %v, %v", locked, err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
}
