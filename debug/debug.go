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
// Lockers and Semaphores built with fairlock.WithDebug, and those of the
// backends across processes built with their own WithDebug option
// (etcdlock.WithDebug, redislock.WithDebug), register themselves while
// they are open; a backend's show its own process's calls, and, for each
// key, the calls of other processes ahead of them that it reads from its
// engine (KeyState.Ahead). The registry lives in package debug/registry, which the
// lockers import, so a program that uses fairlock without this package
// links no net/http.
package debug

import "github.com/fairlock/fairlock/debug/registry"

// LockerState is one locker's state: its counters and its live keys,
// longest held first. (It is an alias of registry.LockerState; its
// fields are listed here too.) The JSON field names are stable; durations
// are integer nanoseconds and times RFC 3339.
//
//	Name             string        "name"              WithName's name, or generated
//	Kind             string        "kind"              "Locker", "Semaphore", "etcdlock.Locker", "etcdlock.Semaphore", "redislock.Locker" or "redislock.Semaphore"
//	Time             time.Time     "time"              when the read ended
//	Units            int64         "units"             a Semaphore's units per key; 0 (omitted) for a Locker
//	Keys             int           "keys"              live keys: held or awaited
//	Waiters          int           "waiters"           queued calls over all keys
//	LongHeld         time.Duration "long_held_ns"      WithLongHeld's threshold; 0 if unset
//	DoubleUnlocks    int64         "double_unlocks"    Unlocks of a Guard already unlocked
//	Reentrant        int64         "reentrant"         calls refused with ErrReentrant
//	DeadlockDetection bool         "deadlock_detection" the locker refuses waits that would close a cycle (fairlock.WithDeadlockDetection)
//	DeadlocksRefused int64         "deadlocks_refused" calls refused with ErrDeadlock; 0 without DeadlockDetection
//	Held             []KeyState    "held"              live keys, longest held first, then by key, up to the limit
//	Omitted          int           "omitted_keys"      live keys the limit left out of Held
//
// Each age was measured when its own shard was read, under that shard's
// mutex, so none is negative.
type LockerState = registry.LockerState

// KeyState is one live key: its mode, its holders in grant order and its
// waiters in queue order. Its fields (JSON names in quotes):
//
//	Key      string        "key"         rendered by the locker: strings quoted, pointers as type and address, control characters escaped; JSON drops a string key's quotes ("key":"user-13")
//	Mode     string        "mode"        the holders' mode: Exclusive, Shared or Units; "" while nobody holds the key
//	Units    int64         "units"       the holders' units (Semaphore); 0, omitted, for a Locker
//	HeldFor  time.Duration "held_for_ns" the age of the oldest grant among the holders
//	LongHeld bool          "long_held"   HeldFor is past the locker's LongHeld threshold
//	Holders  []HolderState "holders"     in the order they were granted
//	Waiters  []WaiterState "waiters"     in the order they will be granted
//	Ahead    []RemoteState "ahead"       a locker across processes: other processes' calls ahead of this locker's, read from the engine
//	AheadError string      "ahead_error" why Ahead was not read; "" when it was
type KeyState = registry.KeyState

// HolderState is one grant of a key. Its fields (JSON names in quotes):
//
//	Owner    string        "owner"       e.g. "flow#3" or "goroutine#41"
//	Label    string        "label"       the owner's label (owner.NewLabeledContext); omitted if none
//	Token    uint64        "token"       the grant's fencing token (Guard.Token)
//	Units    int64         "units"       Semaphore: units held; omitted if 0
//	Since    time.Time     "since"       when it was granted
//	For      time.Duration "held_for_ns" its age when read
//	LongHeld bool          "long_held"   For is past the locker's LongHeld threshold
//	Stack    []string      "stack"       the acquiring call's stack, innermost first, "function file:line" per frame; only with WithStacks
type HolderState = registry.HolderState

// WaiterState is one queued call. Its fields (JSON names in quotes):
//
//	Owner    string        "owner"       as in HolderState
//	Label    string        "label"       as in HolderState
//	Mode     string        "mode"        what it waits for: Exclusive, Shared, Wait or Units
//	Units    int64         "units"       Semaphore: units asked for; omitted if 0
//	Since    time.Time     "since"       when it joined the queue
//	For      time.Duration "wait_for_ns" its age when read
//	LongWait bool          "long_wait"   For is past the locker's LongHeld threshold
//	Stack    []string      "stack"       the call's stack; only with WithStacks
type WaiterState = registry.WaiterState

// RemoteState is a call of another process on a key, as a locker across
// processes read it from its engine (KeyState.Ahead). Its fields (JSON
// names in quotes):
//
//	Host   string        "host"   the host it was made on
//	PID    int           "pid"    its process id there
//	Locker string        "locker" the name of the locker that made it
//	Label  string        "label"  its owner's label; omitted if none
//	Mode   string        "mode"   Exclusive, Shared, Units or Wait
//	Units  int64         "units"  Semaphore: units held or asked for; omitted if 0
//	Held   bool          "held"   it holds the key
//	Token  uint64        "token"  a held call's fencing token; omitted for a waiter
//	Age    time.Duration "age_ns" how long ago it queued, on its backend's clock (keylock.Lister)
type RemoteState = registry.RemoteState

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
