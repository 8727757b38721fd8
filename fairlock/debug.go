package fairlock

import (
	"cmp"
	"fmt"
	"math/bits"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"weak"

	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/owner"
)

// startDebug sets t.dbg, then registers t with the debug registry under
// t.name and starts its watchdog. t must be complete otherwise: a dump may
// read it at once.
func startDebug[K comparable](t *table[K], cfg config) {
	d := &debugState{longHeld: max(cfg.longHeld, 0), quit: make(chan struct{}), wake: make(chan struct{}, 1)}
	if d.longHeld > 0 {
		d.liveShards = make([]atomic.Uint64, (len(t.shards)+63)/64)
	}
	t.dbg = d
	wt := weak.Make(t)
	var registered string
	registered, d.unregister = registry.Register(t.name, debugSource[K]{wt})
	if d.longHeld > 0 {
		d.done.Add(1)
		go watch(wt, d, registered)
	}
}

// debugSource adapts a table to registry.Source through a weak pointer:
// the registry does not keep a table alive.
type debugSource[K comparable] struct{ wt weak.Pointer[table[K]] }

// rawKey is one live key as read under its shard mutex: the key itself,
// not yet rendered (rendering may run user code, which must not run under
// a shard mutex), with its holders and waiters.
type rawKey[K comparable] struct {
	key   K
	state registry.KeyState
}

// DebugState reads the table shard by shard. Each shard's clock is read
// under its mutex, after every grant and arrival it shows was recorded, so
// no age is negative. Keys are rendered after every shard mutex is
// released, and only the limit longest held are.
func (src debugSource[K]) DebugState(limit int) registry.LockerState {
	t := src.wt.Value()
	if t == nil {
		return registry.LockerState{Kind: lockerKind.String()} // collected between the registry's read and this call
	}
	st := registry.LockerState{
		Kind:          t.kind.String(),
		LongHeld:      t.dbg.longHeld,
		DoubleUnlocks: t.doubleUnlocks.Load(),
		Reentrant:     t.reentrant.Load(),
	}
	if t.kind == semaphoreKind {
		st.Units = t.size
	}
	if t.detector != nil {
		st.DeadlockDetection = true
		st.DeadlocksRefused = t.detector.refused.Load()
	}
	long := func(d time.Duration) bool { return t.dbg.longHeld > 0 && d > t.dbg.longHeld }
	var raw []rawKey[K]
	for i := range t.shards {
		s := &t.shards[i]
		s.lock()
		now := time.Now()
		st.Keys += s.live
		st.Waiters += s.waiting
		for v := range s.views() {
			k := registry.KeyState{
				Holders: make([]registry.HolderState, 0, v.holding()),
				Waiters: make([]registry.WaiterState, 0, v.waiting()),
			}
			for h := range v.holders() {
				hs := registry.HolderState{Owner: h.owner.Name(), Label: h.info.label, Token: h.token, Since: h.info.since, Stack: frames(h.info.stack)}
				hs.For = now.Sub(hs.Since)
				hs.LongHeld = long(hs.For)
				if t.kind == semaphoreKind {
					hs.Units = h.units
					k.Units += h.units
				}
				k.Mode = t.mode(h.units, false)
				k.HeldFor = max(k.HeldFor, hs.For)
				k.Holders = append(k.Holders, hs)
			}
			k.LongHeld = long(k.HeldFor)
			for r := range v.waiters() {
				ws := registry.WaiterState{
					Owner: r.owner.Name(), Label: r.label, Mode: t.mode(r.units, r.turn),
					Since: r.now, Stack: frames(r.stack),
				}
				if t.kind == semaphoreKind {
					ws.Units = r.units
				}
				ws.For = now.Sub(ws.Since)
				ws.LongWait = long(ws.For)
				k.Waiters = append(k.Waiters, ws)
			}
			raw = append(raw, rawKey[K]{v.key(), k})
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
		st.Held[i].Key = t.keyText(r.key)
	}
	st.Held, _ = registry.Keep(st.Held, 0)
	st.Omitted = st.Keys - len(st.Held)
	return st
}

// mode names the mode of a holder or waiter of units (turn: a Wait).
func (t *table[K]) mode(units int64, turn bool) string {
	switch {
	case turn:
		return registry.Wait
	case t.kind == semaphoreKind:
		return registry.Units
	case units == lockerUnits:
		return registry.Exclusive
	default:
		return registry.Shared
	}
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
	owner  owner.ID
	label  string // owner's, as recorded by the call (holdInfo, request)
	mode   string
	token  uint64 // of a grant; 0 for a waiter
	age    time.Duration
	stack  []uintptr
	wait   bool     // a long wait, not a long hold
	holder owner.ID // for a long wait: the key's oldest holder
	hlabel string   // holder's label
}

// watch is the watchdog goroutine: every period it warns about holders and
// waiters that passed longHeld, 2·longHeld, 4·longHeld… since their grant
// or arrival. While no key is live it sleeps without a timer until
// d.markLive wakes it, so an idle table costs no CPU. It holds its table
// only while it looks at it, and exits when d.quit is closed or the table
// is gone.
func watch[K comparable](wt weak.Pointer[table[K]], d *debugState, name string) {
	defer d.done.Done()
	period := min(max(d.longHeld/4, time.Millisecond), time.Second)
	ticker := time.NewTicker(period)
	defer ticker.Stop()
	var warnings []warning[K]
	for {
		if asleep(d, wt) {
			ticker.Stop()
			select {
			case <-d.quit:
				return
			case <-d.wake:
				ticker.Reset(period)
			}
		}
		select {
		case <-d.quit:
			return
		case <-d.wake: // stale: the live count went to 0 and back
		case <-ticker.C:
			t := wt.Value()
			if t == nil {
				return
			}
			warnings = t.overdue(d, warnings[:0])
			for _, w := range warnings {
				args := []any{"locker", name, "key", registry.JSONKey(t.keyText(w.key)), "mode", w.mode}
				if !w.wait {
					args = ownerAttrs(args, "holder", w.owner, w.label)
					args = append(args, "token", w.token, "held_for", w.age)
				} else {
					args = ownerAttrs(args, "waiter", w.owner, w.label)
					args = append(args, "waited", w.age)
					args = ownerAttrs(args, "holder", w.holder, w.hlabel)
				}
				if len(w.stack) > 0 {
					args = append(args, "stack", strings.Join(frames(w.stack), "\n"))
				}
				t.logger.Warn(w.msg, args...)
			}
			clear(warnings) // hold no keys between ticks
		}
	}
}

// asleep reports whether the table behind wt, whose debug state is d,
// has no live key (or is gone).
func asleep[K comparable](d *debugState, wt weak.Pointer[table[K]]) bool {
	return d.liveCount.Load() == 0 || wt.Value() == nil
}

// overdue collects the warnings due now, for d's watchdog, marking each
// as given. It visits only the shards whose bit in d.liveShards is set,
// so an idle table costs a read of one word per 64 shards.
func (t *table[K]) overdue(d *debugState, out []warning[K]) []warning[K] {
	limit := d.longHeld
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
	for wi := range d.liveShards {
		for word := d.liveShards[wi].Load(); word != 0; word &= word - 1 {
			s := &t.shards[wi*64+bits.TrailingZeros64(word)]
			s.lock()
			now := time.Now()
			for v := range s.views() {
				var oldest owner.ID // the first live holder, named in long-wait warnings
				var oldestLabel string
				for h := range v.holders() {
					if oldest == 0 {
						oldest, oldestLabel = h.owner, h.info.label
					}
					if age := now.Sub(h.info.since); due(age, &h.info.warned) {
						out = append(out, warning[K]{msg: "fairlock: lock held too long", key: v.key(), owner: h.owner, label: h.info.label,
							mode: t.mode(h.units, false), token: h.token, age: age, stack: h.info.stack})
					}
				}
				for r, warned := range v.waiters() {
					if age := now.Sub(r.now); due(age, warned) {
						out = append(out, warning[K]{msg: "fairlock: waiting too long", key: v.key(), owner: r.owner, label: r.label,
							mode: t.mode(r.units, r.turn), age: age, stack: r.stack,
							wait: true, holder: oldest, hlabel: oldestLabel})
					}
				}
			}
			s.unlock()
		}
	}
	return out
}
