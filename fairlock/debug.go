package fairlock

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/fairlock/fairlock/debug"
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
	d.name, d.unregister = debug.Register(l.name, debugSource[K]{l})
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

// debugSource adapts a Locker to debug.Source.
type debugSource[K comparable] struct{ l *Locker[K] }

// DebugState reads the Locker shard by shard. The registry fills in the
// name.
func (src debugSource[K]) DebugState(now time.Time) debug.LockerState {
	l := src.l
	st := debug.LockerState{
		Time:          now,
		LongHeld:      l.dbg.longHeld,
		DoubleUnlocks: l.doubleUnlocks.Load(),
		Reentrant:     l.reentrant.Load(),
	}
	if l.detector != nil {
		st.DeadlocksRefused = l.detector.refused.Load()
	}
	long := func(d time.Duration) bool { return l.dbg.longHeld > 0 && d > l.dbg.longHeld }
	for i := range l.shards {
		s := &l.shards[i]
		s.lock()
		st.Keys += s.live
		st.Waiters += s.waiting
		for e := range s.entries() {
			k := debug.KeyState{
				Key:       formatKey(e.key),
				Holder:    e.holder.String(),
				HeldSince: e.hold.grantedAt,
				HeldFor:   now.Sub(e.hold.grantedAt),
				Stack:     frames(e.hold.stack),
				Waiters:   make([]debug.WaiterState, 0, e.waiters.Len()),
			}
			k.LongHeld = long(k.HeldFor)
			for w := range e.waiters.All() {
				ws := debug.WaiterState{
					Owner:   w.Value.owner.String(),
					Since:   w.Value.since,
					WaitFor: now.Sub(w.Value.since),
					Stack:   frames(w.Value.stack),
				}
				ws.LongWait = long(ws.WaitFor)
				k.Waiters = append(k.Waiters, ws)
			}
			st.Held = append(st.Held, k)
		}
		s.unlock()
	}
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
// and logged after it is released.
type warning struct {
	msg    string
	key    string
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
	var warnings []warning
	for {
		select {
		case <-d.quit:
			return
		case now := <-t.C:
			warnings = l.overdue(now, d.longHeld, warnings[:0])
			for _, w := range warnings {
				args := []any{"locker", d.name, "key", w.key}
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
func (l *Locker[K]) overdue(now time.Time, limit time.Duration, out []warning) []warning {
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
				out = append(out, warning{msg: "fairlock: lock held too long", key: formatKey(e.key), owner: e.holder.String(), age: age, stack: e.hold.stack})
			}
			for w := range e.waiters.All() {
				if age := now.Sub(w.Value.since); due(age, &w.Value.warned) {
					out = append(out, warning{msg: "fairlock: waiting too long", key: formatKey(e.key), owner: w.Value.owner.String(), age: age, holder: e.holder.String(), stack: w.Value.stack})
				}
			}
		}
		s.unlock()
	}
	return out
}
