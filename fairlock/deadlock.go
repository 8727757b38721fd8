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
// to wait: the call that would close a cycle is refused. A waiter depends
// on every holder of its key, also one whose mode it could share: in
// strict FIFO it cannot be granted before the waiters ahead of it, which
// wait for those holders.
//
// A Locker key's waiter needs all of its holders to release (an AND
// wait), so one holder that waits for the requester closes a cycle. A
// Semaphore key's waiter may be served by any holder's release (an OR
// wait, in Knapp's terms: "Deadlock detection in distributed databases",
// ACM Computing Surveys, 1987), so the requester is refused only if every
// holder waits for it: never a wait that a holder outside the cycle could
// still end.
type detector[K comparable] struct {
	orWaits bool // a Semaphore's detector
	mu      sync.Mutex
	holders map[K][]owner.ID       // guarded by mu: the holders of each awaited key
	waits   map[owner.ID]map[K]int // guarded by mu: keys each owner waits for, with counts
	peak    int                    // guarded by mu: most entries in holders or waits since made
	refused atomic.Int64           // cycles refused
}

func newDetector[K comparable](orWaits bool) *detector[K] {
	d := &detector[K]{orWaits: orWaits}
	d.reset()
	return d
}

// reset makes the maps anew, so that memory a peak of waiters took is
// given back once they are all gone (Go maps never shrink). d.mu is held,
// or d is new.
func (d *detector[K]) reset() {
	d.holders, d.waits, d.peak = make(map[K][]owner.ID), make(map[owner.ID]map[K]int), 0
}

// wait records that requester is about to wait for key, held by holders
// (awaited: others wait for it already), unless that would close a cycle;
// then it leaves the graph as it was and returns the cycle. The caller
// holds key's shard mutex.
func (d *detector[K]) wait(key K, holders []holder, requester owner.ID, awaited bool) []WaitEdge {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.setHoldersLocked(key, holders)
	w := walk[K]{d: d, target: requester, seen: make(map[owner.ID]walkState)}
	if w.blocked(key) {
		d.refused.Add(1)
		if !awaited {
			delete(d.holders, key)
		}
		return append([]WaitEdge{{Owner: requester, Key: key}}, w.path...)
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

// walk searches the graph for paths back to target, the requester.
type walk[K comparable] struct {
	d      *detector[K]
	target owner.ID
	seen   map[owner.ID]walkState
	path   []WaitEdge // from the holder of the requested key to target
}

// walkState is what a walk knows of an owner it has visited.
type walkState uint8

const (
	unreached walkState = iota + 1 // being walked, or walked without reaching target
	reached                        // reaches target
)

// blocked reports whether key's release depends on target: for an AND
// wait any holder of key reaches target, for an OR wait every holder does.
// When it does, w.path holds one such path.
func (w *walk[K]) blocked(key K) bool {
	holders := w.d.holders[key]
	if len(holders) == 0 {
		return false
	}
	if !w.d.orWaits {
		for _, h := range holders {
			if w.reaches(h) {
				return true
			}
		}
		return false
	}
	start := len(w.path)
	for i, h := range holders {
		mark := len(w.path)
		if !w.reaches(h) {
			w.path = w.path[:start]
			return false
		}
		if i > 0 {
			w.path = w.path[:mark] // report one path: the first holder's
		}
	}
	return true
}

// reaches reports whether o is target or waits, through the graph, for
// something only target can release, appending the edges it follows.
func (w *walk[K]) reaches(o owner.ID) bool {
	if o == w.target {
		return true
	}
	if st, ok := w.seen[o]; ok {
		// Walked already. On the current path it counts as not reaching:
		// a cycle that avoids target does not block target's wait.
		return st == reached
	}
	w.seen[o] = unreached
	for k := range w.d.waits[o] {
		w.path = append(w.path, WaitEdge{Owner: o, Key: k})
		if w.blocked(k) {
			w.seen[o] = reached
			return true
		}
		w.path = w.path[:len(w.path)-1]
	}
	return false
}

// stopWaiting removes one wait of o for key: o was granted it, left the
// queue, or the Locker closed. The caller holds key's shard mutex.
func (d *detector[K]) stopWaiting(key K, o owner.ID) {
	d.mu.Lock()
	if ks := d.waits[o]; ks != nil {
		if ks[key]--; ks[key] <= 0 {
			delete(ks, key)
		}
		if len(ks) == 0 {
			delete(d.waits, o)
		}
	}
	d.shrink()
	d.mu.Unlock()
}

// setHolders records key's holders while it is awaited, and forgets the
// key once it is not. The caller holds key's shard mutex.
func (d *detector[K]) setHolders(key K, holders []holder, awaited bool) {
	d.mu.Lock()
	if awaited {
		d.setHoldersLocked(key, holders)
	} else {
		delete(d.holders, key)
		d.shrink()
	}
	d.mu.Unlock()
}

// setHoldersLocked copies holders' owners into the graph. d.mu is held.
func (d *detector[K]) setHoldersLocked(key K, holders []holder) {
	owners := d.holders[key][:0]
	for _, h := range holders {
		owners = append(owners, h.owner)
	}
	d.holders[key] = owners
}

// shrink remakes the maps once both are empty after a peak large enough
// to matter. d.mu is held.
func (d *detector[K]) shrink() {
	if len(d.holders) == 0 && len(d.waits) == 0 && d.peak > shrinkAt {
		d.reset()
	}
}

// refuseDeadlock logs and returns the error for a refused cycle.
func (t *table[K]) refuseDeadlock(ctx context.Context, op string, key K, id owner.ID, cycle []WaitEdge) (Guard[K], error) {
	derr := &DeadlockError{Cycle: cycle, render: t.renderAny}
	t.logger.Warn("fairlock: deadlock refused", "locker", t.name, "key", t.keyText(key), "owner", id.String(), "cycle", derr.Error())
	return t.fail(ctx, op, key, id, derr, 0, op != "Wait")
}
