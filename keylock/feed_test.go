package keylock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
)

// TestInProcessFollow: the in-process view follows a key: the holders
// when Follow was called, then each grant and release, each holder with
// its label, this process and the Locker's name; the channel closes when
// the context ends.
func TestInProcessFollow(t *testing.T) {
	fl := fairlock.New[string](fairlock.WithName("followed"))
	defer fl.Close(context.Background())
	l := keylock.InProcess(fl)
	ctx, cancel := context.WithCancel(context.Background())
	ch, err := l.(keylock.Follower).Follow(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	next := func() keylock.Change {
		t.Helper()
		select {
		case c := <-ch:
			return c
		case <-time.After(10 * time.Second):
			t.Fatal("no change within 10 s")
		}
		return keylock.Change{}
	}
	if c := next(); len(c.Holders) != 0 || c.Gap {
		t.Fatalf("first: %+v, want no holder", c)
	}
	g, err := l.Lock(owner.NewLabeledContext(ctx, "req-1"), "k")
	if err != nil {
		t.Fatal(err)
	}
	c := next()
	if len(c.Holders) != 1 || c.Gap || c.At.IsZero() {
		t.Fatalf("after Lock: %+v", c)
	}
	if h, want := c.Holders[0], keylock.LocalProcess("followed"); h.Label != "req-1" || h.Process != want ||
		h.Mode != keylock.ModeExclusive || !h.Held || h.Token != g.Token() {
		t.Fatalf("the holder: %+v; want req-1 in %v, exclusive, token %d", h, want, g.Token())
	}
	g.Unlock(ctx)
	if c := next(); len(c.Holders) != 0 {
		t.Fatalf("after Unlock: %+v", c)
	}
	cancel()
	for range ch {
	}
	if _, err := l.(keylock.Follower).Follow(ctx, "k"); err == nil {
		t.Fatal("Follow with a done context succeeded")
	}
}
