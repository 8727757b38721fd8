package fairlock

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fairlock/fairlock/owner"
)

// DeadlockError is the error (wrapped in a *LockError) that a call returns
// with WithDeadlockDetection when waiting would close a wait-for cycle. It
// unwraps to ErrDeadlock. Get it with errors.As.
type DeadlockError struct {
	// Cycle lists the wait-for edges in order, starting with the refused
	// call: Cycle[i].Owner waits for Cycle[i].Key, which is held by
	// Cycle[i+1].Owner; the last edge's key is held by Cycle[0].Owner.
	Cycle []WaitEdge

	render func(any) string // the Locker's key renderer; nil: renderKey
}

// WaitEdge is one edge of a wait-for cycle: Owner waits for Key.
type WaitEdge struct {
	Owner owner.ID
	Key   any
}

// Error describes the cycle, for example
// `fairlock: deadlock: flow#1 waits for "a" held by flow#2, flow#2 waits for "b" held by flow#1`.
func (e *DeadlockError) Error() string {
	render := e.render
	if render == nil {
		render = renderKey
	}
	var b strings.Builder
	b.WriteString("fairlock: deadlock: ")
	for i, edge := range e.Cycle {
		if i > 0 {
			b.WriteString(", ")
		}
		holder := e.Cycle[(i+1)%len(e.Cycle)].Owner
		b.WriteString(edge.Owner.String() + " waits for " + render(edge.Key) + " held by " + holder.String())
	}
	return b.String()
}

// Unwrap returns ErrDeadlock.
func (e *DeadlockError) Unwrap() error { return ErrDeadlock }

// detector keeps the wait-for graph of one Locker or Semaphore. Edges run
// from a waiting owner to the key it waits for, and from that key to each
// of its holders; only awaited keys are in the graph, so the uncontended
// path never touches the detector. Lock order: a shard mutex, then mu.
//
// This is the wait-for graph of database lock managers (Gray and Reuter,
// "Transaction Processing", §7.11), checked eagerly when a call is about
// to wait: the call whose wait could never end is refused. A waiter
// depends on every holder of its key, also one whose mode it could share:
// in strict FIFO it cannot be granted before the waiters ahead of it,
// which wait for those holders.
//
// The check is a graph reduction (Holt, "Some deadlock properties of
// computer systems", ACM Computing Surveys, 1972): an owner that waits for
// nothing can finish and release what it holds; a Locker key is granted
// once every one of its holders can finish (an AND wait), a Semaphore key
// once any can give units back (an OR wait, in Knapp's terms: "Deadlock
// detection in distributed databases", ACM Computing Surveys, 1987); an
// owner can finish once every key it waits for can be granted. The
// requester is refused if, with its new wait, it cannot finish. Only the
// owners reachable from the key take part. For a Locker this finds every
// cycle; for a Semaphore it refuses only waits no release could end, and
// it may let one wait where the releases that remain could not free
// enough units.
type detector[K comparable] struct {
	orWaits bool // a Semaphore's detector
	mu      sync.Mutex
	holders map[K]map[owner.ID]int32 // guarded by mu: the holders of each awaited key
	waits   map[owner.ID]map[K]int   // guarded by mu: keys each owner waits for, with counts
	peak    int                      // guarded by mu: most entries in holders or waits since made
	shrunk  bool                     // guarded by mu: the maps were made anew from larger ones
	refused atomic.Int64             // waits refused
}

func newDetector[K comparable](orWaits bool) *detector[K] {
	d := &detector[K]{orWaits: orWaits}
	d.holders, d.waits = make(map[K]map[owner.ID]int32), make(map[owner.ID]map[K]int)
	return d
}

// wait records that requester is about to wait for key, unless its wait
// could never end; then it leaves the graph as it was and returns a cycle
// through the requester. track says the key is not in the graph yet (it
// gets its first waiter): its holders are copied in. The caller holds
// key's shard mutex.
func (d *detector[K]) wait(key K, holders []holder, requester owner.ID, track bool) []WaitEdge {
	d.mu.Lock()
	defer d.mu.Unlock()
	if track {
		hs := make(map[owner.ID]int32, len(holders))
		for _, h := range holders {
			if h.owner != 0 {
				hs[h.owner]++
			}
		}
		d.holders[key] = hs
	}
	if cycle := d.deadlock(key, requester); cycle != nil {
		d.refused.Add(1)
		if track {
			delete(d.holders, key)
		}
		return cycle
	}
	ks := d.waits[requester]
	if ks == nil {
		ks = make(map[K]int)
		d.waits[requester] = ks
	}
	ks[key]++
	d.peak = max(d.peak, len(d.waits), len(d.holders))
	return nil
}

// deadlock reports a cycle through requester if, once it waits for key
// too, it can never finish; nil if it can. d.mu is held.
func (d *detector[K]) deadlock(key K, requester owner.ID) []WaitEdge {
	// The owners reachable from key, through the keys they wait for.
	reach := map[owner.ID]bool{}
	var stack []owner.ID
	push := func(k K) {
		for h := range d.holders[k] {
			if h != requester && !reach[h] {
				reach[h] = true
				stack = append(stack, h)
			}
		}
	}
	push(key)
	for len(stack) > 0 {
		o := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for k := range d.waits[o] {
			push(k)
		}
	}
	// Reduce: mark every owner that can finish, until nothing changes.
	fin := map[owner.ID]bool{}
	canFinish := func(o owner.ID) bool {
		if o == requester || reach[o] {
			return fin[o]
		}
		return true // waits for nothing here
	}
	granted := func(k K) bool {
		hs := d.holders[k]
		for h := range hs {
			if canFinish(h) == d.orWaits {
				return d.orWaits // OR: one that can finish is enough; AND: one that cannot blocks
			}
		}
		return !d.orWaits || len(hs) == 0
	}
	finishes := func(o owner.ID) bool {
		for k := range d.waits[o] {
			if !granted(k) {
				return false
			}
		}
		return o != requester || granted(key)
	}
	for changed := true; changed; {
		changed = false
		for o := range reach {
			if !fin[o] && finishes(o) {
				fin[o], changed = true, true
			}
		}
		if !fin[requester] && finishes(requester) {
			fin[requester], changed = true, true
		}
	}
	if fin[requester] {
		return nil
	}
	// Report a cycle: from key, through holders that cannot finish, back
	// to the requester.
	path := []WaitEdge{{Owner: requester, Key: key}}
	seen := map[owner.ID]bool{}
	var find func(k K) bool
	find = func(k K) bool {
		if d.holders[k][requester] > 0 {
			return true
		}
		for h := range d.holders[k] {
			if canFinish(h) || seen[h] {
				continue
			}
			seen[h] = true
			for k2 := range d.waits[h] {
				path = append(path, WaitEdge{Owner: h, Key: k2})
				if find(k2) {
					return true
				}
				path = path[:len(path)-1]
			}
		}
		return false
	}
	find(key)
	return path
}

// stopWaiting removes one wait of o for key: o left the queue without a
// grant. The caller holds key's shard mutex.
func (d *detector[K]) stopWaiting(key K, o owner.ID) {
	d.mu.Lock()
	d.dropWait(key, o)
	d.shrink()
	d.mu.Unlock()
}

// settle records what a release or a grant pass did on a key in the
// graph: the holder that released it (0 for none), the waiters the pass
// decided (granted ones become holders; every one stops waiting), and
// whether the key is still awaited (if not, it leaves the graph). The
// caller holds key's shard mutex.
func (d *detector[K]) settle(key K, released owner.ID, decided *waiter, awaited bool) {
	d.mu.Lock()
	hs := d.holders[key]
	if released != 0 && hs != nil {
		if hs[released]--; hs[released] <= 0 {
			delete(hs, released)
		}
	}
	for w := decided; w != nil; w = w.Value.next {
		d.dropWait(key, w.Value.owner)
		if hs != nil && w.Value.outcome == granted && !w.Value.turn {
			hs[w.Value.owner]++
		}
	}
	if !awaited {
		delete(d.holders, key)
	}
	d.shrink()
	d.mu.Unlock()
}

// dropWait removes one wait of o for key. d.mu is held.
func (d *detector[K]) dropWait(key K, o owner.ID) {
	if ks := d.waits[o]; ks != nil {
		if ks[key]--; ks[key] <= 0 {
			delete(ks, key)
		}
		if len(ks) == 0 {
			delete(d.waits, o)
		}
	}
}

// shrink makes the maps anew once they hold an eighth of a peak large
// enough to matter, and once they empty after such a peak, so that the
// memory a peak of waiters took is given back (Go maps never shrink; a map
// made anew at an eighth keeps an eighth's memory until it empties too).
// d.mu is held.
func (d *detector[K]) shrink() {
	n := max(len(d.holders), len(d.waits))
	switch {
	case n == 0 && (d.peak > shrinkAt || d.shrunk):
		d.holders, d.waits = make(map[K]map[owner.ID]int32), make(map[owner.ID]map[K]int)
		d.peak, d.shrunk = 0, false
	case d.peak > shrinkAt && n < d.peak/8:
		holders := make(map[K]map[owner.ID]int32, len(d.holders))
		for k, hs := range d.holders {
			holders[k] = hs
		}
		waits := make(map[owner.ID]map[K]int, len(d.waits))
		for o, ks := range d.waits {
			waits[o] = ks
		}
		d.holders, d.waits, d.peak, d.shrunk = holders, waits, max(len(holders), len(waits)), true
	}
}

// refuseDeadlock logs and returns the error for a refused cycle.
func (t *table[K]) refuseDeadlock(ctx context.Context, op string, key K, id owner.ID, cycle []WaitEdge) (Guard[K], error) {
	derr := &DeadlockError{Cycle: cycle, render: t.renderAny}
	t.logger.Warn("fairlock: deadlock refused", "locker", t.name, "key", t.keyText(key), "owner", id.String(), "cycle", derr.Error())
	return t.fail(ctx, op, key, id, derr, 0, op != "Wait")
}
