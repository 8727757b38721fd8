package etcdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"github.com/fairlock/fairlock/etcdlock/internal/testhook"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	"github.com/fairlock/fairlock/owner"
)

// Every change of a key's holders on etcd (Locker.Follow, the
// keylock.Follower that package elect's Observe follows): every term in
// order, a watch that breaks resumed without a loss, and a gap where
// etcd compacted what the feed had not read.

// TestElectObserveEveryTerm: Observe, over etcdlock, reports each of 50
// terms that begin and end without a pause, and each vacancy between
// them, in order (disttest.ElectObserveEveryTerm).
func TestElectObserveEveryTerm(t *testing.T) {
	disttest.ElectObserveEveryTerm(t, newBackend(t, etcdtest.StartServer(t)), "/elect-every-term")
}

// TestFollowResumesAfterBrokenWatch: a feed whose watch ends (as a broken
// connection ends it) while grants come and go watches again from the
// revision after the last it applied, and reports every one of them, in
// order, with no gap: a hand-over to a queued call as one change,
// readers one by one with their label and mode.
func TestFollowResumesAfterBrokenWatch(t *testing.T) {
	srv := etcdtest.StartServer(t)
	follower := newLocker(t, srv.Client(t), "/follow")
	l := newLocker(t, srv.Client(t), "/follow")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := follower.Follow(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	disttest.ExpectChange(t, ch, false)
	g1 := mustLock(t, owner.NewLabeledContext(ctx, "one"), l, "k")
	if c := disttest.ExpectChange(t, ch, false, g1.Token()); c.Holders[0].Label != "one" || c.Holders[0].Mode != keylock.ModeExclusive {
		t.Fatalf("the holder: %+v", c.Holders[0])
	}

	resume := testhook.PauseFeeds(follower, 1)
	queued := make(chan keylock.Lease, 1)
	go func() {
		g, err := l.Lock(owner.NewContext(ctx), "k")
		if err != nil {
			t.Error(err)
		}
		queued <- g
	}()
	deadline := time.Now().Add(10 * time.Second)
	for len(keysUnder(t, srv.Client(t), "/follow/k/")) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("the second Lock did not queue within 10 s")
		}
		time.Sleep(2 * time.Millisecond)
	}
	mustUnlock(t, ctx, g1)
	g2 := <-queued
	mustUnlock(t, ctx, g2)
	r1, err := l.RLock(owner.NewLabeledContext(ctx, "r1"), "k")
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.RLock(owner.NewLabeledContext(ctx, "r2"), "k")
	if err != nil {
		t.Fatal(err)
	}
	resume()

	disttest.ExpectChange(t, ch, false, g2.Token()) // the hand-over: no vacancy before it
	disttest.ExpectChange(t, ch, false)
	disttest.ExpectChange(t, ch, false, r1.Token())
	c := disttest.ExpectChange(t, ch, false, r1.Token(), r2.Token())
	if c.Holders[1].Label != "r2" || c.Holders[1].Mode != keylock.ModeShared {
		t.Fatalf("the second reader: %+v", c.Holders[1])
	}
	mustUnlock(t, ctx, r1, r2)
	disttest.ExpectChange(t, ch, false, r2.Token())
	disttest.ExpectChange(t, ch, false)
}

// TestFollowGapOnCompaction: a feed whose watch is down while etcd
// compacts the revisions it has not read reports a gap, with the holders
// read afresh, and then every change again.
func TestFollowGapOnCompaction(t *testing.T) {
	srv := etcdtest.StartServer(t)
	admin := srv.Client(t)
	follower := newLocker(t, srv.Client(t), "/compact")
	l := newLocker(t, srv.Client(t), "/compact")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := follower.Follow(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	disttest.ExpectChange(t, ch, false)
	g1 := mustLock(t, ctx, l, "k")
	disttest.ExpectChange(t, ch, false, g1.Token())

	resume := testhook.PauseFeeds(follower, 1)
	mustUnlock(t, ctx, g1)
	g2 := mustLock(t, ctx, l, "k") // a term the feed never sees
	mustUnlock(t, ctx, g2)
	g3 := mustLock(t, owner.NewLabeledContext(ctx, "three"), l, "k")
	resp, err := admin.Get(ctx, "/compact/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	resume()

	if c := disttest.ExpectChange(t, ch, true, g3.Token()); c.Holders[0].Label != "three" {
		t.Fatalf("the holder after the gap: %+v", c.Holders[0])
	}
	mustUnlock(t, ctx, g3)
	disttest.ExpectChange(t, ch, false)
}

// TestFollowEndsWithClose: a feed's channel closes when its Locker's
// Close begins, and Follow on a closed Locker fails with ErrClosed.
func TestFollowEndsWithClose(t *testing.T) {
	c := etcdtest.Start(t)
	l := newLocker(t, c, "/follow-close")
	ch, err := l.Follow(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	disttest.ExpectChange(t, ch, false)
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-ch:
		if ok {
			t.Fatal("a change after Close")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the feed did not close with its Locker")
	}
	if _, err := l.Follow(context.Background(), "k"); !errors.Is(err, fairlock.ErrClosed) {
		t.Fatalf("Follow after Close: %v, want ErrClosed", err)
	}
}
