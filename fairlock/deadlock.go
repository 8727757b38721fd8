package fairlock

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/fairlock/fairlock/owner"
)

// DeadlockError is the error (wrapped in a *LockError) that Lock returns
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

// detector keeps the wait-for graph of one Locker. Edges run from a waiting
// owner to the key it waits for, and from that key to its holder; only
// keys with waiters have an edge to their holder, so the uncontended path
// never touches the detector. Lock order: a shard mutex, then mu.
//
// This is the textbook wait-for graph of database lock managers (see
// Gray and Reuter, "Transaction Processing", §7.11), checked eagerly on
// every enqueue: the requester that would close a cycle is refused, which
// keeps the graph acyclic, so each check is one walk from the key's holder.
type detector[K comparable] struct {
	mu      sync.Mutex
	holder  map[K]owner.ID         // guarded by mu: holder of each awaited key
	waits   map[owner.ID]map[K]int // guarded by mu: keys each owner waits for, with counts
	refused atomic.Int64           // cycles refused
}

func newDetector[K comparable]() *detector[K] {
	return &detector[K]{holder: make(map[K]owner.ID), waits: make(map[owner.ID]map[K]int)}
}

// enqueue records that requester is about to wait for key, held by holder,
// unless that would close a cycle; then it records nothing and returns the
// cycle. The caller holds key's shard mutex.
func (d *detector[K]) enqueue(key K, holder, requester owner.ID) []WaitEdge {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cycle := d.cycle(key, holder, requester); cycle != nil {
		d.refused.Add(1)
		return cycle
	}
	d.holder[key] = holder
	ks := d.waits[requester]
	if ks == nil {
		ks = make(map[K]int)
		d.waits[requester] = ks
	}
	ks[key]++
	return nil
}

// cycle walks the graph from holder, depth first, looking for requester.
// The graph is acyclic (every enqueue that would close a cycle is refused),
// so visited only saves work where paths rejoin.
func (d *detector[K]) cycle(key K, holder, requester owner.ID) []WaitEdge {
	path := []WaitEdge{{Owner: requester, Key: key}}
	visited := make(map[owner.ID]bool)
	var walk func(o owner.ID) bool
	walk = func(o owner.ID) bool {
		if o == requester {
			return true
		}
		if visited[o] {
			return false
		}
		visited[o] = true
		for k := range d.waits[o] {
			path = append(path, WaitEdge{Owner: o, Key: k})
			if walk(d.holder[k]) {
				return true
			}
			path = path[:len(path)-1]
		}
		return false
	}
	if walk(holder) {
		return path
	}
	return nil
}

// dropWait removes one wait of o for key. d.mu is held.
func (d *detector[K]) dropWait(key K, o owner.ID, stillAwaited bool) {
	if ks := d.waits[o]; ks != nil {
		if ks[key]--; ks[key] <= 0 {
			delete(ks, key)
		}
		if len(ks) == 0 {
			delete(d.waits, o)
		}
	}
	if !stillAwaited {
		delete(d.holder, key)
	}
}

// leave records that waiter o stopped waiting for key without getting it
// (cancelled, or the Locker closed). The caller holds key's shard mutex.
func (d *detector[K]) leave(key K, o owner.ID, stillAwaited bool) {
	d.mu.Lock()
	d.dropWait(key, o, stillAwaited)
	d.mu.Unlock()
}

// handOff records that waiter newHolder was granted key. The caller holds
// key's shard mutex.
func (d *detector[K]) handOff(key K, newHolder owner.ID, stillAwaited bool) {
	d.mu.Lock()
	d.dropWait(key, newHolder, stillAwaited)
	if stillAwaited {
		d.holder[key] = newHolder
	}
	d.mu.Unlock()
}

// refuseDeadlock logs and returns the error for a refused cycle.
func (l *Locker[K]) refuseDeadlock(ctx context.Context, key K, id owner.ID, cycle []WaitEdge) (Guard[K], error) {
	derr := &DeadlockError{Cycle: cycle, render: l.renderAny}
	l.logger.Warn("fairlock: deadlock refused", "locker", l.name, "key", l.keyText(key), "owner", id.String(), "cycle", derr.Error())
	return l.fail(ctx, "Lock", key, id, derr, 0)
}
