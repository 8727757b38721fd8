package disttest

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
)

// Observer is a fairlock.Observer for tests: it counts what the Lockers
// it is given to report (meant for one). Its zero value is ready; it is
// safe for concurrent use.
type Observer struct {
	mu           sync.Mutex // protects the fields below
	results      map[fairlock.Result]int
	released     int
	late         int // Releases heard after Unregister
	unregistered bool
	stats        func() fairlock.Stats
}

// Register records stats and returns o.
func (o *Observer) Register(_ string, stats func() fairlock.Stats) fairlock.LockerObserver {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stats = stats
	return o
}

// Acquire counts r.
func (o *Observer) Acquire(r fairlock.Result, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.results == nil {
		o.results = map[fairlock.Result]int{}
	}
	o.results[r]++
}

// Release counts a release, and one heard after Unregister apart.
func (o *Observer) Release(time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.released++
	if o.unregistered {
		o.late++
	}
}

// Unregister records that it was called.
func (o *Observer) Unregister() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.unregistered = true
}

// Count returns how many calls reported r.
func (o *Observer) Count(r fairlock.Result) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.results[r]
}

// Released returns how many releases were reported, and how many of
// them after Unregister.
func (o *Observer) Released() (all, late int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.released, o.late
}

// Unregistered reports whether Unregister was called.
func (o *Observer) Unregistered() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.unregistered
}

// Stats returns the live counts through the function Register was given
// (the zero Stats before Register).
func (o *Observer) Stats() fairlock.Stats {
	o.mu.Lock()
	f := o.stats
	o.mu.Unlock()
	if f == nil {
		return fairlock.Stats{}
	}
	return f()
}

// debugAndObserver: a Locker made WithDebug lists its holder (with its
// token) and its waiter, each in its mode, under its name and kind
// (Backend.Kind); WithObserver counts grants, releases and reentrant
// calls and shows the live counts; Close with a grant still held and a
// short context reports it, unregisters both, and ends that grant: its
// entry is gone, its Lost closed, its Unlock returns ErrLost, and the
// observer hears no release after Unregister. It uses Backend.Observed.
func debugAndObserver(t *testing.T, b Backend) {
	const prefix, key, name = "dbg", "k\n1", "disttest-dbg"
	obs := &Observer{}
	l, ok := b.Observed(t, prefix, name, obs).(keylock.RWLocker)
	if !ok {
		t.Fatal("disttest: Backend.Observed's Locker is not a keylock.RWLocker")
	}
	ctx := context.Background()
	g, err := l.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		w, err := l.RLock(owner.NewContext(ctx), key)
		if err == nil {
			err = w.Unlock(ctx)
		}
		done <- err
	}()
	b.AwaitCalls(t, prefix, key, 2, 10*time.Second)
	st := registry.Snapshot(name, 0)
	if len(st) != 1 || st[0].Kind != b.Kind || len(st[0].Held) != 1 {
		t.Fatalf("snapshot: %+v, want one %s holding one key", st, b.Kind)
	}
	k := st[0].Held[0]
	if k.Key != `"k\n1"` || k.Mode != registry.Exclusive || len(k.Holders) != 1 || k.Holders[0].Token != g.Token() ||
		len(k.Waiters) != 1 || k.Waiters[0].Mode != registry.Shared {
		t.Fatalf("key state: %+v", k)
	}
	if s := obs.Stats(); s.Keys != 1 || s.Waiters != 1 {
		t.Fatalf("observer stats %+v, want 1 key and 1 waiter", s)
	}
	mustUnlock(t, g)
	if err := <-done; err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	if g, err = l.TryLock(ctx, key); err != nil {
		t.Fatal(err)
	}
	mustUnlock(t, g)
	last, err := l.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Lock(ctx, key); !errors.Is(err, fairlock.ErrReentrant) {
		t.Fatalf("a second Lock by the holder: %v, want ErrReentrant", err)
	}
	acq, reent := obs.Count(fairlock.Acquired), obs.Count(fairlock.Reentrant)
	if rel, _ := obs.Released(); acq != 4 || rel != 3 || reent != 1 {
		t.Fatalf("observer: %d acquired, %d released, %d reentrant; want 4, 3, 1", acq, rel, reent)
	}
	// The last grant is left held: Close ends it and, with a short ctx,
	// reports it.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := l.Close(cctx); err == nil || !strings.Contains(err.Error(), "1 grant still held") {
		t.Fatalf("Close with a holder: %v", err)
	}
	if !obs.Unregistered() || len(registry.Snapshot(name, 0)) != 0 {
		t.Fatal("Close did not unregister")
	}
	if n := b.Calls(t, prefix, key); n != 0 {
		t.Fatalf("%d calls left on the key after Close", n)
	}
	if !isClosed(last.Lost()) {
		t.Fatal("the grant Close ended is not Lost")
	}
	if err := last.Unlock(ctx); !errors.Is(err, fairlock.ErrLost) {
		t.Fatalf("Unlock after Close: %v, want ErrLost", err)
	}
	if rel, late := obs.Released(); rel != 3 || late != 0 {
		t.Fatalf("the observer heard %d releases, %d after Unregister; want still 3, none after", rel, late)
	}
}
