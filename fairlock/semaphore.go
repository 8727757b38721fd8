package fairlock

import (
	"context"
	"fmt"
)

// Semaphore is a keyed weighted semaphore: every key has n units, and each
// Acquire takes some of a key's units until its Guard's Unlock gives them
// back. Make one with NewSemaphore; the zero Semaphore is not usable, and a
// Semaphore must not be copied after first use. All methods are safe for
// concurrent use.
//
// It is head-of-line FIFO, like golang.org/x/sync/semaphore: grants on a
// key follow arrival order, and a request at the head that does not fit
// blocks the smaller ones behind it, which could fit, until it is granted
// or leaves. This keeps large requests from starving behind a stream of
// small ones. A request that leaves the queue (its context ends) re-runs
// the grant for those behind it, the case golang/go#63615 fixed in x/sync.
//
// Options mean what they mean for a Locker: name, shards, debug, stacks,
// long-held warnings, logger, observer and deadlock detection. For deadlock
// detection a Semaphore waiter is blocked for good only if no holder of the
// key can ever finish: any one of them may release units. So a Semaphore
// refuses only certain deadlocks, never a wait that could end.
type Semaphore[K comparable] struct {
	t table[K] // first: a Semaphore and its table share one allocation
}

// NewSemaphore returns an open Semaphore whose every key has n units. It
// allocates the shards and, with WithLongHeld, starts one watchdog
// goroutine (see New). It panics if n < 1.
func NewSemaphore[K comparable](n int64, opts ...Option) *Semaphore[K] {
	if n < 1 {
		panic(fmt.Sprintf("fairlock: NewSemaphore with %d units; want at least 1", n))
	}
	s := new(Semaphore[K])
	s.t.init(semaphoreKind, n, opts)
	return s
}

// Acquire takes w units of key for the owner of ctx and returns the Guard
// that gives them back. It blocks until every request that queued on key
// before it has been granted and w units are free, then takes them; it
// never overtakes an earlier request, even one that waits for more units
// than are free.
//
// Acquire returns an error wrapping ErrInvalidWeight at once if w < 1 or
// w > n, ErrReentrant at once if the owner already holds units of key (a
// second Acquire by the same flow could deadlock behind a queued larger
// one), the context's error, ErrClosed, ErrDeadlock (with
// WithDeadlockDetection) or ErrInvalidKey, as Locker.Lock does; the error
// is a *LockError with Op "Acquire". An uncontended Acquire and its Unlock
// allocate nothing and, on an idle shard, take the lock-free path.
func (s *Semaphore[K]) Acquire(ctx context.Context, key K, w int64) (Guard[K], error) {
	sh, tag := s.t.shardOf(key)
	if w < 1 || w > s.t.size {
		return s.invalidWeight(ctx, "Acquire", key, w)
	}
	return s.t.acquire(ctx, "Acquire", sh, key, tag, w, askBlock)
}

// TryAcquire takes w units of key for the owner of ctx if it can do so at
// once: nobody is queued on key and w units are free. It never blocks
// beyond the shard mutex. It returns Acquire's errors, with ErrWouldBlock
// when the units are not free or others are queued.
func (s *Semaphore[K]) TryAcquire(ctx context.Context, key K, w int64) (Guard[K], error) {
	sh, tag := s.t.shardOf(key)
	if w < 1 || w > s.t.size {
		return s.invalidWeight(ctx, "TryAcquire", key, w)
	}
	return s.t.acquire(ctx, "TryAcquire", sh, key, tag, w, askTry)
}

// invalidWeight fails a call that asked for w units, outside 1 to n: a
// *LockError wrapping ErrInvalidWeight whose message names w and n.
func (s *Semaphore[K]) invalidWeight(ctx context.Context, op string, key K, w int64) (Guard[K], error) {
	mustContext(ctx, op)
	g, err := s.t.fail(ctx, op, key, 0, ErrInvalidWeight, 0, true)
	err.(*LockError).detail = fmt.Sprintf("asked for %d; the semaphore has %s per key", w, count(s.t.size, "unit"))
	return g, err
}

// Waiters returns the number of Acquire calls queued on key at this
// instant, not counting holders. It takes one shard mutex and allocates
// nothing.
func (s *Semaphore[K]) Waiters(key K) int { return s.t.waiters(key) }

// Len returns the number of keys that have a holder or a waiter; 0 once
// all work is done. It takes each shard mutex in turn.
func (s *Semaphore[K]) Len() int { return s.t.Len() }

// Stats returns the Semaphore's live counts: the keys with a holder and
// the Acquire calls queued over all keys, as Locker.Stats does. It takes
// each shard mutex in turn and allocates nothing.
func (s *Semaphore[K]) Stats() Stats { return s.t.stats() }

// Calls returns key's calls at this instant, as Locker.Calls does, with
// each call's units.
func (s *Semaphore[K]) Calls(key K) []KeyCall { return s.t.calls(key) }

// Name returns the Semaphore's name: WithName's, or the one NewSemaphore
// generated.
func (s *Semaphore[K]) Name() string { return s.t.name }

// Close closes the Semaphore as Locker.Close closes a Locker: later calls
// return ErrClosed, queued waiters wake with ErrClosed, and Close waits
// until every holder has given its units back or ctx is done, then
// returns an error naming how many keys are still held and wrapping ctx's
// error. It stops the watchdog at once and unregisters from package debug
// and the Observer once nothing is held. It is safe to call more than
// once; a nil ctx means context.Background.
func (s *Semaphore[K]) Close(ctx context.Context) error { return s.t.close(ctx) }
