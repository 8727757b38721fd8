package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"

	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// TestWaitsReleasedInOneNotice: the holder's release frees every Wait
// queued behind it, through three Lockers, and the Lock behind them, with
// two notices whatever the number of Waits: one names the Lock's entry,
// the other is the Waits' bound ("@bound {tag}": every Wait with a token
// below it has had its turn), which is the Lock's token; the release
// walks none of the Waits and names none of them, and it removes their
// entries itself (the set of Waits is gone when the release returns).
// The notices are read from the prefix's channel ({prefix}grants,
// keys.go) by a subscriber of the test's own, after a marker the test
// published once every call had queued, so the notices of the enqueues
// cannot be mistaken for them.
func TestWaitsReleasedInOneNotice(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.NewClient(t)
	const prefix, key, n = "waits", "hot", 40 // no character of prefix is escaped
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
		// Labelled, so that the release must remove the Waits' labels too.
		wctx := owner.NewLabeledContext(ctx, "wait-"+strconv.Itoa(i))
		go func() { waits <- ls[i%len(ls)].Wait(wctx, key) }()
		awaitQueue(t, admin, prefix, key, i+2, 10*time.Second)
	}
	granted := lockAsync(t, ctx, ls[1], key)
	awaitQueue(t, admin, prefix, key, n+2, 10*time.Second)
	queue, err := admin.ZRangeWithScores(ctx, redislock.QueueKey(prefix, key), 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(queue) != 2 {
		t.Fatalf("queue %v: want the holder and the Lock, the Waits apart", queue)
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
	for _, z := range []string{redislock.WaitsKey(prefix, key), strings.TrimSuffix(redislock.QueueKey(prefix, key), "q") + "l"} {
		if n, err := admin.Exists(ctx, z).Result(); err != nil || n != 0 {
			t.Errorf("EXISTS %s after the release: %d, %v; want the Waits and their labels removed by the release", z, n, err)
		}
	}
	lock := queue[1].Member.(string)
	want := []string{lock, "@" + strconv.FormatFloat(queue[1].Score, 'f', 0, 64) + " {" + prefix + "/" + key + "}"}
	got := []string{nextNotice(t, sub), nextNotice(t, sub)}
	if !slices.Equal(got, want) {
		t.Errorf("the release's notices are\n%q\nwant the Lock's entry and the Waits' bound\n%q", got, want)
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

// TestWaitIsABarrier: a Wait is a zero-length exclusive turn. A reader
// queued behind a Wait that waits behind a reader is not granted beside
// that reader, though it could share with it; a Wait cancelled there
// lets it in at once; and a Wait behind two readers returns only once
// both have released.
func TestWaitIsABarrier(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.NewClient(t)
	const prefix, key = "barrier", "k"
	ctx := context.Background()
	ls := []*redislock.Locker{newLocker(t, srv.NewClient(t), prefix), newLocker(t, srv.NewClient(t), prefix), newLocker(t, srv.NewClient(t), prefix)}
	r1, err := ls[0].RLock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waited := make(chan error, 1)
	go func() { waited <- ls[1].Wait(wctx, key) }()
	awaitQueue(t, admin, prefix, key, 2, 10*time.Second)
	r2c := make(chan keylock.Lease, 1)
	go func() {
		l, err := ls[2].RLock(ctx, key)
		if err != nil {
			t.Error(err)
		}
		r2c <- l
	}()
	awaitQueue(t, admin, prefix, key, 3, 10*time.Second)
	if l, err := ls[2].TryRLock(ctx, key); err == nil {
		l.Unlock(ctx)
		t.Fatal("TryRLock granted beside a reader with a Wait queued behind it")
	}
	// The reader behind the Wait is still queued: its Locker lists it so.
	calls, err := ls[0].Calls(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var modes []string
	for _, c := range calls {
		modes = append(modes, fmt.Sprintf("%s/%v", c.Mode, c.Held))
	}
	if want := []string{"shared/true", "wait/false", "shared/false"}; !slices.Equal(modes, want) {
		t.Fatalf("listing %v, want %v", modes, want)
	}
	cancel()
	if err := recvWithin(t, waited, 10*time.Second, "the cancelled Wait did not return"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Wait: %v, want context.Canceled", err)
	}
	r2 := awaitGrant(t, r2c, 10*time.Second, "the reader behind a cancelled Wait was not granted beside the first")
	go func() { waited <- ls[1].Wait(ctx, key) }()
	awaitQueue(t, admin, prefix, key, 3, 10*time.Second)
	if err := r1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	awaitQueue(t, admin, prefix, key, 2, 10*time.Second)
	if calls, err = ls[0].Calls(ctx, key); err != nil {
		t.Fatal(err)
	}
	modes = modes[:0]
	for _, c := range calls {
		modes = append(modes, fmt.Sprintf("%s/%v", c.Mode, c.Held))
	}
	if want := []string{"shared/true", "wait/false"}; !slices.Equal(modes, want) {
		t.Fatalf("listing %v once the first reader released, want %v", modes, want)
	}
	select {
	case err := <-waited:
		t.Fatalf("Wait returned (%v) while a reader queued before it held the key", err)
	default:
	}
	if err := r2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := recvWithin(t, waited, 10*time.Second, "the Wait behind two readers did not return once they released"); err != nil {
		t.Fatalf("Wait: %v", err)
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
