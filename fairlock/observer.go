package fairlock

import "time"

// Result is the outcome of a call that asks for a key (Lock, TryLock,
// RLock, TryRLock, Acquire, TryAcquire), as reported to an Observer.
type Result uint8

// The results, one per kind of return. Their String values are the
// fairlock.result metric attribute values.
const (
	Acquired         Result = iota // the call got the lock
	Reentrant                      // ErrReentrant
	Canceled                       // the call's context was canceled, whatever its cause (context.WithCancelCause)
	DeadlineExceeded               // the call's context's deadline passed, whatever its cause
	WouldBlock                     // ErrWouldBlock from TryLock, TryRLock or TryAcquire
	Closed                         // ErrClosed
	Deadlock                       // ErrDeadlock
	InvalidKey                     // ErrInvalidKey
	InvalidWeight                  // ErrInvalidWeight
	Lost                           // ErrLost: a distributed backend lost the call's grant or queue place (its session expired) and could not queue it again
	Error                          // the engine of a distributed backend failed (unreachable, refused the request): no grant, for a reason outside the lock
	numResults
)

var resultNames = [numResults]string{
	"acquired", "reentrant", "canceled", "deadline_exceeded", "would_block", "closed", "deadlock",
	"invalid_key", "invalid_weight", "lost", "error",
}

// String returns the result's metric attribute value, such as "acquired".
func (r Result) String() string {
	if r < numResults {
		return resultNames[r]
	}
	return "unknown"
}

// Results lists every Result in order; an Observer can build one attribute
// set per result up front from it. Each call allocates a new slice.
func Results() []Result {
	rs := make([]Result, numResults)
	for i := range rs {
		rs[i] = Result(i)
	}
	return rs
}

// Stats is a Locker's or Semaphore's live counts at one instant.
// Locker.Stats and Semaphore.Stats return it; an Observer reads it through
// the function Register is given.
type Stats struct {
	Keys    int // keys with a holder (every awaited key has one)
	Waiters int // queued waiters over all keys
}

// An Observer receives the metrics of Lockers and Semaphores. New and
// NewSemaphore call Register once per Locker or Semaphore built
// WithObserver, after it is fully built; one Observer may serve many.
// Package otelmetrics implements it for OpenTelemetry.
type Observer interface {
	// Register returns the recorder for the Locker or Semaphore named
	// name. stats reads its live counts; it takes each shard mutex in
	// turn, so call it from a metrics collection callback, not per
	// operation. stats holds only a weak reference: once the Locker is
	// unreachable it reports zero counts.
	Register(name string, stats func() Stats) LockerObserver
}

// A LockerObserver records one Locker's or Semaphore's events. Its
// methods are called after the internal mutexes are released and must not
// call back into the Locker. Acquire and Release are called from the
// goroutine that made the call; Unregister from Close, from the last
// Unlock after a Close that gave up (on a goroutine of its own), or from a
// runtime cleanup once an unclosed Locker is unreachable.
// They must be safe for concurrent use and should not allocate.
type LockerObserver interface {
	// Acquire reports the result of one call that asks for a key (Lock,
	// TryLock, RLock, TryRLock, Acquire, TryAcquire; not Wait, which
	// acquires nothing) and how long it waited in the key's queue (0 for a
	// call that never queued).
	Acquire(r Result, wait time.Duration)
	// Release reports one Unlock and how long that grant was held.
	Release(hold time.Duration)
	// Unregister is called once: after Close, once no key is held and
	// every Release has been reported, or, for a Locker dropped without
	// Close, by its cleanup. stats must not be called after it returns.
	// A call made after Close that fails with ErrClosed may still report
	// its Acquire around or after Unregister; a recorder must tolerate it.
	Unregister()
}
