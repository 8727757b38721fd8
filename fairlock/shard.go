package fairlock

import (
	"iter"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/owner"
)

// inlineSlots is how many live keys a shard keeps in arrays of its own
// before it spills into a map. Most shards of a busy Locker hold zero to a
// few live keys at any instant, so the uncontended path finds, adds and
// removes its key in the shard's own cache lines, without a map operation
// (uncontended Lock+Unlock in benchmarks/ compare: 86 ns → 68 ns).
const inlineSlots = 8

// shard is one slice of the key space: a state word for the lock-free fast
// path, a mutex and the entries of the live keys that hash to it. Padded so
// neighbouring shards do not share a cache line.
type shard[K comparable] struct {
	// state is the shard's mode and fast grant: see the fast path below.
	state atomic.Uint64
	// fastKey and fastOwner are the fast holder's key and owner. The fast
	// claimant writes them between its claiming CAS and the Store that
	// publishes them; others read them only after seeing that Store. A
	// fast Unlock leaves them in place (clearing them would race the next
	// claim), so a shard keeps a reference to its last fast key until the
	// next claim or inflate: at most one key per shard.
	fastKey   K
	fastOwner owner.ID

	l    *Locker[K]
	fast bool // the Locker takes the fast path: no debug or observer
	mu   sync.Mutex

	live     int                    // guarded by mu: live keys, inline and overflow
	tags     [inlineSlots]uint64    // guarded by mu: hash|1 of slots[i]'s key; 0 for an empty slot
	slots    [inlineSlots]*entry[K] // guarded by mu
	overflow map[K]*entry[K]        // guarded by mu: live keys beyond the slots; nil until needed
	peak     int                    // guarded by mu: most overflow keys since overflow was made
	free     []*entry[K]            // guarded by mu: recycled entries, at most maxFree
	waiting  int                    // guarded by mu: waiters over all entries
	gen      uint64                 // guarded by mu: last grant generation handed out (in slow mode)
	handOffs uint64                 // guarded by mu: grants passed from a holder to a waiter
	closed   bool                   // guarded by mu: Close has run over this shard
	_        [64]byte
}

// The fast path.
//
// A shard is in one of two modes, told by its state word. In fast mode no
// key of the shard has an entry and at most one key is held, by a fast
// grant: Lock claims an idle shard with one compare-and-swap and Unlock
// frees it with another, without the mutex. In slow mode (slowBit) the
// mutex-guarded entries are the whole truth and the state word is left
// alone. Anything other than an uncontended grant on an idle shard (a second
// key on the shard, a waiter, TryLock refused, Locked, Close) takes the
// mutex and switches the shard to slow mode first, turning a fast grant
// into an ordinary entry (inflate). The shard returns to fast mode when the
// mutex holder leaves it with no live key (unlock).
//
// The word holds the generation of the shard's last grant above three flag
// bits, so a Guard of a fast grant ({shard, generation}) frees the shard
// only while that very grant is current, as an entry's generation does for
// slow grants. Generations are one counter for both modes: s.gen takes over
// the word's generation on inflate and hands it back on unlock. 61 bits of
// generation do not wrap in the life of a process.
//
// Publishing the fast holder's key and owner takes a third atomic
// operation (claim with claimingBit, write, Store without it): they cannot
// be written before the claim, where racing claimants would overwrite each
// other, and Go has no cheaper release-only store. Lock and Unlock without
// contention thus cost three atomic operations and no mutex, where taking
// the shard mutex twice costs four plus an entry's bookkeeping (benchmarks/
// compare on the 2-core CI machine: 68 ns before, 26 ns with the fast
// path). A mutex holder that finds a claim in progress yields until it is
// published: the claimant is between two stores.
//
// Fast grants are used only when nothing needs more than the holder's key
// and owner: Lockers with debug or an observer (which need each grant's
// time) keep every shard in slow mode for good. Deadlock detection does not
// need more: its wait-for graph has edges only for awaited keys, and a
// waiter inflates the fast grant, learning its holder, before it asks.
const (
	heldBit     = 1 << 0 // fast mode: a fast grant holds the shard
	claimingBit = 1 << 1 // with heldBit: fastKey and fastOwner not yet published
	slowBit     = 1 << 2 // slow mode: the mutex-guarded entries are the truth
	genShift    = 3      // the generation sits above the flags
)

// lock takes s.mu and puts s in slow mode, inflating a fast grant into an
// entry. Every mutex-side operation starts with it and ends with unlock.
func (s *shard[K]) lock() {
	for {
		s.mu.Lock()
		if s.inflate() {
			return
		}
		// A fast claim is between its CAS and its publishing Store.
		s.mu.Unlock()
		if testHookClaimWait != nil {
			testHookClaimWait()
		}
		runtime.Gosched()
	}
}

// testHookClaimWait, if set by a test, runs each time lock yields to a fast
// claim in progress.
var testHookClaimWait func()

// inflate switches s to slow mode; s.mu is held. It reports false if a fast
// claim is in progress, whose key and owner cannot be read yet.
func (s *shard[K]) inflate() bool {
	for {
		st := s.state.Load()
		switch {
		case st&slowBit != 0:
			return true
		case st&claimingBit != 0:
			return false
		case st&heldBit != 0:
			gen := st >> genShift
			if !s.state.CompareAndSwap(st, gen<<genShift|slowBit) {
				continue // the fast holder unlocked meanwhile
			}
			// The holder's Unlock now fails its CAS and comes to the mutex.
			s.gen = gen
			e := s.newEntry(s.fastKey)
			e.grant(s.fastOwner, gen, time.Time{}, nil)
			s.insert(e, s.l.tagOf(e.key))
			var zero K
			s.fastKey, s.fastOwner = zero, 0 // keep no reference to the key
			return true
		default:
			if s.state.CompareAndSwap(st, st|slowBit) {
				s.gen = st >> genShift
				return true
			}
		}
	}
}

// unlock returns s to fast mode if it has no live key, then releases s.mu.
func (s *shard[K]) unlock() {
	if s.live == 0 && s.fast && !s.closed {
		s.state.Store(s.gen << genShift)
	}
	s.mu.Unlock()
}

// newEntry takes a recycled entry, or a new one, for key. s.mu is held.
func (s *shard[K]) newEntry(key K) *entry[K] {
	var e *entry[K]
	if n := len(s.free); n > 0 {
		e = s.free[n-1]
		s.free = s.free[:n-1]
	} else {
		e = new(entry[K])
		if s.l.timed {
			e.hold = new(holdInfo)
		}
	}
	e.key = key
	return e
}

const (
	maxFree = 16 // recycled entries kept per shard
	// shrinkAt: an overflow map that grew past this many keys is dropped
	// once it empties, since Go maps never shrink.
	shrinkAt = 1024
)

// find returns key's entry, or nil. tag is the key's hash|1. s.mu is held.
func (s *shard[K]) find(key K, tag uint64) *entry[K] {
	for i := range s.tags {
		if s.tags[i] == tag && s.slots[i].key == key {
			return s.slots[i]
		}
	}
	if len(s.overflow) > 0 {
		return s.overflow[key]
	}
	return nil
}

// insert adds e, whose key has no entry yet. s.mu is held.
func (s *shard[K]) insert(e *entry[K], tag uint64) {
	s.live++
	for i := range s.tags {
		if s.tags[i] == 0 {
			s.tags[i], s.slots[i], e.slot = tag, e, i
			return
		}
	}
	if s.overflow == nil {
		s.overflow = make(map[K]*entry[K])
	}
	s.overflow[e.key] = e
	e.slot = -1
	s.peak = max(s.peak, len(s.overflow))
}

// delete removes e. s.mu is held.
func (s *shard[K]) delete(e *entry[K]) {
	s.live--
	if e.slot >= 0 {
		s.tags[e.slot], s.slots[e.slot] = 0, nil
		return
	}
	delete(s.overflow, e.key)
	if len(s.overflow) == 0 && s.peak > shrinkAt {
		s.overflow, s.peak = nil, 0
	}
}

// entries yields every live entry. s.mu is held for the whole walk and
// the shard must not change during it.
func (s *shard[K]) entries() iter.Seq[*entry[K]] {
	return func(yield func(*entry[K]) bool) {
		for _, e := range s.slots {
			if e != nil && !yield(e) {
				return
			}
		}
		for _, e := range s.overflow {
			if !yield(e) {
				return
			}
		}
	}
}
