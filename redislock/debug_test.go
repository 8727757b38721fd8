package redislock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
)

// TestDebugAndObserver: WithDebug lists this process's holder (with its
// token) and waiters; WithObserver counts results and the live gauges;
// Close unregisters both, and the grant it ended reports ErrLost.
func TestDebugAndObserver(t *testing.T) {
	c := redistest.Start(t)
	obs := &countingObserver{}
	l := newLocker(t, c, "dbg", redislock.WithDebug(), redislock.WithName("redis-dbg-test"), redislock.WithObserver(obs))
	ctx := context.Background()
	g, err := l.Lock(ctx, "k\n1")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w, err := l.RLock(owner.NewContext(ctx), "k\n1")
		if err == nil {
			err = w.Unlock(ctx)
		}
		if err != nil {
			t.Error(err)
		}
	}()
	awaitQueue(t, c, "dbg", "k\n1", 2, 10*time.Second)
	st := registry.Snapshot("redis-dbg-test", 0)
	if len(st) != 1 || st[0].Kind != "redislock.Locker" || len(st[0].Held) != 1 {
		t.Fatalf("snapshot: %+v", st)
	}
	k := st[0].Held[0]
	if k.Key != `"k\n1"` || k.Mode != registry.Exclusive || len(k.Holders) != 1 || k.Holders[0].Token != g.Token() ||
		len(k.Waiters) != 1 || k.Waiters[0].Mode != registry.Shared {
		t.Fatalf("key state: %+v", k)
	}
	if s := obs.stats(); s.Keys != 1 || s.Waiters != 1 {
		t.Fatalf("observer stats %+v", s)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	<-done
	last, err := l.Lock(ctx, "k\n1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Lock(ctx, "k\n1"); !errors.Is(err, fairlock.ErrReentrant) {
		t.Fatal(err)
	}
	obs.mu.Lock()
	acq, rel, reent := obs.acquired, obs.released, obs.reentrant
	obs.mu.Unlock()
	if acq != 3 || rel != 2 || reent != 1 {
		t.Fatalf("observer: %d acquired, %d released, %d reentrant; want 3, 2, 1", acq, rel, reent)
	}
	// The last grant is left held: Close removes it and, with a short
	// ctx, reports it.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := l.Close(cctx); err == nil || !strings.Contains(err.Error(), "1 grant still held") {
		t.Fatalf("Close with a holder: %v", err)
	}
	if !obs.unregistered || len(registry.Snapshot("redis-dbg-test", 0)) != 0 {
		t.Fatal("Close did not unregister")
	}
	if n := queueLen(t, c, "dbg", "k\n1"); n != 0 {
		t.Fatalf("%d entries left after Close", n)
	}
	if !isClosed(last.Lost()) {
		t.Fatal("the grant Close ended is not Lost")
	}
	if err := last.Unlock(ctx); !errors.Is(err, redislock.ErrLost) {
		t.Fatalf("Unlock after Close: %v, want ErrLost", err)
	}
	obs.mu.Lock()
	late := obs.late
	obs.mu.Unlock()
	if late != 0 {
		t.Fatalf("the observer heard %d releases after Close", late)
	}
}

// countingObserver counts what a Locker reports.
type countingObserver struct {
	mu                            sync.Mutex
	acquired, released, reentrant int
	statsFn                       func() fairlock.Stats
	unregistered                  bool
	late                          int // Releases heard after Unregister
}

func (o *countingObserver) stats() fairlock.Stats {
	o.mu.Lock()
	f := o.statsFn
	o.mu.Unlock()
	return f()
}

func (o *countingObserver) Register(_ string, stats func() fairlock.Stats) fairlock.LockerObserver {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.statsFn = stats
	return o
}

func (o *countingObserver) Acquire(r fairlock.Result, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch r {
	case fairlock.Acquired:
		o.acquired++
	case fairlock.Reentrant:
		o.reentrant++
	}
}

func (o *countingObserver) Release(time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.released++
	if o.unregistered {
		o.late++
	}
}

func (o *countingObserver) Unregister() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.unregistered = true
}
