package fairlock

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/waitqueue"
)

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
// All transitions run under the shard mutex; an entry knows nothing of the
// Locker, its detector, observer or debug state. Each returns the waiters
// it decided, linked through waitState.next, for the caller to signal once
// the mutex is released (waking a goroutine under the mutex would make the
// woken one block on it).
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
// The grant pass is task-fair FIFO: it grants the head and every waiter
// directly behind it that fits beside the holders, and stops at the first
// that does not, so nothing overtakes a waiter (a reader behind a queued
// writer waits even while readers hold the key). A waiter always queues
// behind a holder: after a grant pass an entry with waiters has holders,
// and an entry with neither is deleted by the caller.
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
	token uint64    // the grant's token: the Guard's generation
	units int64     // units held
	info  *holdInfo // timed lockers only: for debug and an observer
}

// holdInfo is what debug and an observer know of a grant. Kept apart so
// that a Locker without them keeps a holder to 32 bytes.
type holdInfo struct {
	since  time.Time // when granted
	stack  []uintptr // WithStacks: the acquiring call's stack
	warned uint      // long-held warnings given for this grant
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
}

// waitState is a queued request; it lives in a waitqueue.Waiter.
type waitState struct {
	request
	outcome outcome // guarded by the shard mutex
	token   uint64  // guarded by the shard mutex: the grant's token
	warned  uint    // long-wait warnings given
	next    *waiter // in a list of decided waiters, to be signalled
}

type waiter = waitqueue.Waiter[waitState]

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
func (e *entry[K]) admit(r *request, size int64, gen *uint64, infos *infoFree, idx map[owner.ID]int32) (token uint64, ok bool) {
	if e.waiters.Len() > 0 || !e.fits(r, size) {
		return 0, false
	}
	if r.turn {
		return 0, true
	}
	return e.addHolder(r, gen, infos.get(), idx), true
}

// addHolder makes r a holder under the next token of gen, and counts it in
// idx if the shard keeps one for e.
func (e *entry[K]) addHolder(r *request, gen *uint64, info *holdInfo, idx map[owner.ID]int32) uint64 {
	*gen++
	if info != nil {
		*info = holdInfo{since: r.now, stack: r.stack}
	}
	e.holders = append(e.holders, holder{owner: r.owner, token: *gen, units: r.units, info: info})
	e.used += r.units
	if idx != nil {
		idx[r.owner]++
	}
	return *gen
}

// grant runs the grant pass at time now: while the head waiter fits, it
// is popped and made a holder (or, for a Wait, passed). infos supplies a
// holdInfo per grant for timed lockers (nil otherwise). It returns the
// decided waiters, linked through next, oldest first.
func (e *entry[K]) grant(size int64, gen *uint64, now time.Time, infos *infoFree, idx map[owner.ID]int32) (decided *waiter) {
	var list decidedList
	for w := e.waiters.Front(); w != nil && e.fits(&w.Value.request, size); w = e.waiters.Front() {
		e.waiters.PopFront()
		w.Value.outcome = granted
		if !w.Value.turn {
			r := w.Value.request
			r.now = now
			w.Value.token = e.addHolder(&r, gen, infos.get(), idx)
		}
		list.add(w)
	}
	return list.first
}

// release drops the holder with token and returns it; ok is false if no
// holder has it (a stale Guard). idx is as for holds. The caller runs the
// grant pass.
func (e *entry[K]) release(token uint64, idx map[owner.ID]int32) (h holder, ok bool) {
	i, found := slices.BinarySearchFunc(e.holders, token, func(h holder, t uint64) int { return cmp.Compare(h.token, t) })
	if !found || e.holders[i].owner == 0 {
		return holder{}, false
	}
	h = e.holders[i]
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
	return h, true
}

// closeWaiters decides every waiter closed and returns them, linked
// through next.
func (e *entry[K]) closeWaiters() (decided *waiter) {
	var list decidedList
	for w := e.waiters.PopFront(); w != nil; w = e.waiters.PopFront() {
		w.Value.outcome = closedOut
		list.add(w)
	}
	return list.first
}

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

// idle reports whether e has neither holder nor waiter: its key is no
// longer live.
func (e *entry[K]) idle() bool { return e.holding() == 0 && e.waiters.Len() == 0 }

// infoFree recycles holdInfos within a shard of a timed locker. A nil
// *infoFree (an untimed locker) hands out nil.
type infoFree []*holdInfo

// maxFreeInfos is how many recycled holdInfos a shard keeps.
const maxFreeInfos = 16

func (f *infoFree) get() *holdInfo {
	if f == nil {
		return nil
	}
	if n := len(*f); n > 0 {
		info := (*f)[n-1]
		*f = (*f)[:n-1]
		return info
	}
	return new(holdInfo)
}

func (f *infoFree) put(info *holdInfo) {
	if f == nil || info == nil || len(*f) >= maxFreeInfos {
		return
	}
	*info = holdInfo{}
	*f = append(*f, info)
}
