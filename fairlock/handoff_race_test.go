package fairlock

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fairlock/fairlock/owner"
)

// checkBooks fails if any shard of t still counts a live key, a waiter or
// an owner index, or t's deadlock detector still has an edge: what a
// grant that was released twice, or released under a stale owner, would
// leave behind.
func checkBooks[K comparable](tb testing.TB, t *table[K]) {
	tb.Helper()
	for i := range t.shards {
		s := &t.shards[i]
		s.lock()
		live, waiting, owners := s.live, s.waiting, len(s.owners)
		s.unlock()
		if live != 0 || waiting != 0 || owners != 0 {
			tb.Fatalf("shard %d: live %d, waiting %d, owner indexes %d after all work", i, live, waiting, owners)
		}
	}
	if d := t.detector; d != nil {
		d.mu.Lock()
		h, w := len(d.holders), len(d.waits)
		d.mu.Unlock()
		if h != 0 || w != 0 {
			tb.Fatalf("detector: %d awaited keys, %d waiting owners after all work", h, w)
		}
	}
}

// TestHandOffRacesUnlock: HandOff of a grant races two Unlocks of it (the
// Guard and a copy), on the lock-free path (plain), on an awaited key the
// detector tracks, and on a timed table; every other round a waiter of
// another flow queues first. Exactly one Unlock releases, a HandOff after
// an Unlock has returned reports false, no two holders overlap, and the
// books (live keys, waiters, owner indexes, the wait-for graph) end empty.
func TestHandOffRacesUnlock(t *testing.T) {
	const rounds = 500
	for name, opts := range map[string][]Option{
		"plain":    nil,
		"detector": {WithDeadlockDetection()},
		"debug":    {WithDebug()},
	} {
		t.Run(name, func(t *testing.T) {
			l := New[int](append(opts, WithShards(1))...)
			defer l.Close(context.Background())
			var inside atomic.Int32
			var wg sync.WaitGroup
			for round := range rounds {
				key := round % 3
				ctx := owner.NewContext(context.Background())
				g, err := l.Lock(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				if inside.Add(1) != 1 {
					t.Fatal("two holders of one key")
				}
				var waiter chan error
				if round%2 == 0 {
					waiter = make(chan error, 1)
					go func() {
						g2, err := l.Lock(owner.NewContext(context.Background()), key)
						if err == nil {
							if inside.Add(1) != 1 {
								t.Error("two holders of one key")
							}
							inside.Add(-1)
							g2.Unlock()
						}
						waiter <- err
					}()
					for l.Waiters(key) != 1 {
						runtime.Gosched()
					}
				}
				to := owner.Of(owner.NewContext(context.Background()))
				inside.Add(-1) // either Unlock below may be the release
				wg.Add(3)
				go func() { defer wg.Done(); g.HandOff(to) }()
				go func() { defer wg.Done(); g.Unlock() }()
				go func() {
					defer wg.Done()
					g.Unlock()
					if g.HandOff(owner.Of(ctx)) {
						t.Error("HandOff after an Unlock of the grant returned reported true")
					}
				}()
				wg.Wait()
				if waiter != nil {
					if err := <-waiter; err != nil {
						t.Fatal(err)
					}
				}
			}
			checkBooks(t, &l.t)
			if n := l.t.doubleUnlocks.Load(); n != rounds {
				t.Fatalf("%d double unlocks counted, want one a round", n)
			}
		})
	}
}

// TestHandOffAmongIndexedReadersAndDetector: many readers (an owner
// index), a writer waiting (a tracked key), half the shared holds handed
// to one owner; once all are released the index and the wait-for graph
// are gone.
func TestHandOffAmongIndexedReadersAndDetector(t *testing.T) {
	l := New[string](WithDeadlockDetection(), WithShards(1))
	defer l.Close(context.Background())
	var guards []Guard[string]
	for range indexAt + 8 { // the last reader's reentrancy check builds the index
		g, err := l.RLock(owner.NewContext(context.Background()), "k")
		if err != nil {
			t.Fatal(err)
		}
		guards = append(guards, g)
	}
	w := make(chan error, 1)
	go func() {
		g, err := l.Lock(owner.NewContext(context.Background()), "k")
		if err == nil {
			g.Unlock()
		}
		w <- err
	}()
	for l.Waiters("k") != 1 {
		runtime.Gosched()
	}
	shared := owner.NewContext(context.Background())
	for i, g := range guards {
		if i%2 == 0 && !g.HandOff(owner.Of(shared)) {
			t.Fatal("HandOff of a current shared grant reported false")
		}
	}
	if _, err := l.TryRLock(shared, "k"); !errors.Is(err, ErrReentrant) {
		t.Fatalf("TryRLock by the owner handed many holds: %v; want ErrReentrant", err)
	}
	for _, g := range guards {
		g.Unlock()
	}
	if err := <-w; err != nil {
		t.Fatal(err)
	}
	checkBooks(t, &l.t)
}
