package fairlock

import (
	"cmp"
	"iter"
	"math"
	"slices"
	"time"

	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/waitqueue"
)

// This file is the per-key protocol: the state machine of one live key
// (entry) with its transition table, one method per row, in the order of
// a Lock and its Unlock. The methods run under the shard mutex and know
// nothing of the Locker: what they need of the shard comes in its books
// and owner index, and each returns the waiters it decided. lock.go
// drives them for a call (acquire, wait, Unlock, release) and books what
// each decided (settle); the shard (shard.go) finds a key's entry and
// keeps the lock-free fast path.

// entry is the per-key state machine: the holders of one live key and its
// FIFO queue of waiters. Every mode is one rule over units, after
// golang.org/x/sync/semaphore: a key has size units (the Locker's or
// Semaphore's), each holder holds some, and a request fits when its units
// are free.
//
//	request            units      fits when
//	Lock               size       nothing is held
//	RLock              1          no writer holds (readers never fill size)
//	Semaphore.Acquire  w          w units are free
//	Wait               0          nothing is held; it passes, holding nothing
//
// Its transitions, one method each:
//
//	admit    (no entry, or nobody queued and the request fits)  → holder
//	enqueue  (queued behind the others)                         → waiter
//	grant    (after release, cancel): while the head fits, pop it; a
//	         holder for a Lock/RLock/Acquire, nothing for a Wait
//	release  (Unlock): drop the holder with the Guard's token, then grant
//	cancel   (a waiter's context ended): unqueue it, then grant, since
//	         it may have blocked the waiters behind it
//	close    (Close): every waiter decided closed; holders stay
//
// All run under the shard mutex and know nothing of the Locker, its
// detector, observer or debug state: what they need of the shard comes
// in its books, and the owner index in idx. grant, release, cancel and
// close return the waiters they decided, linked through waitState.next;
// settle (lock.go) books them, and the caller signals them once the mutex
// is released (waking a goroutine under the mutex would make the woken one
// block on it).
//
// The grant pass is task-fair FIFO: it grants the head and every waiter
// directly behind it that fits beside the holders, and stops at the first
// that does not, so nothing overtakes a waiter (a reader behind a queued
// writer waits even while readers hold the key). A waiter always queues
// behind a holder: after a grant pass an entry with waiters has holders,
// and an entry with neither is deleted (settle). An entry does not keep
// its key's tag (hash): the shard keeps it beside an inline entry
// (shard.tags), finds an overflow one by its key, and so an entry of a
// string key fits the 80-byte size class.
type entry[K comparable] struct {
	key     K
	slot    int8   // index in the shard's slots, or -1 in its overflow map
	tracked bool   // the deadlock detector tracks this key's holders: it is awaited
	indexed bool   // the shard keeps an owner index of the holders (many holders)
	dead    uint16 // released holders not yet compacted out of holders
	used    int64  // units held: the sum of live holders' units
	// holders are the grants, in grant order, so by increasing token. A
	// released one stays as a tombstone (owner 0) until tombstones are
	// half the slice, or no holder is left: a release costs a binary
	// search, not a copy of the slice, whatever the order of releases.
	holders []holder
	waiters waitqueue.Queue[waitState] // in arrival order
}

// holder is one grant of a key.
type holder struct {
	owner owner.ID
	token uint64    // the grant's token, the Guard's
	units int64     // units held
	info  *holdInfo // timed lockers only: for debug and an observer
}

// holdInfo is what debug and an observer know of a grant. Kept apart so
// that a Locker without them keeps a holder to 32 bytes.
type holdInfo struct {
	since  time.Time // when granted
	stack  []uintptr // WithStacks: the acquiring call's stack
	warned uint      // long-held warnings given for this grant
	// label is the owner's label (owner.LabelOf of the call's ctx, or of
	// the flow a HandOff gave the grant to), debug only: kept here since
	// the label behind owner.ID.Label goes once the flow's contexts are
	// unreachable, which a holder blocked without touching ctx makes them.
	label string
}

// outcome of a wait, decided under the shard mutex by whoever ends it.
type outcome uint8

const (
	waiting   outcome = iota
	granted           // a holder now (or, for a Wait, its turn came)
	closedOut         // the Locker closed
)

// request is one call that asks for a key, as worked out before the shard
// mutex is taken.
type request struct {
	owner owner.ID
	units int64     // 0 for a Wait
	turn  bool      // a Wait: fits only when nothing is held, holds nothing
	now   time.Time // zero unless the Locker is timed
	stack []uintptr // nil unless WithStacks
	label string    // WithDebug only: owner.LabelOf(ctx), read at the call (see holdInfo)
}

// waitState is a queued request; it lives in a waitqueue.Waiter.
type waitState struct {
	request
	outcome outcome // guarded by the shard mutex
	token   uint64  // guarded by the shard mutex: the grant's token
	warned  uint    // guarded by the shard mutex: long-wait warnings given
	next    *waiter // in a list of decided waiters, to be signalled
}

type waiter = waitqueue.Waiter[waitState]

// books is what the transitions of one shard's entries share, kept in
// the shard: the units of a key, the shard's token counter, and its
// recycled holdInfos. Guarded by the shard mutex.
type books struct {
	size  int64  // units per key: lockerUnits for a Locker, n for a Semaphore
	token uint64 // the last token handed out (in slow mode; see shard.go)
	// infos are the recycled holdInfos of a timed table (debug or an
	// observer: grants record a holdInfo), non-nil there even when empty,
	// and nil on any other: timed tells the two apart. A bool would cost
	// every shard eight bytes.
	infos infoFree
}

// timed reports whether grants record a holdInfo.
func (b *books) timed() bool { return b.infos != nil }

// fits reports whether r can be granted beside the current holders of a
// key of size units.
func (e *entry[K]) fits(r *request, size int64) bool {
	if r.turn {
		return e.used == 0
	}
	return r.units <= size-e.used
}

// holding returns the number of live holders.
func (e *entry[K]) holding() int { return len(e.holders) - int(e.dead) }

// vacant reports whether e has neither holder nor waiter: its key is no
// longer live.
func (e *entry[K]) vacant() bool { return e.holding() == 0 && e.waiters.Len() == 0 }

// holds reports whether o holds e in any mode. idx is the shard's owner
// index of e's holders, or nil if it keeps none (few holders).
func (e *entry[K]) holds(o owner.ID, idx map[owner.ID]int32) bool {
	if idx != nil {
		return idx[o] > 0
	}
	for i := range e.holders {
		if e.holders[i].owner == o {
			return true
		}
	}
	return false
}

// admit grants r at once if nobody is queued and r fits; it reports
// whether it did. A Wait admitted holds nothing and has token 0.
func (e *entry[K]) admit(r *request, b *books, idx map[owner.ID]int32) (token uint64, ok bool) {
	if e.waiters.Len() > 0 || !e.fits(r, b.size) {
		return 0, false
	}
	if r.turn {
		return 0, true
	}
	return e.addHolder(r, r.now, b, idx), true
}

// enqueue queues w behind the other waiters.
func (e *entry[K]) enqueue(w *waiter) { e.waiters.PushBack(w) }

// grant runs the grant pass at time now: while the head waiter fits, it
// is popped and made a holder (or, for a Wait, passed). It returns the
// decided waiters, linked through next, oldest first.
func (e *entry[K]) grant(b *books, now time.Time, idx map[owner.ID]int32) (decided *waiter) {
	var list decidedList
	for w := e.waiters.Front(); w != nil && e.fits(&w.Value.request, b.size); w = e.waiters.Front() {
		e.waiters.PopFront()
		w.Value.outcome = granted
		if !w.Value.turn {
			w.Value.token = e.addHolder(&w.Value.request, now, b, idx)
		}
		list.add(w)
	}
	return list.first
}

// release drops the holder with token, then runs the grant pass at time
// now for the waiters it was blocking. It returns the dropped holder's
// owner and grant time (zero on an untimed table) and the decided
// waiters; ok is false, and nothing changed, if no holder has the token
// (a stale Guard).
func (e *entry[K]) release(token uint64, b *books, now time.Time, idx map[owner.ID]int32) (from owner.ID, since time.Time, decided *waiter, ok bool) {
	i, ok := e.indexOf(token)
	if !ok {
		return 0, time.Time{}, nil, false
	}
	h := e.holders[i]
	e.used -= h.units
	if idx != nil {
		if idx[h.owner]--; idx[h.owner] <= 0 {
			delete(idx, h.owner)
		}
	}
	e.holders[i] = holder{token: h.token} // a tombstone keeps the order searchable
	e.dead++
	switch {
	case e.holding() == 0 && cap(e.holders) > maxKeptHolders:
		e.holders, e.dead = nil, 0 // a crowd of readers gone: its slice too
	case e.holding() == 0:
		clear(e.holders)
		e.holders, e.dead = e.holders[:0], 0
	case int(e.dead) > len(e.holders)/2 || e.dead == math.MaxUint16:
		e.holders = slices.DeleteFunc(e.holders, func(h holder) bool { return h.owner == 0 })
		e.dead = 0
		if cap(e.holders) > maxKeptHolders && len(e.holders) < cap(e.holders)/8 {
			e.holders = slices.Clone(e.holders) // a key that stays busy gives a crowd's slice back
		}
	}
	if h.info != nil {
		since = h.info.since
		b.infos.put(h.info) // before the grant pass, which may reuse it
	}
	return h.owner, since, e.grant(b, now, idx), true
}

// cancel unqueues w, whose context ended while it waited, then runs the
// grant pass at time now for the waiters it may have blocked, and returns
// them.
func (e *entry[K]) cancel(w *waiter, b *books, now time.Time, idx map[owner.ID]int32) (decided *waiter) {
	e.waiters.Remove(w)
	return e.grant(b, now, idx)
}

// close decides every waiter closed and returns them, linked through
// next. Holders stay: they end with their Unlock.
func (e *entry[K]) close() (decided *waiter) {
	var list decidedList
	for w := e.waiters.PopFront(); w != nil; w = e.waiters.PopFront() {
		w.Value.outcome = closedOut
		list.add(w)
	}
	return list.first
}

// The transitions' own helpers, and debug's view of an entry.

// addHolder makes r a holder, granted at now, under the shard's next
// token, and counts it in idx if the shard keeps an owner index of e.
func (e *entry[K]) addHolder(r *request, now time.Time, b *books, idx map[owner.ID]int32) uint64 {
	b.token++
	var info *holdInfo
	if b.timed() {
		info = b.infos.get()
		*info = holdInfo{since: now, stack: r.stack, label: r.label}
	}
	e.hold(holder{owner: r.owner, token: b.token, units: r.units, info: info})
	if idx != nil {
		idx[r.owner]++
	}
	return b.token
}

// hold appends h, whose token is above every holder's, to the holders.
func (e *entry[K]) hold(h holder) {
	e.holders = append(e.holders, h)
	e.used += h.units
}

// indexOf returns the index of the live holder with token.
func (e *entry[K]) indexOf(token uint64) (int, bool) {
	i, found := slices.BinarySearchFunc(e.holders, token, func(h holder, t uint64) int { return cmp.Compare(h.token, t) })
	return i, found && e.holders[i].owner != 0
}

// handOff moves the live holder with token to owner to (Guard.HandOff),
// keeping idx's counts, and returns its previous owner; ok is false, and
// nothing changed, if no holder has the token or to is queued on the key.
// On a debug table (debug set) the grant's recorded label becomes label,
// to's.
func (e *entry[K]) handOff(token uint64, to owner.ID, idx map[owner.ID]int32, debug bool, label string) (from owner.ID, ok bool) {
	i, ok := e.indexOf(token)
	if !ok {
		return 0, false
	}
	from = e.holders[i].owner
	if from == to {
		return from, true
	}
	if e.queued(to) {
		return 0, false // to would hold the key and wait for it: a cycle of one
	}
	if info := e.holders[i].info; debug && info != nil {
		info.label = label
	}
	e.holders[i].owner = to
	if idx != nil {
		if idx[from]--; idx[from] <= 0 {
			delete(idx, from)
		}
		idx[to]++
	}
	return from, true
}

// queued reports whether o has a request queued on e, in any mode: a
// walk of the queue.
func (e *entry[K]) queued(o owner.ID) bool {
	for w := range e.waiters.All() {
		if w.Value.owner == o {
			return true
		}
	}
	return false
}

// reset clears the idle e for reuse by another key, keeping its holders
// slice if it is small.
func (e *entry[K]) reset() {
	holders := e.holders[:0]
	if cap(holders) > maxKeptHolders {
		holders = nil
	}
	*e = entry[K]{holders: holders}
}

// maxKeptHolders: an entry keeps its holders slice, once its holders are
// gone, only up to this capacity, so a key once read by many does not
// keep memory at that peak.
const maxKeptHolders = 8

// decidedList is a list of decided waiters linked through their next, in
// the order they were decided.
type decidedList struct{ first, last *waiter }

// add appends w.
func (l *decidedList) add(w *waiter) {
	w.Value.next = nil
	if l.last == nil {
		l.first = w
	} else {
		l.last.Value.next = w
	}
	l.last = w
}

// signal wakes the decided waiters, oldest first. Each next is read before
// its waiter is signalled: once woken, a waiter may be recycled.
func signal(w *waiter) {
	for w != nil {
		next := w.Value.next
		w.Signal()
		w = next
	}
}

// infoFree recycles holdInfos within a shard of a timed locker.
type infoFree []*holdInfo

// maxFreeInfos is how many recycled holdInfos a shard keeps.
const maxFreeInfos = 16

func (f *infoFree) get() *holdInfo {
	if n := len(*f); n > 0 {
		info := (*f)[n-1]
		*f = (*f)[:n-1]
		return info
	}
	return new(holdInfo)
}

func (f *infoFree) put(info *holdInfo) {
	if len(*f) >= maxFreeInfos {
		return
	}
	*info = holdInfo{}
	*f = append(*f, info)
}

// view is debug's read-only view of a live entry: its key, its live
// holders and its waiters. The long-held and long-wait warning counts
// are debug's own bookkeeping, so a view hands them out to be updated.
type view[K comparable] struct{ e *entry[K] }

// key returns the entry's key.
func (v view[K]) key() K { return v.e.key }

// holding and waiting return the numbers of live holders and waiters.
func (v view[K]) holding() int { return v.e.holding() }

func (v view[K]) waiting() int { return v.e.waiters.Len() }

// holders yields the live holders in grant order.
func (v view[K]) holders() iter.Seq[holder] {
	return func(yield func(holder) bool) {
		for _, h := range v.e.holders {
			if h.owner != 0 && !yield(h) {
				return
			}
		}
	}
}

// waiters yields each waiter's request, in arrival order, with its count
// of long-wait warnings.
func (v view[K]) waiters() iter.Seq2[request, *uint] {
	return func(yield func(request, *uint) bool) {
		for w := range v.e.waiters.All() {
			if !yield(w.Value.request, &w.Value.warned) {
				return
			}
		}
	}
}
