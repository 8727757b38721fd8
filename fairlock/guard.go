package fairlock

// Guard is a held lock on one key, returned by Lock and TryLock. It is a
// small value (no allocation); copies of it are the same grant. The zero
// Guard holds nothing.
type Guard[K comparable] struct {
	s   *shard[K] // nil for the zero Guard
	gen uint64    // the grant this Guard stands for: unique in its shard
	key K
}

// Unlock releases the lock and, if anyone waits for the key, hands it to
// the longest-waiting one. It never blocks beyond the shard mutex: a grant
// that took the lock-free fast path (see Locker.Lock) and was never looked
// at since is released with one compare-and-swap; any other takes the
// shard mutex. With GOMAXPROCS=1, one hand-off in 64 per shard yields the
// processor (runtime.Gosched) before waking the new holder, so that a hot
// key's chain of wake-ups cannot keep other runnable goroutines off it
// (yieldEvery in locker.go).
//
// Unlock is idempotent: a second Unlock of the same Guard, or of a copy,
// does nothing, even if the key has since been granted to someone else
// (each grant has its own generation, and a Guard only releases its own).
// Such stale Unlocks are counted in debug output. The zero Guard's Unlock
// is a no-op. Any goroutine may call Unlock, also after Close.
func (g Guard[K]) Unlock() {
	if g.s == nil {
		return
	}
	if g.s.state.CompareAndSwap(g.gen<<genShift|heldBit, g.gen<<genShift) {
		return // a fast grant, still in fast mode: nobody waits
	}
	if !g.release(true) {
		g.s.l.doubleUnlocks.Add(1)
	}
}

// Key returns the key g locks (the zero K for the zero Guard).
func (g Guard[K]) Key() K { return g.key }
