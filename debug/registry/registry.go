// Package registry is the process-wide list of lockers built with debug
// on, and the shape of what each reports. Lockers register here: package
// fairlock's, and those of the backends in modules of their own (etcdlock,
// redislock), which is why it is public; package debug reads it and
// serves it. A program may read it directly (Snapshot) to export the
// states its own way.
//
// It imports nothing beyond the standard library's basics, so a program
// that uses only package fairlock links no net/http through it (it
// imports encoding/json, for KeyState's JSON form, which log/slog links
// anyway). Its types are those of package debug
// (debug.LockerState is registry.LockerState, and so on).
package registry

import (
	"cmp"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"
)

// LockerState is one locker's state, read shard by shard. The JSON field
// names are stable; durations are integer nanoseconds and times RFC 3339.
type LockerState struct {
	Name string `json:"name"` // the name from WithName, or generated
	// Kind is the locker's type: "Locker" or "Semaphore" (package
	// fairlock), "etcdlock.Locker" or "etcdlock.Semaphore",
	// "redislock.Locker" or "redislock.Semaphore"; a backend in a module
	// of its own names its types the same way.
	Kind string `json:"kind"`
	// Time is when the read ended. Each age below was measured when its
	// own shard was read, under that shard's mutex, so none is negative.
	Time time.Time `json:"time"`
	// Units is what each key of a Semaphore has (its n); 0 for a Locker.
	Units   int64 `json:"units,omitempty"`
	Keys    int   `json:"keys"`    // live keys: held or awaited
	Waiters int   `json:"waiters"` // queued calls over all keys
	// LongHeld is the threshold from WithLongHeld; 0 if unset.
	LongHeld time.Duration `json:"long_held_ns"`
	// DoubleUnlocks counts Unlocks of a Guard already unlocked.
	DoubleUnlocks int64 `json:"double_unlocks"`
	// Reentrant counts calls refused with ErrReentrant.
	Reentrant int64 `json:"reentrant"`
	// DeadlockDetection is true for a locker that refuses a wait that
	// would close a wait-for cycle (fairlock.WithDeadlockDetection). A
	// locker without a detector (a fairlock Locker built without that
	// option, or a backend that has none, as etcdlock and redislock have
	// none) leaves it false, and the text dump then leaves out the
	// count below rather than show a 0 that could never grow.
	DeadlockDetection bool `json:"deadlock_detection"`
	// DeadlocksRefused counts calls refused with ErrDeadlock; always 0
	// when DeadlockDetection is false.
	DeadlocksRefused int64 `json:"deadlocks_refused"`
	// Held lists the live keys, longest held first (then by key), at most
	// the limit the reader asked for.
	Held []KeyState `json:"held"`
	// Omitted is how many live keys the limit left out of Held.
	Omitted int `json:"omitted_keys"`
}

// The modes of holders and waiters.
const (
	Exclusive = "exclusive" // Lock: the only holder
	Shared    = "shared"    // RLock: one of any number of readers
	Units     = "units"     // Semaphore.Acquire: some of the key's units
	Wait      = "wait"      // Locker.Wait: a turn in the queue, holding nothing
)

// KeyState is one live key.
type KeyState struct {
	// Key is the key as the locker renders it: string keys quoted, keys
	// holding pointers as type and address, control characters escaped.
	// Its JSON form drops a string key's quotes (see MarshalJSON).
	Key string `json:"key"`
	// Mode is the holders' mode (Exclusive, Shared or Units); "" while the
	// key has no holder.
	Mode string `json:"mode"`
	// Units is the sum of the holders' units (Semaphore); 0 for a Locker.
	Units int64 `json:"units,omitempty"`
	// HeldFor is the age of the oldest grant among the holders.
	HeldFor time.Duration `json:"held_for_ns"`
	// LongHeld is true once HeldFor passes the locker's LongHeld threshold.
	LongHeld bool `json:"long_held"`
	// Holders are the key's holders, in the order they were granted.
	Holders []HolderState `json:"holders"`
	// Waiters are the queued calls, in the order they will be granted.
	Waiters []WaiterState `json:"waiters"`
	// Ahead lists, for a locker across processes (etcdlock, redislock),
	// the calls of other processes (and of other lockers of this one) on
	// the key that come before this locker's last call on it, in grant
	// order: who it waits for. The locker reads them from its engine
	// while its state is taken, within a bound (see AheadError). Empty
	// for an in-process locker.
	Ahead []RemoteState `json:"ahead,omitempty"`
	// AheadError says why Ahead was not read: the engine's error, or the
	// bound on a state's reads spent on other keys; "" when it was read.
	AheadError string `json:"ahead_error,omitempty"`
}

// RemoteState is a call of another process on a key, as a locker across
// processes read it from its engine (keylock.CallInfo).
type RemoteState struct {
	Host   string `json:"host"`   // the host it was made on
	PID    int    `json:"pid"`    // its process id there
	Locker string `json:"locker"` // the name of the locker that made it
	// Label is its owner's label, unquoted; "" if it has none.
	Label string `json:"label,omitempty"`
	Mode  string `json:"mode"`            // Exclusive, Shared, Units or Wait
	Units int64  `json:"units,omitempty"` // Semaphore: units held or asked for
	Held  bool   `json:"held"`            // it holds the key
	Token uint64 `json:"token,omitempty"` // a held call's fencing token
	// Age is how long ago it joined the key's queue, on the clock its
	// backend documents (keylock.Lister).
	Age time.Duration `json:"age_ns"`
}

// MarshalJSON encodes k with the JSON field names above, and Key as
// JSONKey gives it: JSON quotes and escapes a string on its own, so a
// string key is carried without the quotes of its text form
// ("key":"user-13", not "key":"\"user-13\"").
func (k KeyState) MarshalJSON() ([]byte, error) {
	type fields KeyState // the same fields, without this method
	f := fields(k)
	f.Key = JSONKey(k.Key)
	return json.Marshal(f)
}

// JSONKey returns a key rendered for text (a locker's Key) as structured
// output carries it: a string key, which the text forms quote so that no
// key can forge a line, without its quotes; its control characters,
// other non-printing runes and invalid bytes stay escaped as in the text
// form, and nothing else is. A long string key cut by the locker,
// `"abc"… (2097152 bytes)`, keeps its cut and size: `abc… (2097152 bytes)`.
// Any other text (a key that is not a string, a formatter's result) is
// returned as it is.
func JSONKey(text string) string {
	if len(text) < 2 || text[0] != '"' {
		return text
	}
	if i := strings.LastIndex(text, `"… (`); i > 0 && strings.HasSuffix(text, " bytes)") {
		if head := JSONKey(text[:i+1]); head != text[:i+1] {
			return head + text[i+1:]
		}
		return text
	}
	if !strings.ContainsRune(text, '\\') && strings.IndexByte(text[1:], '"') == len(text)-2 {
		return text[1 : len(text)-1] // nothing escaped
	}
	s, err := strconv.Unquote(text)
	if err != nil || strconv.Quote(s) != text {
		return text
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 || !unicode.IsPrint(r) {
			q := strconv.Quote(s[i : i+size])
			b.WriteString(q[1 : len(q)-1])
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// HolderState is one grant of a key.
type HolderState struct {
	Owner string `json:"owner"` // e.g. "flow#3" or "goroutine#41"
	// Label is the owner's label (owner.NewLabeledContext), unquoted;
	// empty if it has none. Owner is then the owner's name without it, and
	// the text dump shows both: flow#3 "req-42".
	Label string `json:"label,omitempty"`
	// Token is the grant's fencing token (Guard.Token).
	Token uint64        `json:"token"`
	Units int64         `json:"units,omitempty"` // Semaphore: units held
	Since time.Time     `json:"since"`           // when it was granted
	For   time.Duration `json:"held_for_ns"`     // its age when read
	// LongHeld is true once For passes the locker's LongHeld threshold.
	LongHeld bool `json:"long_held"`
	// Stack is the acquiring call's stack, innermost first, one
	// "function file:line" per frame; only with WithStacks.
	Stack []string `json:"stack,omitempty"`
}

// WaiterState is one queued call.
type WaiterState struct {
	Owner string `json:"owner"`
	Label string `json:"label,omitempty"` // as in HolderState
	// Mode is what the call waits for: Exclusive, Shared, Wait or Units.
	Mode  string        `json:"mode"`
	Units int64         `json:"units,omitempty"` // Semaphore: units asked for
	Since time.Time     `json:"since"`           // when it joined the queue
	For   time.Duration `json:"wait_for_ns"`     // its age when read
	// LongWait is true once For passes the locker's LongHeld threshold.
	LongWait bool     `json:"long_wait"`
	Stack    []string `json:"stack,omitempty"` // with WithStacks
}

// A Source reports one locker's state.
type Source interface {
	// DebugState returns the locker's state with at most limit keys in
	// Held, the longest held first (limit <= 0: every key), and Omitted
	// set to the number left out; the registry sets Name. It must be safe
	// to call concurrently with the locker's use, must not block on its
	// holders, and must run no user code (a key's String method, a
	// formatter, a logger) while it holds one of the locker's mutexes.
	DebugState(limit int) LockerState
}

var registry struct {
	mu      sync.Mutex
	sources map[string]Source // guarded by mu
}

// Register adds src under name and returns the name it got (name, or
// name#2, name#3… if taken) and the function that removes it; calling
// that function again does nothing.
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

// Names returns the registered names, sorted.
func Names() []string {
	registry.mu.Lock()
	names := make([]string, 0, len(registry.sources))
	for n := range registry.sources {
		names = append(names, n)
	}
	registry.mu.Unlock()
	slices.Sort(names)
	return names
}

// Snapshot returns the state of every registered locker (only the one
// registered as name, if name is not empty), sorted by name, each with at
// most limit keys (limit <= 0: all).
func Snapshot(name string, limit int) []LockerState {
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
	// Sources are read outside the registry mutex: a slow locker must not
	// stall Register and Close of others.
	states := make([]LockerState, 0, len(srcs))
	for _, ns := range srcs {
		st := ns.src.DebugState(limit)
		st.Name = ns.name
		states = append(states, st)
	}
	slices.SortFunc(states, func(a, b LockerState) int { return cmp.Compare(a.Name, b.Name) })
	return states
}

// Keep sorts keys longest held first, then by key, and keeps at most
// limit of them (limit <= 0: all). It returns the kept keys and how many
// it left out. Sources use it after reading every live key.
func Keep(keys []KeyState, limit int) ([]KeyState, int) {
	slices.SortStableFunc(keys, func(a, b KeyState) int {
		return cmp.Or(cmp.Compare(b.HeldFor, a.HeldFor), cmp.Compare(a.Key, b.Key))
	})
	if limit <= 0 || len(keys) <= limit {
		return keys, 0
	}
	return keys[:limit], len(keys) - limit
}
