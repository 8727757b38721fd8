package backend

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
)

// The Core's state: the Core type, which a backend's New makes (New) and
// starts (Start) and Close ends; the calls it keeps per key; and the few
// helpers that change that bookkeeping under its mutex. The components
// (janitor.go, detach.go, acquire.go, unlock.go, renew.go, notice.go,
// close.go, debug.go) are methods on it.

// Config is what a backend tells the kit about the Locker it makes.
type Config struct {
	// Package is the backend's package name ("redislock"): it starts the
	// kit's messages and log records.
	Package string
	// Kind is the Locker's type as debug output shows it
	// ("redislock.Locker", "etcdlock.Semaphore").
	Kind string
	// Size is a Semaphore's units per key; 0 for a Locker.
	Size int64
	// DefaultName is the stem of the name of a Locker built without
	// WithName: "redislock" names them redislock-1, redislock-2, …
	// counting per stem in this process.
	DefaultName string
}

// Core is one Locker's or Semaphore's shared half: the calls of this
// process per key, the owner table behind ErrReentrant, sessions and
// their deadlines, the janitor, Close and its drain, the observer and
// the debug views. A backend's Locker holds one and an Engine; the zero
// Core is not usable.
type Core struct {
	engine  Engine
	pkg     string // Config.Package
	kind    string
	size    int64
	name    string
	ttl     time.Duration
	logger  *slog.Logger
	obs     fairlock.LockerObserver
	obsMu   sync.RWMutex // read-held around each report to obs; see Close
	obsGone bool         // guarded by obsMu: Close unregistered obs
	unreg   func()       // removes the debug registration; nil without WithDebug
	observe fairlock.Observer
	debug   bool
	process keylock.Process // this Locker's, as its engine records it with each call

	// Closing: an open Core goes once through three stages, each marked
	// by one context or channel that ends with it, in this order.
	//  1. closing ends when Close begins (under mu): calls fail with
	//     ErrClosed, queued calls leave the queue, writes in progress are
	//     given up.
	//  2. bg ends once the calls have ended and the grants are released
	//     (or Close's ctx ended): the kit's and the engine's goroutines
	//     stop, and with them background removals.
	//  3. closed is closed when the first Close returns: later Closes
	//     return, and Unlock has no entry left to remove.
	closing    context.Context
	beginClose context.CancelFunc
	bg         context.Context
	stopBg     context.CancelFunc
	closed     chan struct{}
	wg         sync.WaitGroup // the kit's and the engine's goroutines (Go)
	kick       chan struct{}  // cap 1: wakes the janitor
	reread     chan struct{}  // cap 1: the engine lost notices: Check now
	renewKick  chan struct{}  // cap 1: the sessions changed: recompute the renewal timer

	// mu guards everything below, the Calls' and Sessions' fields marked
	// so, and whatever the engine guards with it (Mu).
	mu       sync.Mutex
	keys     map[string][]*Call  // key → this process's calls on it, in arrival order
	ids      map[string]*Call    // entry id → its call, while the entry may be in the engine
	sessions map[string]*Session // session id → the session, while it lives
	janitor  map[string]cleanup  // entry id → removal still to make
	calls    int                 // calls in progress
	grants   int                 // grants not yet unlocked
	pending  int                 // writes and removals still running for a call that returned
	idle     chan struct{}       // cap 1: signalled when calls, grants or pending drops
	doubles  int64               // Unlocks of a grant already unlocked
	reentry  int64               // calls refused with ErrReentrant
	lostN    int                 // grants lost and not yet reported to the Observer (reportLost)
}

// names counts the Lockers made per default-name stem.
var names struct {
	mu sync.Mutex
	n  map[string]int64
}

// New returns a Core for a Locker or Semaphore configured by cfg and s
// (NewSettings). It starts nothing: the backend sets up its engine, which
// may start goroutines of its own with Go, then calls Start, or Abort if
// its setup failed.
func New(cfg Config, s Settings) *Core {
	name := s.Name
	if name == "" {
		names.mu.Lock()
		if names.n == nil {
			names.n = make(map[string]int64)
		}
		names.n[cfg.DefaultName]++
		name = cfg.DefaultName + "-" + strconv.FormatInt(names.n[cfg.DefaultName], 10)
		names.mu.Unlock()
	}
	k := &Core{
		pkg:       cfg.Package,
		kind:      cfg.Kind,
		size:      cfg.Size,
		name:      name,
		ttl:       s.TTL,
		logger:    s.Logger,
		observe:   s.Observer,
		debug:     s.Debug,
		process:   keylock.LocalProcess(name),
		closed:    make(chan struct{}),
		kick:      make(chan struct{}, 1),
		reread:    make(chan struct{}, 1),
		renewKick: make(chan struct{}, 1),
		keys:      make(map[string][]*Call),
		ids:       make(map[string]*Call),
		sessions:  make(map[string]*Session),
		janitor:   make(map[string]cleanup),
		idle:      make(chan struct{}, 1),
	}
	k.closing, k.beginClose = context.WithCancel(context.Background())
	k.bg, k.stopBg = context.WithCancel(context.Background())
	return k
}

// Start starts the kit's goroutines (the session renewal and the
// janitor) with e as the Core's engine, and registers the Locker with its
// Observer and, with WithDebug, the debug registry.
func (k *Core) Start(e Engine) {
	k.engine = e
	if k.observe != nil {
		k.obs = k.observe.Register(k.name, k.stats)
	}
	if k.debug {
		k.unreg = k.register()
	}
	k.Go(k.renewLoop)
	k.Go(k.janitorLoop)
}

// Abort stops what Go started, for a backend whose setup failed before
// Start.
func (k *Core) Abort() {
	k.beginClose()
	k.stopBg()
	k.wg.Wait()
}

// Go runs fn on a goroutine of its own that Close waits for; fn must
// return once Background ends.
func (k *Core) Go(fn func()) {
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		fn()
	}()
}

// Mu returns the Core's mutex, which guards the kit's state and which
// the engine may use for its own (the Locked methods run under it).
func (k *Core) Mu() *sync.Mutex { return &k.mu }

// Background returns the context of the Locker's background work: it
// ends once Close has let every call end.
func (k *Core) Background() context.Context { return k.bg }

// Closing returns a context that ends when Close begins.
func (k *Core) Closing() context.Context { return k.closing }

// Name returns the Locker's name.
func (k *Core) Name() string { return k.name }

// Process returns where this Locker's calls come from (its host, process
// id and name): what an engine records with each entry it writes, so
// that a listing in any process names it (Lister).
func (k *Core) Process() keylock.Process { return k.process }

// Size returns a Semaphore's units per key; 0 for a Locker.
func (k *Core) Size() int64 { return k.size }

// TTL returns the session TTL the Locker was configured with.
func (k *Core) TTL() time.Duration { return k.ttl }

// Logger returns where the Locker logs.
func (k *Core) Logger() *slog.Logger { return k.logger }

// signalIdle wakes a waiting Close. k.mu is held.
func (k *Core) signalIdle() {
	select {
	case k.idle <- struct{}{}:
	default:
	}
}

// forgetLocked removes c from the local view of its key. k.mu is held.
func (k *Core) forgetLocked(c *Call) {
	cs := k.keys[c.key]
	if i := slices.Index(cs, c); i >= 0 {
		cs = slices.Delete(cs, i, i+1)
	}
	if len(cs) == 0 {
		delete(k.keys, c.key)
	} else {
		k.keys[c.key] = cs
	}
}

// retireLocked takes c's current entry out of the kit's books: its id, its
// session's count, the engine's watch. k.mu is held.
func (k *Core) retireLocked(c *Call) {
	if k.engine != nil {
		k.engine.UnwatchLocked(c)
	}
	if c.id != "" && k.ids[c.id] == c {
		delete(k.ids, c.id)
	}
	k.uncountLocked(c)
	c.confirmed = false
	c.session = nil
}

// uncountLocked takes c out of its session's count of calls, which keeps
// the session renewed; a session that is not persistent goes with its
// last call. k.mu is held.
func (k *Core) uncountLocked(c *Call) {
	if s := c.session; s != nil && c.counted {
		c.counted = false
		s.calls--
		if s.calls == 0 && !s.persistent && k.sessions[s.id] == s {
			delete(k.sessions, s.id)
		}
	}
}

// loseLocked marks c's entry gone; a held grant is lost: its Lost channel
// closes. k.mu is held.
func (k *Core) loseLocked(c *Call, now time.Time) {
	c.gone = true
	k.uncountLocked(c)
	if c.state == held && !c.releasing {
		k.closeLostLocked(c, now)
	}
	c.signal()
}

// closeLostLocked closes c's Lost channel, once, and counts the loss for
// the Observer: the renewal loop, woken here, reports it once the mutex
// is released (an Observer's methods run outside the Locker's mutexes).
// k.mu is held.
func (k *Core) closeLostLocked(c *Call, now time.Time) {
	if c.lostClosed {
		return
	}
	c.closeLost(now)
	if k.obs != nil {
		k.lostN++
		k.kickRenewal()
	}
}

// reportLost reports the grants lost since the last call to the Observer:
// one acquisition result fairlock.Lost each. It takes the Core's mutex.
func (k *Core) reportLost() {
	if k.obs == nil {
		return
	}
	k.mu.Lock()
	n := k.lostN
	k.lostN = 0
	k.mu.Unlock()
	for range n {
		k.report(errLost, 0, true)
	}
}
