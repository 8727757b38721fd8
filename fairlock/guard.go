package fairlock

import "github.com/fairlock/fairlock/owner"

// Guard is a grant of one key, returned by Lock, RLock, TryLock, TryRLock,
// Acquire and TryAcquire. It is a value of two words and a K, passed
// without allocation; copies of it are the same grant. The zero Guard
// holds nothing.
type Guard[K comparable] struct {
	// Unlock and release are in lock.go, with the rest of a call's path
	// through the per-key protocol.
	//
	// A Guard does not carry its key's hash (tag): an Unlock that takes
	// the shard mutex hashes the key again, and a lock-free one needs no
	// hash. A third word would take a Guard of a string key past four
	// words, the most that cmd/compile keeps in registers (ssa.CanSSA),
	// and every Lock would return its Guard through memory, which costs
	// the uncontended cycle more than the hash costs the mutex path.
	s     *shard[K] // nil for the zero Guard
	token uint64    // the grant's token: unique in its shard, so in its key
	key   K
}

// Key returns the key g holds (the zero K for the zero Guard).
func (g Guard[K]) Key() K { return g.key }

// Token returns g's fencing token: a number greater than the token of
// every earlier grant of the same key by the same Locker or Semaphore, in
// any mode, on the lock-free path too, and even after the key went idle
// and was granted anew; shared holders granted together get distinct
// tokens. The zero Guard's token is 0. Reading it costs nothing: it is
// the grant's identity, which Unlock checks.
//
// A store that a holder writes to can refuse writes from a grant that has
// since ended, the fencing of Martin Kleppmann's "How to do distributed
// locking" (2016): send the token with each write, and have the store keep
// the largest token it has accepted for the key and refuse any smaller.
// A holder paused past its grant (a long GC, a stuck network call) then
// cannot overwrite the work of the holder after it. Tokens of different
// keys, or of different Lockers, are not comparable.
func (g Guard[K]) Token() uint64 { return g.token }

// HandOff moves the grant to owner to, the goroutine or flow that will
// release it, and reports whether it did: false for the zero Guard, a
// Guard already unlocked, to == 0, or a to that has a call queued on g's
// key in any mode (Lock, RLock, Acquire, Wait); nothing changes then.
// The last is refused because to would then hold the key and wait for
// it: a wait-for cycle of one owner, which the deadlock detector would
// report against every later call that waits for the key, and which
// would have the key granted twice to to once g is unlocked.
//
// A grant belongs to the owner of the call that took it (owner.Of of its
// ctx), and a call of that owner on the same key returns ErrReentrant at
// once. That is right when the owner itself would release the key, and
// wrong when it hands the Guard to another goroutine that releases it
// later, the way a sync.Mutex is handed over: the first goroutine's next
// Lock of the key should wait for the other to unlock. HandOff says so.
// Give the worker a flow of its own and hand the grant to it before
// handing the Guard over, so no Lock of the old owner can come between:
//
//	g, err := l.Lock(ctx, key)
//	...
//	wctx := owner.NewContext(context.Background())
//	g.HandOff(owner.Of(wctx)) // the grant is wctx's flow's from now on
//	go func() { defer g.Unlock(); work(wctx) }()
//	g2, err := l.Lock(ctx, key) // waits for the worker's Unlock
//
// From then on reentrancy checks, deadlock detection and debug output
// see the grant as to's, and a call by to on the key returns
// ErrReentrant. The grant's token, mode and place are unchanged; any
// goroutine may still Unlock it. With WithDebug, dumps and warnings show
// to's label (owner.ID.Label, read when HandOff is called: call it while
// to's context is reachable, as above).
//
// HandOff takes the shard mutex (a grant of the lock-free path becomes an
// ordinary one, released under the mutex too) and walks the key's queue
// of waiters; with WithDeadlockDetection, on a key others wait for, it
// also takes the detector's mutex and moves the hold in its wait-for
// graph. It allocates, at most, the new owner's entry in the maps that
// count the holders of a key many hold (or that others wait for), and,
// for a grant of the lock-free path on a shard with no recycled key
// state, that key's state (one entry, as the shard's first contended
// call makes).
func (g Guard[K]) HandOff(to owner.ID) bool {
	if g.s == nil || to == 0 {
		return false
	}
	s := g.s
	tag := s.t.tagOf(g.key)
	debug := s.t.dbg != nil
	var label string
	if debug {
		label = to.Label() // to's flow, while the caller has its context
	}
	s.lock() // inflates a fast grant into an entry
	defer s.unlock()
	e := s.find(g.key, tag)
	if e == nil {
		return false
	}
	from, ok := e.handOff(g.token, to, s.ownerCounts(e), debug, label)
	if !ok {
		return false
	}
	if from != to && e.tracked {
		s.t.detector.handOff(g.key, from, to)
	}
	return true
}
