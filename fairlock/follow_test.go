package fairlock

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/fairlock/fairlock/owner"
)

// nextChange returns f's next change, failing t after 10 s.
func nextChange[K comparable](t *testing.T, f *Feed[K]) KeyChange {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := f.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return c
}

// tokens returns the tokens of c's holders.
func tokens(c KeyChange) []uint64 {
	var out []uint64
	for _, h := range c.Holders {
		out = append(out, h.Token)
	}
	return out
}

// wantHolders fails t unless c, without a gap, has holders with exactly
// tokens want.
func wantHolders(t *testing.T, c KeyChange, want ...uint64) {
	t.Helper()
	if got := tokens(c); c.Gap || !slices.Equal(got, want) {
		t.Fatalf("change: holders %v, gap %v; want %v, no gap", got, c.Gap, want)
	}
}

// TestFollowReportsEveryChange: a Feed reports the holders when it began,
// then every grant and release in order (a hand-over to a waiter as one
// change, with no vacancy between), and no change for a call that only
// queues or leaves the queue; the fast path a fast grant took before
// Follow shows in its first change.
func TestFollowReportsEveryChange(t *testing.T) {
	l := New[string]()
	defer l.Close(context.Background())
	ctx := owner.NewLabeledContext(context.Background(), "first")
	g1, err := l.Lock(ctx, "k") // a fast grant: the shard is idle
	if err != nil {
		t.Fatal(err)
	}
	f, err := l.Follow("k")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	c := nextChange(t, f)
	wantHolders(t, c, g1.Token())
	if h := c.Holders[0]; h.Label != "first" || h.Mode != "exclusive" || !h.Held {
		t.Fatalf("first holder: %+v", h)
	}
	// A waiter that leaves the queue changes no holder.
	cctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() { _, err := l.Lock(cctx, "k"); left <- err }()
	waitFor(t, func() bool { return l.Waiters("k") == 1 })
	cancel()
	if err := <-left; err == nil {
		t.Fatal("the cancelled Lock was granted")
	}
	got := make(chan Guard[string], 1)
	go func() {
		g, err := l.Lock(owner.NewLabeledContext(context.Background(), "second"), "k")
		if err != nil {
			t.Error(err)
		}
		got <- g
	}()
	waitFor(t, func() bool { return l.Waiters("k") == 1 })
	g1.Unlock()
	g2 := <-got
	c = nextChange(t, f)
	wantHolders(t, c, g2.Token()) // the hand-over, with no vacancy first
	if c.Holders[0].Label != "second" || c.At.IsZero() {
		t.Fatalf("after the hand-over: %+v", c)
	}
	g2.Unlock()
	wantHolders(t, nextChange(t, f))
	r1, _ := l.RLock(context.Background(), "k")
	r2, _ := l.RLock(owner.NewContext(context.Background()), "k")
	wantHolders(t, nextChange(t, f), r1.Token())
	wantHolders(t, nextChange(t, f), r1.Token(), r2.Token())
	r1.Unlock()
	wantHolders(t, nextChange(t, f), r2.Token())
	r2.Unlock()
	wantHolders(t, nextChange(t, f))
}

// waitFor polls cond until it holds, failing t after 10 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFollowGapAfterOverflow: a reader that leaves more than the
// buffer's worth of changes untaken gets one change with Gap set and the
// holders now, then every change again.
func TestFollowGapAfterOverflow(t *testing.T) {
	l := New[string]()
	defer l.Close(context.Background())
	f, _ := l.Follow("k")
	defer f.Stop()
	ctx := context.Background()
	for range feedBuffer {
		g, _ := l.Lock(ctx, "k")
		g.Unlock()
	}
	held, _ := l.Lock(ctx, "k")
	c := nextChange(t, f)
	if !c.Gap || !slices.Equal(tokens(c), []uint64{held.Token()}) {
		t.Fatalf("after an overflow: holders %v, gap %v; want [%d] and a gap", tokens(c), c.Gap, held.Token())
	}
	held.Unlock()
	wantHolders(t, nextChange(t, f))
}

// TestFollowKeepsShardSlow: a followed key's shard stays in slow mode,
// so that no grant there escapes the mutex and the Feed, and goes back to
// the fast path once the Feed stops; a stopped Feed's Next returns
// ErrClosed.
func TestFollowKeepsShardSlow(t *testing.T) {
	l := New[string](WithShards(1))
	defer l.Close(context.Background())
	s := &l.t.shards[0]
	f, _ := l.Follow("k")
	ctx := context.Background()
	g, _ := l.Lock(ctx, "other")
	g.Unlock()
	wantMode(t, s, "slow", "followed, idle")
	f.Stop()
	f.Stop() // idempotent
	if _, err := f.Next(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Stop: %v, want ErrClosed", err)
	}
	g, _ = l.Lock(ctx, "k")
	g.Unlock()
	wantMode(t, s, "fast-idle", "after Stop")
	g, _ = l.Lock(ctx, "k")
	wantMode(t, s, "fast-held", "a grant after Stop")
	g.Unlock()
}

// TestFollowSemaphoreUnits: a Semaphore's Feed reports each holder's
// units; two Feeds of one key each get every change.
func TestFollowSemaphoreUnits(t *testing.T) {
	s := NewSemaphore[string](3)
	defer s.Close(context.Background())
	f1, _ := s.Follow("k")
	f2, _ := s.Follow("k")
	defer f1.Stop()
	defer f2.Stop()
	g, _ := s.Acquire(context.Background(), "k", 2)
	for _, f := range []*Feed[string]{f1, f2} {
		wantHolders(t, nextChange(t, f))
		c := nextChange(t, f)
		wantHolders(t, c, g.Token())
		if c.Holders[0].Units != 2 || c.Holders[0].Mode != "units" {
			t.Fatalf("holder: %+v", c.Holders[0])
		}
	}
	g.Unlock()
}

// TestFollowRefusesNaN: a key not equal to itself cannot be followed.
func TestFollowRefusesNaN(t *testing.T) {
	l := New[float64]()
	defer l.Close(context.Background())
	if _, err := l.Follow(math.NaN()); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("Follow(NaN): %v, want ErrInvalidKey", err)
	}
}
