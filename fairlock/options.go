package fairlock

import (
	"log/slog"
	"runtime"
	"time"
)

// An Option configures a Locker in New or a Semaphore in NewSemaphore;
// each means the same for both.
type Option func(*config)

// config is every setting of a Locker or Semaphore; defaults are set in
// one place, defaultConfig.
type config struct {
	name      string
	shards    int
	observer  Observer
	debug     bool
	stacks    bool
	longHeld  time.Duration
	logger    *slog.Logger
	deadlocks bool
	keyFormat any // func(K) string, from WithKeyFormatter
}

func defaultConfig() config {
	return config{shards: defaultShards()}
}

// defaultShards is eight shards per P and at least 64, rounded up to a
// power of two, so that goroutines on distinct keys rarely meet on a shard
// mutex.
func defaultShards() int { return ceilPow2(max(64, 8*runtime.GOMAXPROCS(0))) }

// maxShards caps WithShards: 65536 shards already spread tens of thousands
// of keys in flight at once with little contention, and each costs memory
// before any key is locked.
const maxShards = 1 << 16

// ceilPow2 returns the least power of two at least n, at most maxShards.
func ceilPow2(n int) int {
	p := 1
	for p < min(n, maxShards) {
		p <<= 1
	}
	return p
}

// WithName names the Locker in debug output (package debug) and in the
// fairlock.locker metric attribute. Without it a Locker is named
// "fairlock-N", N counting the Lockers and Semaphores made by this process
// from 1. Names need not be unique; the debug registry suffixes
// duplicates.
func WithName(name string) Option { return func(c *config) { c.name = name } }

// WithShards sets the number of shards a Locker spreads its keys over. n
// is rounded up to a power of two, and capped at 65536; n < 1 means the
// default, eight shards per GOMAXPROCS and at least 64. New allocates the
// shards at once (376 bytes each for string keys on 64-bit platforms), and
// each keeps up to 16 recycled key entries (80 bytes each for string keys)
// once keys have been locked there. More shards make Len, Snapshot and
// Close walk more; fewer make goroutines on unrelated keys contend on the
// same shard mutex.
func WithShards(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.shards = defaultShards()
			return
		}
		c.shards = ceilPow2(n)
	}
}

// WithObserver sets the hook that receives the Locker's metrics (see
// Observer; package otelmetrics implements it for OpenTelemetry). A nil
// Observer means none. With an observer every call takes the shard mutex
// (the lock-free path is off: the observer needs each grant's time) and
// reads the clock at the grant and at the release, and the Observer's
// methods run on every call; the Locker itself allocates nothing per call
// for it. docs/performance.md gives the cost with otelmetrics and the
// OpenTelemetry SDK.
func WithObserver(o Observer) Option { return func(c *config) { c.observer = o } }

// WithDebug registers the Locker with package debug while it is open and
// records, for each grant, its holder, token and time, and for each waiter
// its owner, mode and arrival time. Every call then takes the shard mutex
// (the lock-free path is off: debug needs each grant's time) and reads the
// clock at the grant and the release; the uncontended path still
// allocates nothing once warm. See docs/debugging.md, and
// docs/performance.md for the cost.
func WithDebug() Option { return func(c *config) { c.debug = true } }

// WithStacks records the stack of every call that asks for a key (up to 32
// frames) and shows each holder's acquiring stack, and each waiter's, in
// debug output and warnings. It implies WithDebug. Capturing a stack is a
// runtime.Callers walk and one 256-byte allocation per call: use it while
// hunting a bug.
func WithStacks() Option {
	return func(c *config) { c.debug, c.stacks = true, true }
}

// WithLongHeld makes the Locker warn through its logger when a grant has
// been held for longer than d, and again at 2d, 4d, 8d… while it stays
// held; a waiter queued longer than d is reported the same way. Debug
// output flags such keys. It implies WithDebug and starts one watchdog
// goroutine that wakes every d/4, but no more often than once a
// millisecond and at least once a second, and stops when Close is called
// (a Close that waits on a holder still shows it in debug output, flagged,
// but warns no more). Each wake-up visits only the shards that have live
// keys, so an idle Locker's watchdog costs next to nothing however many
// shards it has. d <= 0 turns the watchdog off but still turns debug on,
// as WithDebug does.
func WithLongHeld(d time.Duration) Option {
	return func(c *config) { c.debug, c.longHeld = true, d }
}

// WithLogger sets where warnings go: long-held locks, long waits and refused
// deadlocks. A nil logger means slog.Default(), the default. A refused
// deadlock is logged with the refused call's context (WarnContext), and
// only when the logger is enabled for warnings, so a formatter from
// WithKeyFormatter is not run for a record nobody keeps.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// WithDeadlockDetection keeps a wait-for graph of owners (an owner waits
// for a key, the key's holders are owners) and makes a call that would
// wait return an error wrapping ErrDeadlock, also a *DeadlockError naming
// the cycle, when waiting would close a cycle. Every holder counts, shared
// ones included. The uncontended path does not pay for it; a call that
// must wait takes one Locker-wide mutex and runs a graph reduction, linear
// in the owners and edges it reaches, that allocates its arrays; grants
// and releases of awaited keys update the graph under that mutex. See
// docs/deadlocks.md for its limits.
func WithDeadlockDetection() Option { return func(c *config) { c.deadlocks = true } }

// WithKeyFormatter sets how the Locker renders keys in errors, debug
// output and warnings. Without it, string keys are quoted, keys that are
// or hold pointers render as type and address (a Locker never reads what a
// key points to: the holder owns it, and reading it while the holder
// writes would be a data race), and other keys print as fmt's %v. f runs
// outside the Locker's mutexes, each time a key is rendered (an error's
// Error method, a dump, a warning), possibly concurrently; it must be safe
// for that, and must not read memory the key's holder may be writing.
// Control characters in its result are escaped. New panics if K is not
// the type of f's parameter.
func WithKeyFormatter[K comparable](f func(K) string) Option {
	return func(c *config) {
		if f == nil {
			c.keyFormat = nil
			return
		}
		c.keyFormat = f
	}
}
