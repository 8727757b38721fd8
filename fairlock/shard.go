package fairlock

import (
	"iter"
	"runtime"
	"time"

	"github.com/fairlock/fairlock/owner"
)

// This file is a shard's operations: the lock-free fast path on its state
// word, and under its mutex the live keys' entries and owner indexes. They
// report what changed (insert, remove) and never call the table.

// The fast path.
//
// A shard is in one of two modes, told by its state word. In fast mode no
// key of the shard has an entry and at most one key is held, by a fast
// grant: Lock, RLock or Acquire claims an idle shard with one
// compare-and-swap (claim) and Unlock frees it with another (unlockFast),
// without the mutex; idle is the one test of "idle". In slow mode
// (slowBit) the mutex-guarded entries are the whole truth and the state
// word is left alone. Anything other than an uncontended grant on an
// idle shard (a second key on the shard, a second holder or a waiter,
// TryLock refused, Locked, Close) takes the mutex and switches the shard
// to slow mode first, turning a fast grant into an ordinary entry
// (inflate). The shard returns to fast mode when the mutex holder leaves
// it with no live key (unlock).
//
// The word holds the token of the shard's last grant above three flag
// bits, so a Guard of a fast grant ({shard, token}) frees the shard only
// while that very grant is current, as a holder's token does for slow
// grants. Tokens are one counter for both modes: s.books.token takes over
// the word's on inflate and hands it back on unlock, so every grant of a key,
// in either mode, has a larger token than the grants before it. 61 bits
// of token do not wrap in the life of a process.
//
// Publishing the fast holder's key, tag, owner and units takes a third atomic
// operation (claim with claimingBit, write, Store without it): they cannot
// be written before the claim, where racing claimants would overwrite each
// other, and Go has no cheaper release-only store. A mutex holder that
// finds a claim in progress backs off until it is published (lock).
//
// Fast grants are used only when nothing needs more than the holder's key,
// owner and units: tables with debug or an observer (which need each
// grant's time) keep every shard in slow mode for good. Deadlock detection
// does not need more: its wait-for graph has edges only for awaited keys,
// and a waiter inflates the fast grant, learning its holder, before it
// asks.
const (
	heldBit     = 1 << 0 // fast mode: a fast grant holds the shard
	claimingBit = 1 << 1 // with heldBit: fastKey, fastTag, fastOwner, fastUnits not yet published
	slowBit     = 1 << 2 // slow mode: the mutex-guarded entries are the truth
	tokenShift  = 3      // the token sits above the flags
)

// idle reports whether the state word st says "idle in fast mode":
// nothing is held or awaited on the whole shard, so a grant there
// overtakes nobody.
func idle(st uint64) bool { return st&(heldBit|slowBit) == 0 }

// claim grants key, whose tag is tag, to id for units on an idle shard;
// it reports false, having changed nothing, if the shard is not idle or
// another claim won. (A Wait on an idle shard needs no claim: it holds
// nothing, and its turn is now.)
func (s *shard[K]) claim(key K, tag uint64, id owner.ID, units int64) (token uint64, ok bool) {
	st := s.state.Load()
	if !idle(st) {
		return 0, false
	}
	token = st>>tokenShift + 1
	if !s.state.CompareAndSwap(st, token<<tokenShift|heldBit|claimingBit) {
		return 0, false
	}
	s.fastKey, s.fastTag, s.fastOwner, s.fastUnits = key, tag, id, units
	s.state.Store(token<<tokenShift | heldBit) // publish
	return token, true
}

// unlockFast frees the shard from the fast grant with token; it reports
// false, having changed nothing, if that grant is not the shard's current
// fast grant (the shard went to slow mode, or the grant is stale).
func (s *shard[K]) unlockFast(token uint64) bool {
	return s.state.CompareAndSwap(token<<tokenShift|heldBit, token<<tokenShift)
}

// lock takes s.mu and puts s in slow mode, inflating a fast grant into an
// entry. Every mutex-side operation starts with it and ends with unlock.
//
// A claim caught between its two stores is waited for: by yielding first,
// since the claimant is usually running and two stores from done, then,
// if it was preempted there, by sleeping with exponential back-off, so that
// a descheduled claimant costs its shard's other callers latency but no
// CPU.
func (s *shard[K]) lock() {
	for tries := 0; ; tries++ {
		s.mu.Lock()
		if s.inflate() {
			return
		}
		s.mu.Unlock()
		if testHookClaimWait != nil {
			testHookClaimWait()
		}
		if tries < claimYields {
			runtime.Gosched()
		} else {
			time.Sleep(time.Microsecond << min(tries-claimYields, maxClaimBackoff))
		}
	}
}

const (
	claimYields     = 4  // yields before lock sleeps on an unpublished claim
	maxClaimBackoff = 10 // longest sleep: 1µs << 10
)

// testHookClaimWait, if set by a test, runs each time lock backs off from
// a fast claim in progress.
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
			token := st >> tokenShift
			if !s.state.CompareAndSwap(st, token<<tokenShift|slowBit) {
				continue // the fast holder unlocked meanwhile
			}
			// The holder's Unlock now fails its CAS and comes to the mutex.
			s.books.token = token
			e := s.newEntry(s.fastKey)
			e.hold(holder{owner: s.fastOwner, token: token, units: s.fastUnits})
			// The shard had no live key, so it becomes live here; nobody
			// needs to hear it: the only listener, debug's watchdog, runs
			// on tables that keep every shard in slow mode.
			s.insert(e, s.fastTag)
			var zero K
			s.fastKey, s.fastOwner = zero, 0 // keep no reference to the key
			return true
		default:
			if s.state.CompareAndSwap(st, st|slowBit) {
				s.books.token = st >> tokenShift
				var zero K
				s.fastKey, s.fastOwner = zero, 0 // the last fast grant's, released
				return true
			}
		}
	}
}

// unlock returns s to fast mode if it has no live key (and its table is
// neither timed nor closed, and no key of s is followed: see the fast
// path), then releases s.mu.
func (s *shard[K]) unlock() {
	if s.live == 0 && !s.books.timed() && !s.closed && s.follows == nil {
		s.state.Store(s.books.token << tokenShift) // idle
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

// insert adds e, whose key has tag and no entry yet, and reports whether
// the shard became live: e is its only live key. s.mu is held.
func (s *shard[K]) insert(e *entry[K], tag uint64) (becameLive bool) {
	s.live++
	for i := range s.tags {
		if s.tags[i] == 0 {
			s.tags[i], s.slots[i], e.slot = tag, e, int8(i)
			return s.live == 1
		}
	}
	if s.overflow == nil {
		s.overflow = make(map[K]*entry[K])
	}
	s.overflow[e.key] = e
	e.slot = -1
	s.peak = max(s.peak, len(s.overflow))
	return s.live == 1
}

// remove deletes the idle entry e and recycles it, and reports whether
// the shard became idle: e was its last live key. s.mu is held.
func (s *shard[K]) remove(e *entry[K]) (becameIdle bool) {
	s.live--
	if e.indexed {
		s.dropIndex(e)
	}
	if e.slot >= 0 {
		s.tags[e.slot], s.slots[e.slot] = 0, nil
	} else {
		delete(s.overflow, e.key)
		s.shrinkOverflow()
	}
	e.reset()
	if len(s.free) < maxFree {
		s.free = append(s.free, e)
	}
	return s.live == 0
}

// shrinkOverflow makes the overflow map anew once it holds an eighth of a
// peak large enough to matter, and drops it once it empties if it ever
// held such a peak: Go maps never shrink, and neither one key held long nor
// the last keys of a burst may keep a burst's memory. A map that only ever
// held a few keys is kept when it empties, so that a shard whose keys spill
// over now and then does not make a map each time. s.mu is held.
func (s *shard[K]) shrinkOverflow() {
	switch {
	case len(s.overflow) == 0:
		if s.peak > shrinkAt || s.shrunk {
			s.overflow, s.peak, s.shrunk = nil, 0, false
		}
	case s.peak > shrinkAt && len(s.overflow) < s.peak/8:
		m := make(map[K]*entry[K], len(s.overflow))
		for k, e := range s.overflow {
			m[k] = e
		}
		s.overflow, s.peak, s.shrunk = m, len(m), true
	}
}

// indexAt is how many live holders make an entry's reentrancy check use
// an owner index instead of scanning; the index goes below indexAt/4.
const indexAt = 32

// ownerCounts returns the counts of e's owner index, or nil if e has
// none. s.mu is held.
func (s *shard[K]) ownerCounts(e *entry[K]) map[owner.ID]int32 {
	if !e.indexed {
		return nil
	}
	return s.owners[e].counts
}

// indexOwners returns the counts of e's owner index, building the index
// if e has many holders, or nil if it has few. s.mu is held.
func (s *shard[K]) indexOwners(e *entry[K]) map[owner.ID]int32 {
	if e.indexed || e.holding() < indexAt {
		return s.ownerCounts(e)
	}
	if s.owners == nil {
		s.owners = make(map[*entry[K]]*ownerIndex)
	}
	ix := &ownerIndex{counts: countOwners(e)}
	ix.peak = len(ix.counts)
	s.owners[e], e.indexed = ix, true
	return ix.counts
}

// countOwners returns a new map of the holds of each owner of e.
func countOwners[K comparable](e *entry[K]) map[owner.ID]int32 {
	counts := make(map[owner.ID]int32, e.holding())
	for _, h := range e.holders {
		if h.owner != 0 {
			counts[h.owner]++
		}
	}
	return counts
}

// dropIndexIfFew, after a release, drops e's owner index once its holders
// are few again, and makes it anew once it counts an eighth of a peak
// above shrinkAt owners (Go maps never shrink: a crowd that thins out but
// does not leave would keep the crowd's memory). s.mu is held.
func (s *shard[K]) dropIndexIfFew(e *entry[K]) {
	if !e.indexed {
		return
	}
	if e.holding() < indexAt/4 {
		s.dropIndex(e)
		return
	}
	ix := s.owners[e]
	ix.peak = max(ix.peak, len(ix.counts))
	if ix.peak > shrinkAt && len(ix.counts) < ix.peak/8 {
		ix.counts = countOwners(e)
		ix.peak = len(ix.counts)
	}
}

// dropIndex drops e's owner index, and the map of indexes once it is
// empty: it only shrinks by deletion, and a burst of keys read by many
// must not leave it at its peak. s.mu is held.
func (s *shard[K]) dropIndex(e *entry[K]) {
	delete(s.owners, e)
	e.indexed = false
	if len(s.owners) == 0 {
		s.owners = nil
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

// views yields a read-only view of every live entry, for debug. s.mu is
// held for the whole walk and the shard must not change during it.
func (s *shard[K]) views() iter.Seq[view[K]] {
	return func(yield func(view[K]) bool) {
		for e := range s.entries() {
			if !yield(view[K]{e}) {
				return
			}
		}
	}
}
