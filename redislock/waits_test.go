package redislock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// TestWaitsReleasedInOneNotice: the holder's release publishes one
// notice that names every Wait queued behind it, through three Lockers,
// and the Lock queued behind them: the release's script grants them all
// at once (a Wait whose turn has come is transparent), not one after
// another as each Wait's Locker removes its entry. The notice is read
// from the prefix's channel ({prefix}grants, keys.go) by a subscriber of
// the test's own, after a marker the test published once every call had
// queued, so the notices of the enqueues cannot be mistaken for it.
func TestWaitsReleasedInOneNotice(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.NewClient(t)
	const prefix, key, n = "waits", "hot", 5 // no character of prefix is escaped
	channel := "{" + prefix + "}grants"
	ctx := context.Background()
	sub := admin.Subscribe(ctx, channel)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatal(err)
	}
	ls := []*redislock.Locker{newLocker(t, srv.NewClient(t), prefix), newLocker(t, srv.NewClient(t), prefix), newLocker(t, srv.NewClient(t), prefix)}
	h, err := ls[0].Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	waits := make(chan error, n)
	for i := range n {
		go func() { waits <- ls[i%len(ls)].Wait(ctx, key) }()
		awaitQueue(t, admin, prefix, key, i+2, 10*time.Second)
	}
	granted := lockAsync(t, ctx, ls[1], key)
	awaitQueue(t, admin, prefix, key, n+2, 10*time.Second)
	queue, err := admin.ZRange(ctx, redislock.QueueKey(prefix, key), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Publish(ctx, channel, "marker").Err(); err != nil {
		t.Fatal(err)
	}
	for {
		m := nextNotice(t, sub)
		if m == "marker" {
			break
		}
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	got, want := nextNotice(t, sub), strings.Join(queue[1:], " ")
	if got != want {
		t.Errorf("the release's notice names\n%q\nwant every Wait and the Lock behind them\n%q", strings.Fields(got), queue[1:])
	}
	for range n {
		if err := recvWithin(t, waits, 10*time.Second, "a Wait did not return after the release"); err != nil {
			t.Fatalf("Wait: %v", err)
		}
	}
	g := awaitGrant(t, granted, 10*time.Second, "the Lock behind the Waits was not granted")
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	awaitQueue(t, admin, prefix, key, 0, 10*time.Second)
}

// nextNotice returns the payload of the next message on sub, failing t
// if none comes within 10 s.
func nextNotice(t *testing.T, sub *redis.PubSub) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatalf("no notice: %v", err)
	}
	return m.Payload
}
