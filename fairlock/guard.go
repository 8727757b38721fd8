package fairlock

// Guard is a grant of one key, returned by Lock, RLock, TryLock, TryRLock,
// Acquire and TryAcquire. It is a value of two words and a K, passed
// without allocation; copies of it are the same grant. The zero Guard
// holds nothing.
type Guard[K comparable] struct {
	s   *shard[K] // nil for the zero Guard
	gen uint64    // the grant's token: unique in its shard, so in its key
	key K
}

// Unlock ends the grant and, if waiters queued on the key now fit, hands
// the key to them in arrival order. It never blocks beyond the shard
// mutex: a grant that took the lock-free fast path and was never looked at
// since is released with one compare-and-swap; any other takes the shard
// mutex. With GOMAXPROCS=1, one hand-off in 64 per shard yields the
// processor (runtime.Gosched) before waking the new holder, so that a hot
// key's chain of wake-ups cannot keep other runnable goroutines off it.
//
// Unlock is idempotent: a second Unlock of the same Guard, or of a copy,
// does nothing, even if the key has since been granted to someone else
// (each grant has its own token, and a Guard releases only its own). Such
// stale Unlocks are counted in debug output. The zero Guard's Unlock is a
// no-op. Any goroutine may call Unlock, also after Close.
func (g Guard[K]) Unlock() {
	if g.s == nil {
		return
	}
	if g.s.state.CompareAndSwap(g.gen<<genShift|heldBit, g.gen<<genShift) {
		return // a fast grant, still in fast mode: nobody waits
	}
	if !g.release(true) {
		g.s.t.doubleUnlocks.Add(1)
	}
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
func (g Guard[K]) Token() uint64 { return g.gen }
