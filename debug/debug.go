// Package debug shows what fairlock Lockers built with fairlock.WithDebug
// are doing: which keys are held, by whom and for how long, who waits
// behind each, and how often callers misused them.
//
// # Usage
//
// Mount the handler the way net/http/pprof is mounted, on a mux you serve
// only to operators:
//
//	mux := http.NewServeMux()
//	mux.Handle("/debug/fairlock/", debug.Handler())
//
// then open /debug/fairlock/ for text, /debug/fairlock/?format=json for
// JSON, and add locker=NAME to see one Locker. Nothing is registered on
// http.DefaultServeMux. Dump writes the same text to any io.Writer, and
// Snapshot returns the data as structs.
//
// Lockers register themselves (through Register) when built with
// fairlock.WithDebug and leave the registry when closed. This package does
// not import fairlock.
package debug

import (
	"cmp"
	"slices"
	"strconv"
	"sync"
	"time"
)

// LockerState is one Locker's state at one instant. The JSON field names
// are stable; durations are integer nanoseconds and times RFC 3339.
type LockerState struct {
	Name    string    `json:"name"`    // the name from fairlock.WithName, or generated
	Time    time.Time `json:"time"`    // when the state was read
	Keys    int       `json:"keys"`    // live keys: held, with or without waiters
	Waiters int       `json:"waiters"` // queued waiters over all keys
	// LongHeld is the threshold from fairlock.WithLongHeld; 0 if unset.
	LongHeld time.Duration `json:"long_held_ns"`
	// DoubleUnlocks counts Unlocks of a Guard already unlocked.
	DoubleUnlocks int64 `json:"double_unlocks"`
	// Reentrant counts Lock and TryLock calls refused with ErrReentrant.
	Reentrant int64 `json:"reentrant"`
	// DeadlocksRefused counts Lock calls refused with ErrDeadlock.
	DeadlocksRefused int64 `json:"deadlocks_refused"`
	// Held lists the held keys, longest held first.
	Held []KeyState `json:"held"`
}

// KeyState is one held key.
type KeyState struct {
	Key       string        `json:"key"`         // the key, printed with %v (strings quoted)
	Holder    string        `json:"holder"`      // the holder's owner, e.g. "flow#3" or "goroutine#41"
	HeldSince time.Time     `json:"held_since"`  // when the holder was granted the key
	HeldFor   time.Duration `json:"held_for_ns"` // Time minus HeldSince
	// LongHeld is true once HeldFor passes the Locker's LongHeld threshold.
	LongHeld bool `json:"long_held"`
	// Stack is the holder's Lock call stack, innermost first, one
	// "function file:line" per frame; only with fairlock.WithStacks.
	Stack []string `json:"stack,omitempty"`
	// Waiters are the queued Lock calls, in the order they will be granted.
	Waiters []WaiterState `json:"waiters"`
}

// WaiterState is one queued Lock call.
type WaiterState struct {
	Owner   string        `json:"owner"`       // the waiter's owner
	Since   time.Time     `json:"since"`       // when it joined the queue
	WaitFor time.Duration `json:"wait_for_ns"` // Time minus Since
	// LongWait is true once WaitFor passes the Locker's LongHeld threshold.
	LongWait bool     `json:"long_wait"`
	Stack    []string `json:"stack,omitempty"` // with fairlock.WithStacks
}

// A Source reports one Locker's state. fairlock implements it; other
// lock implementations may too.
type Source interface {
	// DebugState returns the state at time now; the registry sets its
	// Name. It must be safe to call concurrently with the Locker's use and
	// must not block on its holders.
	DebugState(now time.Time) LockerState
}

var registry struct {
	mu      sync.Mutex
	sources map[string]Source // guarded by mu
}

// Register adds src under name and returns the name it got (name, or
// name#2, name#3… if taken) and the function that removes it. fairlock
// calls it from New for Lockers built WithDebug and calls unregister from
// Close.
func Register(name string, src Source) (registered string, unregister func()) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if registry.sources == nil {
		registry.sources = make(map[string]Source)
	}
	registered = name
	for i := 2; registry.sources[registered] != nil; i++ {
		registered = name + "#" + strconv.Itoa(i)
	}
	registry.sources[registered] = src
	var once sync.Once
	return registered, func() {
		once.Do(func() {
			registry.mu.Lock()
			delete(registry.sources, registered)
			registry.mu.Unlock()
		})
	}
}

// Snapshot returns the state of every registered Locker, sorted by name,
// each with its held keys longest held first. Each Locker is read shard by
// shard, so a snapshot is a series of per-shard instants, not one instant.
func Snapshot() []LockerState {
	return snapshot("")
}

// snapshot returns the registered lockers' states; only the one called
// name if name is not empty.
func snapshot(name string) []LockerState {
	type named struct {
		name string
		src  Source
	}
	registry.mu.Lock()
	srcs := make([]named, 0, len(registry.sources))
	for n, src := range registry.sources {
		if name == "" || n == name {
			srcs = append(srcs, named{n, src})
		}
	}
	registry.mu.Unlock()
	// Sources are read outside the registry mutex: a slow Locker must not
	// stall Register and Close of others.
	now := time.Now()
	states := make([]LockerState, 0, len(srcs))
	for _, ns := range srcs {
		st := ns.src.DebugState(now)
		st.Name = ns.name
		slices.SortStableFunc(st.Held, func(a, b KeyState) int {
			return cmp.Or(cmp.Compare(b.HeldFor, a.HeldFor), cmp.Compare(a.Key, b.Key))
		})
		states = append(states, st)
	}
	slices.SortFunc(states, func(a, b LockerState) int { return cmp.Compare(a.Name, b.Name) })
	return states
}
