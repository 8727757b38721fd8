package backend

import (
	"strconv"
	"time"

	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/fairlock"
)

// What a Locker shows of itself: the counts an Observer's gauges read
// (stats) and the state package debug lists (debugSource).

// stats counts this process's held keys and queued calls, for an
// Observer's gauges. It takes the Core's mutex.
func (k *Core) stats() fairlock.Stats {
	k.mu.Lock()
	defer k.mu.Unlock()
	var st fairlock.Stats
	for _, cs := range k.keys {
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

// register adds the Locker to the debug registry and returns the
// function that removes it.
func (k *Core) register() func() {
	_, unreg := registry.Register(k.name, debugSource{k})
	return unreg
}

// debugSource adapts a Core to registry.Source.
type debugSource struct{ k *Core }

// DebugState reports this process's calls on the Locker's keys: per key,
// the holders with their mode (exclusive, shared, or units for a
// Semaphore, with how many), fencing tokens and ages, and the queued
// calls in arrival order with what each asks for. Keys are quoted after
// the Core's mutex is released. For an engine that can list (Lister), it
// then reads, for each key it reports, the calls of other processes
// ahead of this Locker's (KeyState.Ahead): one listing per key, one key
// after another, all within aheadBudget, so that a slow or unreachable
// engine delays a dump by that much at most; the keys it had no time
// for, or whose read failed, say so (KeyState.AheadError).
func (src debugSource) DebugState(limit int) registry.LockerState {
	k := src.k
	type raw struct {
		key   string
		state registry.KeyState
	}
	k.mu.Lock()
	now := time.Now()
	st := registry.LockerState{
		Kind:          k.kind,
		Units:         k.size,
		DoubleUnlocks: k.doubles,
		Reentrant:     k.reentry,
	}
	raws := make([]raw, 0, len(k.keys))
	for key, cs := range k.keys {
		var ks registry.KeyState
		for _, c := range cs {
			var units int64
			if c.mode == Units {
				units = c.w
			}
			switch c.state {
			case held:
				age := now.Sub(c.grantedAt)
				ks.Mode = c.mode.String()
				ks.Units += units
				ks.HeldFor = max(ks.HeldFor, age)
				ks.Holders = append(ks.Holders, registry.HolderState{
					Owner: c.owner.Name(), Label: c.label, Token: c.token, Units: units, Since: c.grantedAt, For: age,
				})
			case queued:
				ks.Waiters = append(ks.Waiters, registry.WaiterState{
					Owner: c.owner.Name(), Label: c.label, Mode: c.mode.String(), Units: units, Since: c.since, For: now.Sub(c.since),
				})
				st.Waiters++
			}
		}
		if len(ks.Holders) > 0 || len(ks.Waiters) > 0 {
			raws = append(raws, raw{key, ks})
		}
	}
	k.mu.Unlock()
	st.Keys = len(raws)
	st.Held = make([]registry.KeyState, len(raws))
	unquoted := make(map[string]string, len(raws))
	for i, r := range raws {
		st.Held[i] = r.state
		st.Held[i].Key = strconv.Quote(r.key)
		unquoted[st.Held[i].Key] = r.key
	}
	st.Held, st.Omitted = registry.Keep(st.Held, limit)
	keys := make([]string, len(st.Held))
	for i := range st.Held {
		keys[i] = unquoted[st.Held[i].Key]
	}
	k.ahead(keys, st.Held)
	st.Time = time.Now()
	return st
}
