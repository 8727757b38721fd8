package redislock

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
	"github.com/redis/go-redis/v9"
)

// The Locker's state: the Locker and Semaphore types, which New and
// NewSemaphore (redislock.go) make and Close ends; the core they share;
// the calls (Guard) it keeps per key; and the few helpers that change
// that bookkeeping under core.mu. The components (queue.go, janitor.go,
// hub.go, session.go, debug.go, guard.go, acquire.go) are methods on
// these types that read and change this state; this file refers to none
// of them.

// Locker is a fair, strict-FIFO keyed lock with shared holds, shared by
// every process that makes one with the same Redis and prefix. Make one
// with New; the zero Locker is not usable. All methods are safe for
// concurrent use. It is a keylock.RWLocker; every Lease it returns is a
// *Guard.
//
// A Locker holds one pub/sub connection and three goroutines (the
// subscription's dispatch, the session renewal, and a janitor that
// retries removals that failed), one more while a renewal round is in
// flight, and one goroutine per enqueueing script still running for a
// call that returned. Close stops them all.
type Locker struct{ c *core }

// Semaphore is a keyed weighted semaphore of n units per key, head-of-line
// FIFO across every process that makes one with the same Redis, prefix
// and n. Make one with NewSemaphore. It is a keylock.Semaphore; every
// Lease it returns is a *Guard. It holds what a Locker holds.
type Semaphore struct{ c *core }

var (
	_ keylock.RWLocker  = (*Locker)(nil)
	_ keylock.Semaphore = (*Semaphore)(nil)
	_ keylock.Lease     = (*Guard)(nil)
)

// core is a Locker's or a Semaphore's state.
type core struct {
	client  redis.UniversalClient
	prefix  string
	esc     string // escape(prefix)
	channel string // where grants are announced
	kind    string // "redislock.Locker" or "redislock.Semaphore"
	units   int64  // the semaphore's n; 0 for a Locker
	name    string
	ttl     time.Duration
	ttlMs   string // ttl in ms, as the scripts take it
	logger  *slog.Logger
	sid     string // the session id: random, hex
	obs     fairlock.LockerObserver
	obsMu   sync.RWMutex // read-held around each report to obs; see Close
	obsGone bool         // guarded by obsMu: Close unregistered obs
	unreg   func()       // removes the debug registration; nil without WithDebug
	pubsub  *redis.PubSub

	seq atomic.Uint64 // numbers the entries this core writes

	bg      context.Context    // the background goroutines' context
	stopBg  context.CancelFunc // cancels bg: Close, after the calls have ended
	wg      sync.WaitGroup     // the background goroutines
	closing <-chan struct{}    // closed by the first Close: shut.Done()
	shut    context.Context    // ended by the first Close
	shutNow context.CancelFunc
	closed  chan struct{} // closed when the first Close returns
	kick    chan struct{} // cap 1: wakes the janitor
	reread  chan struct{} // cap 1: the subscription is back: re-read the queues
	ready   chan struct{} // closed when the first subscription is confirmed

	mu       sync.Mutex // guards everything below, and the Guards' fields marked so
	isClosed bool
	keys     map[string]*keyState // user key → this process's calls on it
	entries  map[string]*Guard    // entry → its call, while it may be in Redis
	janitor  map[string]cleanup   // entry → removal still to make
	calls    int                  // calls in progress
	held     int                  // grants not yet unlocked
	pending  int                  // enqueueing scripts running for a call that returned
	idle     chan struct{}        // cap 1: signalled when calls, held or pending drops
	doubles  int64                // Unlocks of a Guard already unlocked
	reentry  int64                // calls refused with ErrReentrant
}

// keyState is this process's view of one lock key.
type keyState struct {
	guards []*Guard // calls on the key, in arrival order
	// deadline is when the session's marker on the key may have expired
	// on the server: the send time of the last script that set or
	// renewed it, plus the TTL less a tenth. Zero before the first.
	deadline time.Time
}

// cleanup is an entry the janitor (janitor.go) removes.
type cleanup struct {
	key   string
	until time.Time // keep removing until then (a script that may still run); zero: once
}

// The states of a call. A call is queued from its start until it is
// granted (held) or ends without a grant (released); a grant is held
// until Unlock, Close, or, for Wait, the instant it is taken.
const (
	queued = iota
	held
	released
)

// The modes of an entry, as the scripts spell them.
const (
	modeExclusive = 'x'
	modeShared    = 'r'
	modeUnits     = 'u'
	modeWait      = 'w'
)

// Guard is one grant of a key, returned by Lock, TryLock, RLock,
// TryRLock, Acquire and TryAcquire; its Unlock releases it. Its methods
// are safe for concurrent use, and Unlock may be called from any
// goroutine. A nil *Guard holds nothing: Unlock does nothing, Token is 0,
// Lost is nil.
type Guard struct {
	c     *core
	key   string
	owner owner.ID
	mode  byte  // modeExclusive, modeShared, modeUnits or modeWait
	w     int64 // units asked for (1 outside a Semaphore)
	since time.Time
	lost  chan struct{} // closed when a held grant is lost
	sem   chan struct{} // cap 1: one Unlock at a time

	// The call's entry. Written under core.mu while the call is queued;
	// fixed once the Guard is returned.
	member string
	token  uint64

	// Guarded by core.mu.
	state      int
	grantedAt  time.Time
	wake       chan struct{} // cap 1: there is news for the waiting call
	confirmed  bool          // the enqueue's reply arrived: the entry was written
	granted    bool          // the entry holds the key (reply or notice)
	gone       bool          // the entry is gone, or its session on the key is
	releasing  bool          // Unlock has begun
	lostClosed bool          // lost is closed
}

// signal wakes the call waiting on g. core.mu is held.
func (g *Guard) signal() {
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// loseLocked marks g's entry gone; a held grant is lost: its Lost channel
// closes. c.mu is held.
func (c *core) loseLocked(g *Guard) {
	g.gone = true
	if g.state == held && !g.releasing && !g.lostClosed {
		g.lostClosed = true
		close(g.lost)
	}
	g.signal()
}

// forgetLocked removes g from the local view of its key. c.mu is held.
func (c *core) forgetLocked(g *Guard) {
	ks := c.keys[g.key]
	if ks == nil {
		return
	}
	if i := slices.Index(ks.guards, g); i >= 0 {
		ks.guards = slices.Delete(ks.guards, i, i+1)
	}
	if len(ks.guards) == 0 {
		delete(c.keys, g.key)
	}
}

// signalIdle wakes a waiting Close. c.mu is held.
func (c *core) signalIdle() {
	select {
	case c.idle <- struct{}{}:
	default:
	}
}
