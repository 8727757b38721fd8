package fairlock

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"
	"unsafe"

	"github.com/fairlock/fairlock/owner"
)

// mode describes a shard's state word for test messages and checks.
func mode[K comparable](s *shard[K]) string {
	st := s.state.Load()
	switch {
	case st&slowBit != 0:
		return "slow"
	case st&claimingBit != 0:
		return "claiming"
	case st&heldBit != 0:
		return "fast-held"
	default:
		return "fast-idle"
	}
}

func wantMode[K comparable](t *testing.T, s *shard[K], want, when string) {
	t.Helper()
	if got := mode(s); got != want {
		t.Fatalf("%s: shard is %s, want %s", when, got, want)
	}
}

// TestFastModeRoundTrip walks one shard through every transition of the
// fast path (see shard.go) and checks that it comes back to fast mode, and
// that grant tokens keep increasing across both modes: a shard stuck
// in slow mode would pass every functional test and lose the fast path.
func TestFastModeRoundTrip(t *testing.T) {
	for name, opts := range map[string][]Option{
		"plain":              nil,
		"deadlock-detection": {WithDeadlockDetection()},
	} {
		t.Run(name, func(t *testing.T) { fastModeRoundTrip(t, New[string](append(opts, WithShards(1))...)) })
	}
}

func fastModeRoundTrip(t *testing.T, l *Locker[string]) {
	ctx := context.Background()
	s := &l.t.shards[0]
	wantMode(t, s, "fast-idle", "new Locker")

	var tokens []uint64
	lock := func(key, wantAfter string) Guard[string] {
		t.Helper()
		g, err := l.Lock(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, g.token)
		wantMode(t, s, wantAfter, "Lock("+key+")")
		return g
	}

	a := lock("a", "fast-held")
	if s.fastKey != "a" || s.fastOwner != owner.Goroutine() {
		t.Fatalf("fast holder published as %q/%v, want a/%v", s.fastKey, s.fastOwner, owner.Goroutine())
	}
	if !l.Locked("a") { // inflates the fast grant into an entry
		t.Fatal("Locked(a) = false for a fast grant")
	}
	wantMode(t, s, "slow", "Locked(a)")
	if s.live != 1 || s.fastKey != "" {
		t.Fatalf("after inflate: live = %d, fastKey = %q; want 1 and no key kept", s.live, s.fastKey)
	}
	a.Unlock()
	wantMode(t, s, "fast-idle", "Unlock of an inflated grant")

	a = lock("a", "fast-held")
	b := lock("b", "slow") // a second key on the shard
	if s.live != 2 {
		t.Fatalf("live = %d, want 2", s.live)
	}
	a.Unlock()
	wantMode(t, s, "slow", "one of two keys unlocked")
	b.Unlock()
	wantMode(t, s, "fast-idle", "both keys unlocked")

	if _, err := l.TryLock(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	wantMode(t, s, "fast-held", "TryLock(c)")
	if _, err := l.TryLock(ctx, "c"); !errors.Is(err, ErrReentrant) {
		t.Fatalf("TryLock of own fast grant: %v, want ErrReentrant", err)
	}
	wantMode(t, s, "slow", "refused TryLock")

	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("grant tokens %v do not increase", tokens)
		}
	}
	if got := s.books.token; got <= tokens[len(tokens)-1] {
		t.Fatalf("shard token %d is behind the last grant %d", got, tokens[len(tokens)-1])
	}
}

type nopObserver struct{}

func (nopObserver) Register(string, func() Stats) LockerObserver { return nopObserver{} }
func (nopObserver) Acquire(Result, time.Duration)                {}
func (nopObserver) Release(time.Duration)                        {}
func (nopObserver) Unregister()                                  {}

// TestSlowModeForGood: Lockers that need more than a holder's key and
// owner (debug, observer) never take the fast path, and Close ends it for
// every Locker.
func TestSlowModeForGood(t *testing.T) {
	ctx := context.Background()
	for name, opts := range map[string][]Option{
		"debug":    {WithDebug()},
		"observer": {WithObserver(nopObserver{})},
		"closed":   nil,
	} {
		l := New[string](append(opts, WithShards(1))...)
		s := &l.t.shards[0]
		if name == "closed" {
			if err := l.Close(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := l.Lock(ctx, "k"); !errors.Is(err, ErrClosed) {
				t.Fatalf("Lock after Close: %v", err)
			}
		} else {
			g, err := l.Lock(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			g.Unlock()
		}
		wantMode(t, s, "slow", name)
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLockManyNoKeysLeavesFastGrant: a LockMany of no keys asks only
// whether Close has begun, so it leaves a fast grant on shard 0 in fast
// mode instead of inflating it as a look under the shard mutex would; once
// Close has begun it fails with ErrClosed.
func TestLockManyNoKeysLeavesFastGrant(t *testing.T) {
	ctx := context.Background()
	l := New[string](WithShards(1))
	s := &l.t.shards[0]
	g, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	wantMode(t, s, "fast-held", "Lock(k)")
	if _, err := LockMany(ctx, l); err != nil {
		t.Fatalf("LockMany with no keys on an open Locker: %v", err)
	}
	wantMode(t, s, "fast-held", "LockMany with no keys")
	g.Unlock()
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := LockMany(ctx, l); !errors.Is(err, ErrClosed) {
		t.Fatalf("LockMany with no keys after Close: %v, want ErrClosed", err)
	}
}

// TestMutexSideWaitsForClaim: a mutex-side operation that finds a fast
// claim between its CAS and its publishing Store waits for the Store, then
// sees the claim's key and owner. The claim is staged by hand.
func TestMutexSideWaitsForClaim(t *testing.T) {
	l := New[string](WithShards(1))
	s := &l.t.shards[0]
	const token = 7
	s.state.Store(token<<tokenShift | heldBit | claimingBit)

	waiting := make(chan struct{}, 1)
	testHookClaimWait = func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}
	defer func() { testHookClaimWait = nil }()
	locked := make(chan bool)
	go func() { locked <- l.Locked("k") }()
	select {
	case <-waiting: // Locked is yielding to the claim
	case got := <-locked:
		t.Fatalf("Locked(k) = %v returned while the claim was unpublished", got)
	}

	s.fastKey, s.fastTag, s.fastOwner = "k", l.t.tagOf("k"), owner.Goroutine()
	s.state.Store(token<<tokenShift | heldBit)
	if !<-locked {
		t.Fatal("Locked(k) = false once the claim was published")
	}
	g := Guard[string]{s: s, token: token, key: "k"} // the claimant's Guard
	g.Unlock()
	if l.Locked("k") || l.Len() != 0 {
		t.Fatalf("after the claimant's Unlock: Locked = %v, Len = %d", l.Locked("k"), l.Len())
	}
	wantMode(t, s, "fast-idle", "after the claimant's Unlock")
}

// TestEntrySize: a held string key's entry fits Go's 80-byte size class;
// debug and observer bookkeeping hang off it (holdInfo) instead of
// widening every entry to the 128-byte class.
func TestEntrySize(t *testing.T) {
	if got := unsafe.Sizeof(entry[string]{}); got > 80 {
		t.Fatalf("entry[string] is %d bytes, want at most 80", got)
	}
}

// TestWithShardsRoundsUpAndCaps: WithShards rounds n up to a power of two
// and caps it at maxShards, whatever n is: WithShards(1<<40) must not make
// New panic in makeslice, nor a count above 1<<62 make the rounding loop
// overflow to zero and spin forever.
func TestWithShardsRoundsUpAndCaps(t *testing.T) {
	for _, c := range []struct{ n, want int }{
		{0, defaultShards()}, {-5, defaultShards()},
		{1, 1}, {3, 4}, {64, 64}, {65, 128},
		{maxShards, maxShards}, {maxShards + 1, maxShards},
		{1 << 40, maxShards}, {1<<62 + 1, maxShards}, {math.MaxInt, maxShards},
	} {
		l := New[string](WithShards(c.n))
		if got := len(l.t.shards); got != c.want {
			t.Errorf("WithShards(%d): %d shards, want %d", c.n, got, c.want)
		}
		g, err := l.Lock(context.Background(), "k")
		if err != nil {
			t.Fatalf("WithShards(%d): Lock: %v", c.n, err)
		}
		g.Unlock()
		if err := l.Close(context.Background()); err != nil {
			t.Fatalf("WithShards(%d): Close: %v", c.n, err)
		}
	}
}

// TestShardSize keeps WithShards' documented cost per shard true. The
// comment gives the size on 64-bit platforms, so only they check it.
func TestShardSize(t *testing.T) {
	if got := unsafe.Sizeof(shard[string]{}); unsafe.Sizeof(uintptr(0)) == 8 && got != 376 {
		t.Fatalf("shard[string] is %d bytes; WithShards' comment says 376", got)
	}
}
