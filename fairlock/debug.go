package fairlock

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fairlock/fairlock/internal/registry"
)

// debugState is a Locker's debug-mode machinery: its registration with
// package debug and its long-held watchdog.
type debugState struct {
	stacks     bool
	longHeld   time.Duration // 0: no watchdog
	name       string        // the name package debug registered; set before the watchdog starts
	unregister func()
	quit       chan struct{} // closed by stop
	done       sync.WaitGroup
	stopOnce   sync.Once
}

// startDebug sets l.dbg, registers l with package debug and starts its
// watchdog. l must be complete otherwise: a dump may read it at once.
func (l *Locker[K]) startDebug(cfg config) {
	d := &debugState{stacks: cfg.stacks, longHeld: max(cfg.longHeld, 0), quit: make(chan struct{})}
	l.dbg = d
	d.name, d.unregister = registry.Register(l.name, debugSource[K]{l})
	if d.longHeld > 0 {
		d.done.Add(1)
		go l.watch(d)
	}
}

// stop unregisters the Locker and waits for the watchdog to exit.
func (d *debugState) stop() {
	d.stopOnce.Do(func() {
		d.unregister()
		close(d.quit)
		d.done.Wait()
	})
}

// debugSource adapts a Locker to registry.Source.
type debugSource[K comparable] struct{ l *Locker[K] }

// rawKey is one live key as read under its shard mutex: the key itself,
// not yet rendered (rendering may run user code, which must not run under
// a shard mutex), with its holder and waiters.
type rawKey[K comparable] struct {
	key   K
	state registry.KeyState
}

// DebugState reads the Locker shard by shard. Each shard's clock is read
// under its mutex, after every grant it shows was recorded, so no age is
// negative. Keys are rendered after all shard mutexes are released, and
// only the limit longest held are.
func (src debugSource[K]) DebugState(limit int) registry.LockerState {
	l := src.l
	st := registry.LockerState{
		Kind:          "Locker",
		LongHeld:      l.dbg.longHeld,
		DoubleUnlocks: l.doubleUnlocks.Load(),
		Reentrant:     l.reentrant.Load(),
	}
	if l.detector != nil {
		st.DeadlocksRefused = l.detector.refused.Load()
	}
	long := func(d time.Duration) bool { return l.dbg.longHeld > 0 && d > l.dbg.longHeld }
	var raw []rawKey[K]
	for i := range l.shards {
		s := &l.shards[i]
		s.lock()
		now := time.Now()
		st.Keys += s.live
		st.Waiters += s.waiting
		for e := range s.entries() {
			held := now.Sub(e.hold.grantedAt)
			k := registry.KeyState{
				Mode:     registry.Exclusive,
				HeldFor:  held,
				LongHeld: long(held),
				Holders: []registry.HolderState{{
					Owner: e.holder.String(), Token: e.gen, Since: e.hold.grantedAt,
					For: held, LongHeld: long(held), Stack: frames(e.hold.stack),
				}},
				Waiters: make([]registry.WaiterState, 0, e.waiters.Len()),
			}
			for w := range e.waiters.All() {
				age := now.Sub(w.Value.since)
				k.Waiters = append(k.Waiters, registry.WaiterState{
					Owner: w.Value.owner.String(), Mode: registry.Exclusive, Since: w.Value.since,
					For: age, LongWait: long(age), Stack: frames(w.Value.stack),
				})
			}
			raw = append(raw, rawKey[K]{e.key, k})
		}
		s.unlock()
	}
	st.Time = time.Now()
	// Keep the limit longest held before rendering: rendering is the cost.
	slices.SortStableFunc(raw, func(a, b rawKey[K]) int { return cmp.Compare(b.state.HeldFor, a.state.HeldFor) })
	if limit > 0 && len(raw) > limit {
		raw = raw[:limit]
	}
	st.Held = make([]registry.KeyState, len(raw))
	for i, r := range raw {
		st.Held[i] = r.state
		st.Held[i].Key = l.keyText(r.key)
	}
	st.Held, _ = registry.Keep(st.Held, 0)
	st.Omitted = st.Keys - len(st.Held)
	return st
}

// frames formats a recorded stack as "function file:line" lines.
func frames(pcs []uintptr) []string {
	if len(pcs) == 0 {
		return nil
	}
	var out []string
	fs := runtime.CallersFrames(pcs)
	for {
		f, more := fs.Next()
		out = append(out, fmt.Sprintf("%s %s:%d", f.Function, f.File, f.Line))
		if !more {
			return out
		}
	}
}

// warning is one long-held or long-wait report, built under a shard mutex
// and rendered and logged after it is released.
type warning[K comparable] struct {
	msg    string
	key    K
	owner  string
	age    time.Duration
	holder string // for a long wait: who holds the key
	stack  []uintptr
}

// watch is the watchdog goroutine: every period it warns about holders and
// waiters that passed longHeld, 2·longHeld, 4·longHeld… since their grant
// or arrival. It exits when d.quit is closed.
func (l *Locker[K]) watch(d *debugState) {
	defer d.done.Done()
	period := min(max(d.longHeld/4, time.Millisecond), time.Second)
	t := time.NewTicker(period)
	defer t.Stop()
	var warnings []warning[K]
	for {
		select {
		case <-d.quit:
			return
		case now := <-t.C:
			warnings = l.overdue(now, d.longHeld, warnings[:0])
			for _, w := range warnings {
				args := []any{"locker", d.name, "key", l.keyText(w.key)}
				if w.holder == "" {
					args = append(args, "holder", w.owner, "held_for", w.age)
				} else {
					args = append(args, "waiter", w.owner, "waited", w.age, "holder", w.holder)
				}
				if len(w.stack) > 0 {
					args = append(args, "stack", strings.Join(frames(w.stack), "\n"))
				}
				l.logger.Warn(w.msg, args...)
			}
		}
	}
}

// overdue collects the warnings due at now, marking each as given.
func (l *Locker[K]) overdue(now time.Time, limit time.Duration, out []warning[K]) []warning[K] {
	due := func(age time.Duration, warned *uint) bool {
		// The n'th warning is due at limit<<(n-1); skip past thresholds a
		// slow tick missed so one tick gives at most one warning.
		if *warned >= 62 || age <= limit<<*warned {
			return false
		}
		for *warned < 62 && age > limit<<*warned {
			*warned++
		}
		return true
	}
	for i := range l.shards {
		s := &l.shards[i]
		s.lock()
		for e := range s.entries() {
			if age := now.Sub(e.hold.grantedAt); due(age, &e.hold.warned) {
				out = append(out, warning[K]{msg: "fairlock: lock held too long", key: e.key, owner: e.holder.String(), age: age, stack: e.hold.stack})
			}
			for w := range e.waiters.All() {
				if age := now.Sub(w.Value.since); due(age, &w.Value.warned) {
					out = append(out, warning[K]{msg: "fairlock: waiting too long", key: e.key, owner: w.Value.owner.String(), age: age, holder: e.holder.String(), stack: w.Value.stack})
				}
			}
		}
		s.unlock()
	}
	return out
}
