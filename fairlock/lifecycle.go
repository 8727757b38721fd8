package fairlock

import (
	"context"
	"fmt"
	"hash/maphash"
	"log/slog"
	"reflect"
	"runtime"
	"sync/atomic"
	"weak"

	"github.com/fairlock/fairlock/ctxerr"
)

// This file is a table's life: init makes and publishes it, the counts
// answer Locked, Waiters and Len and the observer's stats, and close ends
// it: every waiter decided closed, then a wait for the holders to leave.

// tables counts tables made, for default names.
var tables atomic.Int64

// init sets up t for keys of size units with opts. It registers t with
// package debug and its Observer last, once t is complete, since from
// then on other goroutines read it.
func (t *table[K]) init(k kind, size int64, opts []Option) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if cfg.name == "" {
		cfg.name = fmt.Sprintf("fairlock-%d", tables.Add(1))
	}
	if cfg.logger == nil {
		cfg.logger = slog.Default()
	}
	t.seed = maphash.MakeSeed()
	t.shards = make([]shard[K], cfg.shards)
	t.mask = uint64(cfg.shards - 1)
	t.size, t.kind = size, k
	t.name, t.logger = cfg.name, cfg.logger
	t.drained = make(chan struct{})
	if cfg.keyFormat != nil {
		f, ok := cfg.keyFormat.(func(K) string)
		if !ok {
			panic(fmt.Sprintf("fairlock: WithKeyFormatter given a %T for a %v of %v keys", cfg.keyFormat, k, reflect.TypeFor[K]()))
		}
		t.keyFormat = f
		t.renderAny = func(k any) string {
			if key, ok := k.(K); ok {
				return t.keyText(key)
			}
			return renderKey(k)
		}
	}
	// Without a formatter renderAny stays nil: keyText then renders a
	// string key itself, so that a long one is cut inside its quotes.
	if cfg.deadlocks {
		t.detector = newDetector[K](k == semaphoreKind)
	}
	t.timed = cfg.observer != nil || cfg.debug
	t.stacks = cfg.stacks
	// The deadlock detector needs no fast path of its own: it tracks only
	// awaited keys, and a waiter inflates a fast grant before it asks.
	for i := range t.shards {
		s := &t.shards[i]
		s.t, s.idx, s.books.size = t, uint32(i), size
		if t.timed {
			s.books.infos = infoFree{} // not nil: timed (no allocation)
			s.state.Store(slowBit)     // for good: see the fast path in shard.go
		}
	}
	refreshProcs()

	// Last: registration publishes t. Neither the registry, the watchdog
	// nor the observer's stats keep t reachable (weak pointers), so a
	// table dropped without Close is released by its cleanup.
	t.closer = &closer{}
	wt := weak.Make(t)
	if cfg.observer != nil {
		t.obs = cfg.observer.Register(t.name, func() Stats {
			if t := wt.Value(); t != nil {
				return t.stats()
			}
			return Stats{}
		})
		t.closer.obs = t.obs
	}
	if cfg.debug {
		startDebug(t, cfg)
		t.closer.dbg = t.dbg
	}
	if t.obs != nil || t.dbg != nil {
		runtime.AddCleanup(t, (*closer).release, t.closer)
	}
}

// locked reports whether key has a holder at this instant.
func (t *table[K]) locked(key K) bool {
	s, tag := t.shardOf(key)
	s.lock()
	e := s.find(key, tag)
	ok := e != nil && e.holding() > 0
	s.unlock()
	return ok
}

// waiters returns the number of calls queued on key at this instant.
func (t *table[K]) waiters(key K) int {
	s, tag := t.shardOf(key)
	s.lock()
	n := 0
	if e := s.find(key, tag); e != nil {
		n = e.waiters.Len()
	}
	s.unlock()
	return n
}

// stats sums the live counts over the shards.
func (t *table[K]) stats() Stats {
	var st Stats
	for i := range t.shards {
		s := &t.shards[i]
		s.lock()
		st.Keys += s.live
		st.Waiters += s.waiting
		s.unlock()
	}
	return st
}

// Len returns the number of live keys; see Locker.Len.
func (t *table[K]) Len() int { return t.stats().Keys }

// close implements Close for both faces.
func (t *table[K]) close(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if t.shards == nil {
		panic(notMade)
	}
	if t.closing.CompareAndSwap(false, true) {
		t.closeShards()
	}
	select {
	case <-t.drained:
		t.closer.release()
		return nil
	default:
	}
	select {
	case <-t.drained:
		t.closer.release()
		return nil
	case <-ctx.Done():
	}
	if t.settleRelease(closeGaveUp) {
		t.closer.release() // drained in the meantime
		return nil
	}
	return fmt.Errorf("fairlock: Close of %q: %s still held: %w", t.name, count(t.Len(), "key"), ctxerr.Of(ctx))
}

// closeShards marks every shard closed, decides every waiter closed and
// wakes them, and releases the table's registrations.
func (t *table[K]) closeShards() {
	t.draining.Store(1) // Close's own count, dropped after the walk
	var all decidedList
	for i := range t.shards {
		s := &t.shards[i]
		s.lock()
		s.closed = true
		for e := range s.entries() {
			// A key with waiters has holders, so settle removes no entry.
			for w := t.settle(s, e, change{decided: e.close()}); w != nil; {
				next := w.Value.next // add clears it
				all.add(w)
				w = next
			}
		}
		if s.live > 0 {
			t.draining.Add(1)
		}
		s.unlock()
	}
	signal(all.first)
	t.closer.stopWatchdog()
	t.shardDrained() // Close's own count
}
