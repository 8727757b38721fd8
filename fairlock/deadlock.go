package fairlock

import (
	"iter"
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
	//
	// A call can also be refused behind a knot it is not part of, a
	// cycle that no check refused: a Semaphore's check lets in waits that
	// may still be served (a holder that can finish may give units back),
	// and a flow whose goroutines wait for two keys at once can be put in
	// a cycle by grants (docs/deadlocks.md, Limits). A call that would
	// wait behind such a knot is refused too, though it is on no cycle.
	// Cycle then runs from the refused call into the knot and around it:
	// the last edge's key is held by the Owner of an earlier edge, the
	// one where the cycle begins, as Error says.
	Cycle []WaitEdge

	loop   int              // the edge whose Owner holds the last edge's key
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
		next := i + 1
		if next == len(e.Cycle) {
			next = e.loop
		}
		holder := e.Cycle[next].Owner
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
// requester is refused if, with its new wait (its owner then waits for the
// key too), the key can never be granted. Only the owners reachable from
// the requester take part. For a Locker this finds every
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
// could never end; then it leaves the graph as it was and returns the
// error that says why (see deadlock). track says the key is not in the graph yet (it
// gets its first waiter): its holders are copied in. The caller holds
// key's shard mutex.
func (d *detector[K]) wait(key K, holders []holder, requester owner.ID, track bool) *DeadlockError {
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
	if refused := d.deadlock(key, requester); refused != nil {
		d.refused.Add(1)
		if track {
			delete(d.holders, key)
		}
		return refused
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

// deadlock reports why key could never be granted to requester once it
// waits for it: a cycle through requester, or, if none (a Semaphore's
// knot that releases formed after its waits were let in), the path from
// requester into a cycle. It returns nil if key can be granted, also when
// requester's owner is stuck in another wait (several goroutines of one
// flow): this call's wait can still end. d.mu is held.
//
// The reduction runs on a worklist, so its cost is linear in the owners
// and edges reachable from requester: an owner is queued once every key it
// waits for can be granted, and a key's grant is decided by counting its
// holders that cannot finish yet (AND) or by the first that can (OR).
func (d *detector[K]) deadlock(key K, requester owner.ID) *DeadlockError {
	r := reduction[K]{d: d, requester: requester, owners: map[owner.ID]int32{}, keys: map[K]int32{}}
	// The owners reachable from requester through the keys they wait
	// for; an owner outside them waits for nothing here and can finish.
	r.addOwner(requester)
	for i := 0; i < len(r.nodes); i++ {
		o := r.nodes[i].id
		for k := range r.waitsOf(o, key) {
			for h := range d.holders[k] {
				r.addOwner(h)
			}
		}
	}
	// Each key waited for in that part of the graph: who waits for it,
	// and whether it can be granted before any of them finishes.
	var ready []int32
	for i := range r.nodes {
		for k := range r.waitsOf(r.nodes[i].id, key) {
			ki := r.keyWait(k)
			r.keyNodes[ki].waiters = r.link(int32(i), r.keyNodes[ki].waiters)
			if !r.keyNodes[ki].granted {
				r.nodes[i].blocked++
			}
		}
		if r.nodes[i].blocked == 0 {
			ready = append(ready, int32(i))
		}
	}
	// Reduce: an owner that can finish releases what it holds.
	for len(ready) > 0 {
		o := ready[len(ready)-1]
		ready = ready[:len(ready)-1]
		if o == 0 { // the requester
			return nil
		}
		for l := r.nodes[o].holds; l >= 0; l = r.links[l].next {
			kn := &r.keyNodes[r.links[l].to]
			if kn.granted {
				continue
			}
			if kn.pending--; kn.pending > 0 && !d.orWaits {
				continue // AND: other holders cannot finish yet
			}
			kn.granted = true
			for w := kn.waiters; w >= 0; w = r.links[w].next {
				wn := &r.nodes[r.links[w].to]
				if wn.blocked--; wn.blocked == 0 {
					ready = append(ready, r.links[w].to)
				}
			}
		}
	}
	if !r.stuck(key) {
		return nil
	}
	return r.report(key)
}

// reduction is the state of one deadlock check: the owners reachable from
// the requester (nodes, the requester first) and the keys they wait for
// (keyNodes), with the edges between them as lists threaded through links.
type reduction[K comparable] struct {
	d         *detector[K]
	requester owner.ID
	owners    map[owner.ID]int32 // index in nodes
	nodes     []ownerNode
	keys      map[K]int32 // index in keyNodes
	keyNodes  []keyNode
	links     []link
}

// ownerNode is one reachable owner in a reduction.
type ownerNode struct {
	id owner.ID
	// blocked counts the keys the owner waits for that cannot be granted
	// yet; it reaches 0 when the owner can finish.
	blocked int32
	holds   int32 // list of the awaited keys it holds (keyNodes indexes); -1: none
}

// keyNode is one awaited key in a reduction.
type keyNode struct {
	granted bool  // the key can be granted: its waiters need not wait for it
	pending int32 // holders among the reachable owners that have not finished
	waiters int32 // list of the reachable owners that wait for it (nodes indexes); -1: none
}

// link is one element of a list in a reduction's links.
type link struct{ to, next int32 }

// link prepends to to the list at head and returns the new head.
func (r *reduction[K]) link(to, head int32) int32 {
	r.links = append(r.links, link{to: to, next: head})
	return int32(len(r.links) - 1)
}

// addOwner adds o to the reachable owners, once.
func (r *reduction[K]) addOwner(o owner.ID) {
	if _, ok := r.owners[o]; !ok {
		r.owners[o] = int32(len(r.nodes))
		r.nodes = append(r.nodes, ownerNode{id: o, holds: -1})
	}
}

// waitsOf yields the keys o waits for, with key for the requester.
func (r *reduction[K]) waitsOf(o owner.ID, key K) iter.Seq[K] {
	return func(yield func(K) bool) {
		ks := r.d.waits[o]
		if o == r.requester && ks[key] == 0 && !yield(key) {
			return
		}
		for k := range ks {
			if !yield(k) {
				return
			}
		}
	}
}

// keyWait returns k's index in keyNodes, counting its holders on first
// use. Every holder of a key a reachable owner waits for is reachable, so
// only a key with no holder is granted from the start.
func (r *reduction[K]) keyWait(k K) int32 {
	if ki, ok := r.keys[k]; ok {
		return ki
	}
	ki := int32(len(r.keyNodes))
	kn := keyNode{waiters: -1}
	hs := r.d.holders[k]
	for h := range hs {
		if oi, reachable := r.owners[h]; reachable {
			kn.pending++
			r.nodes[oi].holds = r.link(ki, r.nodes[oi].holds)
		}
	}
	kn.granted = kn.pending == 0
	r.keys[k] = ki
	r.keyNodes = append(r.keyNodes, kn)
	return ki
}

// stuck reports whether k cannot be granted; blockedHolder reports
// whether o holds k and cannot finish. Both after the reduction.
func (r *reduction[K]) stuck(k K) bool {
	ki, ok := r.keys[k]
	return ok && !r.keyNodes[ki].granted
}

func (r *reduction[K]) blockedHolder(o owner.ID, k K) bool {
	oi, ok := r.owners[o]
	return ok && r.nodes[oi].blocked > 0 && r.d.holders[k][o] > 0
}

// report returns the edges that keep key from being granted to the
// requester, after a reduction that left key stuck. It looks first for a
// cycle through the requester along keys that cannot be granted; failing
// that, it follows such keys from the requester until an owner repeats,
// which yields the path into the knot and the knot's cycle.
func (r *reduction[K]) report(key K) *DeadlockError {
	path := []WaitEdge{{Owner: r.requester, Key: key}}
	seenOwner, seenKey := map[owner.ID]bool{}, map[K]bool{}
	var find func(k K) bool
	find = func(k K) bool {
		if r.blockedHolder(r.requester, k) {
			return true
		}
		if seenKey[k] {
			return false
		}
		seenKey[k] = true
		for h := range r.d.holders[k] {
			if seenOwner[h] || !r.blockedHolder(h, k) {
				continue
			}
			seenOwner[h] = true
			for k2 := range r.d.waits[h] {
				if !r.stuck(k2) {
					continue
				}
				path = append(path, WaitEdge{Owner: h, Key: k2})
				if find(k2) {
					return true
				}
				path = path[:len(path)-1]
			}
		}
		return false
	}
	if find(key) {
		return &DeadlockError{Cycle: path}
	}
	// A knot the requester is not part of. Every stuck key has a holder
	// that cannot finish, and every such owner waits for a stuck key, so
	// the walk ends on an owner it has passed.
	at := map[owner.ID]int{r.requester: 0}
	for k := key; ; {
		var next owner.ID
		for h := range r.d.holders[k] {
			if r.blockedHolder(h, k) {
				next = h
				break
			}
		}
		if i, ok := at[next]; ok || next == 0 { // next == 0 cannot happen: see above
			return &DeadlockError{Cycle: path, loop: i}
		}
		at[next] = len(path)
		for k2 := range r.d.waits[next] {
			if r.stuck(k2) {
				k = k2
				break
			}
		}
		path = append(path, WaitEdge{Owner: next, Key: k})
	}
}

// settle records what a transition did on a key in the graph: the
// holder that released it (0 for none), the owner of a waiter that left
// the queue without a grant (0 for none), the waiters the grant pass
// decided (granted ones become holders; every one stops waiting), and
// whether the key is still awaited (if not, it leaves the graph). The
// caller holds key's shard mutex.
func (d *detector[K]) settle(key K, released, left owner.ID, decided *waiter, awaited bool) {
	d.mu.Lock()
	if left != 0 {
		d.dropWait(key, left)
	}
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

// handOff records that one hold of key moved from owner from to owner to
// (Guard.HandOff). The caller holds key's shard mutex.
func (d *detector[K]) handOff(key K, from, to owner.ID) {
	d.mu.Lock()
	if hs := d.holders[key]; hs != nil {
		if hs[from]--; hs[from] <= 0 {
			delete(hs, from)
		}
		hs[to]++
	}
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

// graphShrinkAt: maps of the graph that grew past this many keys or
// owners are made anew once they empty, as a shard's overflow map is
// (shrinkAt), since Go maps never shrink.
const graphShrinkAt = 1024

// shrink makes the maps anew once they hold an eighth of a peak large
// enough to matter, and once they empty after such a peak, so that the
// memory a peak of waiters took is given back (Go maps never shrink; a map
// made anew at an eighth keeps an eighth's memory until it empties too).
// d.mu is held.
func (d *detector[K]) shrink() {
	n := max(len(d.holders), len(d.waits))
	switch {
	case n == 0 && (d.peak > graphShrinkAt || d.shrunk):
		d.holders, d.waits = make(map[K]map[owner.ID]int32), make(map[owner.ID]map[K]int)
		d.peak, d.shrunk = 0, false
	case d.peak > graphShrinkAt && n < d.peak/8:
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
