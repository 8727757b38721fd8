package redislock

import (
	"strconv"
	"time"

	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/fairlock"
)

// What a Locker shows of itself: the stats behind an Observer's gauges,
// and its state for the debug registry (WithDebug).

// stats counts this process's held keys and queued calls, for an
// Observer's gauges. It takes c.mu.
func (c *core) stats() fairlock.Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	var st fairlock.Stats
	for _, ks := range c.keys {
		holder := false
		for _, g := range ks.guards {
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

// debugSource adapts a core to registry.Source.
type debugSource struct{ c *core }

// DebugState reports this process's calls on the Locker's keys: per key,
// the holders with their fencing tokens and ages, and the queued calls in
// arrival order. Keys are quoted after c.mu is released.
func (src debugSource) DebugState(limit int) registry.LockerState {
	c := src.c
	type raw struct {
		key   string
		state registry.KeyState
	}
	c.mu.Lock()
	now := time.Now()
	st := registry.LockerState{
		Kind:          c.kind,
		Units:         c.units,
		DoubleUnlocks: c.doubles,
		Reentrant:     c.reentry,
	}
	raws := make([]raw, 0, len(c.keys))
	for key, ks := range c.keys {
		var k registry.KeyState
		for _, g := range ks.guards {
			var units int64
			if g.mode == modeUnits {
				units = g.w
			}
			switch g.state {
			case held:
				age := now.Sub(g.grantedAt)
				k.Mode = modeName(g.mode)
				k.Units += units
				k.HeldFor = max(k.HeldFor, age)
				k.Holders = append(k.Holders, registry.HolderState{
					Owner: g.owner.Name(), Label: g.owner.Label(), Token: g.token, Units: units, Since: g.grantedAt, For: age,
				})
			case queued:
				k.Waiters = append(k.Waiters, registry.WaiterState{
					Owner: g.owner.Name(), Label: g.owner.Label(), Mode: modeName(g.mode), Units: units, Since: g.since, For: now.Sub(g.since),
				})
				st.Waiters++
			}
		}
		if len(k.Holders) > 0 || len(k.Waiters) > 0 {
			raws = append(raws, raw{key, k})
		}
	}
	c.mu.Unlock()
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

// modeName is the debug registry's name of a mode.
func modeName(m byte) string {
	switch m {
	case modeShared:
		return registry.Shared
	case modeUnits:
		return registry.Units
	case modeWait:
		return registry.Wait
	}
	return registry.Exclusive
}
