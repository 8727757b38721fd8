package etcdlock

import (
	"strconv"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/registry"
)

// stats counts this process's held keys and queued calls, for an
// Observer's gauges. It takes l.mu.
func (l *Locker) stats() fairlock.Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	var st fairlock.Stats
	for _, gs := range l.keys {
		holder := false
		for _, g := range gs {
			switch g.state {
			case held:
				holder = true
			case queued:
				st.Waiters++
			}
		}
		if holder {
			st.Keys++
		}
	}
	return st
}

// debugSource adapts a Locker to registry.Source.
type debugSource struct{ l *Locker }

// DebugState reports this process's calls on the Locker's keys: per key,
// the holder with its fencing token and age, and the queued calls in
// arrival order. Keys are quoted after l.mu is released.
func (src debugSource) DebugState(limit int) registry.LockerState {
	l := src.l
	type raw struct {
		key   string
		state registry.KeyState
	}
	l.mu.Lock()
	now := time.Now()
	st := registry.LockerState{
		Kind:          "etcdlock.Locker",
		DoubleUnlocks: l.doubles,
		Reentrant:     l.reentry,
	}
	raws := make([]raw, 0, len(l.keys))
	for key, gs := range l.keys {
		var k registry.KeyState
		for _, g := range gs {
			switch g.state {
			case held:
				age := now.Sub(g.granted)
				k.Mode = registry.Exclusive
				k.HeldFor = max(k.HeldFor, age)
				k.Holders = append(k.Holders, registry.HolderState{
					Owner: g.owner.String(), Token: uint64(g.rev), Since: g.granted, For: age,
				})
			case queued:
				k.Waiters = append(k.Waiters, registry.WaiterState{
					Owner: g.owner.String(), Mode: g.mode, Since: g.since, For: now.Sub(g.since),
				})
				st.Waiters++
			}
		}
		if len(k.Holders) > 0 || len(k.Waiters) > 0 {
			raws = append(raws, raw{key, k})
		}
	}
	l.mu.Unlock()
	st.Keys = len(raws)
	st.Held = make([]registry.KeyState, len(raws))
	for i, r := range raws {
		st.Held[i] = r.state
		st.Held[i].Key = strconv.Quote(r.key)
	}
	st.Held, st.Omitted = registry.Keep(st.Held, limit)
	st.Time = time.Now()
	return st
}
