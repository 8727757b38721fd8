package etcdlock

import (
	"strconv"
	"time"

	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/fairlock"
)

// What a Locker shows of itself: the counts an Observer's gauges read
// (stats) and the state package debug lists (debugSource).

// stats counts this process's held keys and queued calls, for an
// Observer's gauges. It takes l.mu.
func (l *Locker) stats() fairlock.Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	var st fairlock.Stats
	for _, cs := range l.keys {
		holder := false
		for _, c := range cs {
			switch c.state {
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
// the holders with their mode (exclusive, shared, or units for a
// Semaphore, with how many), fencing tokens and ages, and the queued
// calls in arrival order with what each asks for. Keys are quoted after
// l.mu is released.
func (src debugSource) DebugState(limit int) registry.LockerState {
	l := src.l
	type raw struct {
		key   string
		state registry.KeyState
	}
	l.mu.Lock()
	now := time.Now()
	kind := "etcdlock.Locker"
	if l.size > 0 {
		kind = "etcdlock.Semaphore"
	}
	st := registry.LockerState{
		Kind:          kind,
		Units:         l.size,
		DoubleUnlocks: l.doubles,
		Reentrant:     l.reentry,
	}
	raws := make([]raw, 0, len(l.keys))
	for key, cs := range l.keys {
		var k registry.KeyState
		for _, c := range cs {
			switch c.state {
			case held:
				age := now.Sub(c.granted)
				k.Mode = c.mode
				k.Units += c.claim.w
				k.HeldFor = max(k.HeldFor, age)
				k.Holders = append(k.Holders, registry.HolderState{
					Owner: c.owner.String(), Token: uint64(c.rev), Units: c.claim.w, Since: c.granted, For: age,
				})
			case queued:
				k.Waiters = append(k.Waiters, registry.WaiterState{
					Owner: c.owner.String(), Mode: c.mode, Units: c.claim.w, Since: c.since, For: now.Sub(c.since),
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
