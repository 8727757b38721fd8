package fairlock

import (
	"hash/maphash"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/owner"
)

// This file is the data a Locker and a Semaphore are made of: a table of
// shards, each holding the entries of its live keys, and what a call
// reads off the table without touching a shard (hashing, the clock, key
// text, the drain count of a closed table). The table and its shards refer
// to each other, so both types are here; the operations live above them:
// the shard's in shard.go, the calls' in lock.go, the table's life in
// lifecycle.go.

// table is what a Locker and a Semaphore are made of: keys hashed onto
// shards of per-key state machines (entry), each key with size units,
// and the options around them: the deadlock detector, observer and debug
// state that settle (lock.go) reports what a transition decided to.
type table[K comparable] struct {
	seed   maphash.Seed
	shards []shard[K]
	mask   uint64
	size   int64 // units per key: lockerUnits for a Locker, n for a Semaphore
	kind   kind  // a Locker or a Semaphore

	name      string
	logger    *slog.Logger
	keyFormat func(K) string   // WithKeyFormatter, or nil
	renderAny func(any) string // renders a K held in an any, for errors: the formatter's; nil without one (renderKey)
	timed     bool             // read the clock on grant/release: debug or observer on
	stacks    bool             // WithStacks
	obs       LockerObserver   // nil without WithObserver
	dbg       *debugState      // nil without WithDebug
	detector  *detector[K]     // nil without WithDeadlockDetection

	reentrant     atomic.Int64 // ErrReentrant returns
	doubleUnlocks atomic.Int64 // Unlocks of a Guard already unlocked

	closing  atomic.Bool   // Close has begun: set before it marks any shard
	draining atomic.Int64  // after Close: shards with live keys, +1 while Close walks them
	drained  chan struct{} // closed when draining reaches 0
	// released says who releases the registrations (closer): the Close
	// that sees the table drained, or, if Close gave up waiting first,
	// whoever drains it. See settleRelease.
	released atomic.Uint32
	closer   *closer // what Close and an unreachable table's cleanup release
}

// kind tells a Locker's table from a Semaphore's.
type kind uint8

const (
	lockerKind kind = iota
	semaphoreKind
)

// String returns "Locker" or "Semaphore", the kind's name in debug output.
func (k kind) String() string {
	if k == semaphoreKind {
		return "Semaphore"
	}
	return "Locker"
}

// lockerUnits is a Locker key's size: a Lock takes all of it, an RLock one
// unit, so readers can never fill it.
const lockerUnits = 1<<63 - 1

// inlineSlots is how many live keys a shard keeps in arrays of its own
// before it spills into a map. Most shards of a busy Locker hold zero to a
// few live keys at any instant, so the mutex side finds, adds and removes
// a key by scanning one cache line of tags, without a map operation.
const inlineSlots = 8

// shard is one slice of the key space: a state word for the lock-free fast
// path, a mutex and the entries of the live keys that hash to it. Padded so
// neighbouring shards do not share a cache line.
type shard[K comparable] struct {
	// state is the shard's mode and fast grant: see the fast path in
	// shard.go.
	state atomic.Uint64
	// fastKey, fastTag, fastOwner and fastUnits are the fast holder's
	// key, the key's tag, owner and units. The fast claimant writes them
	// between its claiming CAS and the Store that publishes them; others read them only after
	// seeing that Store. A fast Unlock leaves them in place (clearing them
	// would race the next claim), so a shard keeps a reference to its last
	// fast key until the next claim or inflate: at most one key per shard.
	fastKey   K
	fastTag   uint64 // fastKey's tag, for inflate
	fastOwner owner.ID
	fastUnits int64

	// t is the shard's table, for a Guard's Unlock and HandOff to reach
	// (lock.go, guard.go); the shard's own operations (shard.go) never
	// use it: they report what changed (insert, remove) and the caller
	// books it.
	t  *table[K]
	mu sync.Mutex

	live     int                    // guarded by mu: live keys, inline and overflow
	tags     [inlineSlots]uint64    // guarded by mu: hash|1 of slots[i]'s key; 0 for an empty slot
	slots    [inlineSlots]*entry[K] // guarded by mu
	overflow map[K]*entry[K]        // guarded by mu: live keys beyond the slots; nil until needed
	peak     int                    // guarded by mu: most overflow keys since overflow was made
	free     []*entry[K]            // guarded by mu: recycled entries, at most maxFree
	// owners indexes the holders of entries with many (indexed set), so
	// that the reentrancy check of one more reader does not scan them all.
	owners map[*entry[K]]*ownerIndex // guarded by mu
	// follows are the Feeds of the shard's followed keys (follow.go);
	// nil while none is followed, which keeps the shard's hook on its
	// transitions to one nil test.
	follows map[K]*keyFollows // guarded by mu
	books   books             // guarded by mu: what the entries' transitions share (entry.go)
	waiting int               // guarded by mu: waiters over all entries
	closed  bool              // guarded by mu: Close has run over this shard
	shrunk  bool              // guarded by mu: overflow was made anew from a larger map
	// handOffs counts grant passes that decided a waiter, for the yield of
	// the hand-off, and parks waiters queued, for refreshing procs. Both
	// guarded by mu; only ever read modulo 64, so 8 bits wrap in step.
	handOffs uint8
	parks    uint8
	idx      uint32 // the shard's index in t.shards
	_        [64]byte
}

// ownerIndex counts the holds of each owner of an entry with many holders.
type ownerIndex struct {
	counts map[owner.ID]int32
	peak   int // most owners seen in counts since it was made
}

// closer releases what a table registered outside itself: its debug
// registration and watchdog, and its observer. Close stops the watchdog at
// once and releases the rest once the table is drained; the runtime
// releases everything once an unclosed table is unreachable.
type closer struct {
	once sync.Once
	obs  LockerObserver
	dbg  *debugState
}

// stopWatchdog stops the watchdog goroutine, if any.
func (c *closer) stopWatchdog() {
	if c.dbg != nil {
		c.dbg.stopWatchdog()
	}
}

// release stops the watchdog and unregisters from the debug registry and
// the observer, once.
func (c *closer) release() {
	c.once.Do(func() {
		if c.dbg != nil {
			c.dbg.stopWatchdog()
			c.dbg.unregister()
		}
		if c.obs != nil {
			c.obs.Unregister()
		}
	})
}

// shardOf returns key's shard and its tag there (the key's hash, never 0).
// A call hashes its key once: a fast claim stores the tag for inflate,
// and only an Unlock that takes the shard mutex hashes the key again (see
// Guard). It panics with notMade on a zero Locker or Semaphore: the test
// takes the place of the index's bounds check, so it costs nothing.
func (t *table[K]) shardOf(key K) (*shard[K], uint64) {
	h := maphash.Comparable(t.seed, key)
	i := h & t.mask
	if i >= uint64(len(t.shards)) {
		panic(notMade)
	}
	return &t.shards[i], h | 1
}

// tagOf returns key's tag in its shard, as shardOf does.
func (t *table[K]) tagOf(key K) uint64 { return maphash.Comparable(t.seed, key) | 1 }

// notMade is the panic of a call on the zero Locker or Semaphore.
const notMade = "fairlock: a Locker or Semaphore not made by New or NewSemaphore (the zero value is not usable)"

// now reads the clock only when someone will look at the time.
func (t *table[K]) now() time.Time {
	if t.timed {
		return time.Now()
	}
	return time.Time{}
}

// keyText renders key for errors, debug output and warnings: with the
// WithKeyFormatter function if one was given, else by renderKey's rules;
// control characters are escaped either way. It may run user code, so it
// is never called with a shard mutex held.
func (t *table[K]) keyText(key K) string {
	if t.keyFormat != nil {
		return escapeNonPrinting(t.keyFormat(key))
	}
	return renderKey(key)
}

// The two events after which a closing table's registrations (debug,
// watchdog, observer) are released. They stay while holders remain, so a
// Close stuck on a holder can be looked into through debug output and
// metrics, and every Release reaches the observer before Unregister.
const (
	closeGaveUp  = 1 << iota // a Close returned on its ctx's end
	tableDrained             // the last holder or waiter left a closed table
)

// settleRelease records ev and reports whether the other event had
// already happened: then the caller releases the registrations.
func (t *table[K]) settleRelease(ev uint32) bool {
	other := uint32(closeGaveUp|tableDrained) &^ ev
	return t.released.Or(ev)&other != 0
}

// shardDrained drops the count of shards Close waits for.
func (t *table[K]) shardDrained() {
	if t.draining.Add(-1) == 0 {
		close(t.drained)
		if t.settleRelease(tableDrained) {
			// Close gave up before the last holder left; this may run
			// under a shard mutex, and Unregister is the user's code.
			go t.closer.release()
		}
	}
}
