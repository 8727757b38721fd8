// Package debug shows what fairlock lockers built with fairlock.WithDebug
// are doing: which keys are held, in which mode, by whom and for how long,
// who waits behind each, and how often callers misused them.
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
// JSON, and add locker=NAME to see one locker. Nothing is registered on
// http.DefaultServeMux. Dump writes the same text to any io.Writer, and
// Snapshot returns the data as structs.
//
// Lockers and Semaphores built with fairlock.WithDebug, and etcdlock
// Lockers built with etcdlock.WithDebug, register themselves while they
// are open. The registry lives in an internal package that the lockers
// import, so a program that uses fairlock without this package links no
// net/http.
package debug

import "github.com/fairlock/fairlock/internal/registry"

// LockerState is one locker's state: its counters and its live keys,
// longest held first. The JSON field names are stable; durations are
// integer nanoseconds and times RFC 3339.
type LockerState = registry.LockerState

// KeyState is one live key: its mode, its holders in grant order and its
// waiters in queue order.
type KeyState = registry.KeyState

// HolderState is one grant of a key: owner, fencing token, units, age.
type HolderState = registry.HolderState

// WaiterState is one queued call: owner, mode or units, age.
type WaiterState = registry.WaiterState

// The modes of KeyState, HolderState and WaiterState.
const (
	Exclusive = registry.Exclusive // Lock: the only holder
	Shared    = registry.Shared    // RLock: one of any number of readers
	Units     = registry.Units     // Semaphore.Acquire: some of the key's units
	Wait      = registry.Wait      // Locker.Wait: a turn in the queue, holding nothing
)

// Snapshot returns the state of every open locker built with debug on,
// sorted by name, each with every live key, longest held first. Each
// locker is read shard by shard, so a snapshot is a series of per-shard
// instants, not one instant; it allocates in proportion to the live keys.
func Snapshot() []LockerState {
	return registry.Snapshot("", 0)
}
