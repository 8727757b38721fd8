package backend

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
)

// The kit's data, at the bottom of the package: the records it keeps (the
// Core, a Call per call, a Session per engine session) and the interfaces
// of the engine beneath it (Engine, Watcher, Checker, SessionEnder) with
// what they return. Every other file works on these; this one refers to
// none of them.

// Mode is what a call asks for.
type Mode uint8

// The modes.
const (
	Exclusive Mode = iota // Lock, TryLock: the only holder
	Shared                // RLock, TryRLock: one of any number of readers
	Units                 // Semaphore.Acquire, TryAcquire: Call.Weight of the Core's Size units
	Turn                  // Locker.Wait: a zero-length exclusive turn, holding nothing
)

// The states of a call. A call is queued from its start until it is
// granted (held) or ends without a grant (released); a grant is held
// until Unlock, a loss, Close, or, for a Turn, the instant it is taken.
type state uint8

const (
	queued state = iota
	held
	released
)

// Entry names one call's record in its engine: its key, the id the
// engine wrote it under (Call.Name), and its fencing token (0 if not
// known: an enqueue whose outcome is unknown).
type Entry struct {
	Key   string
	ID    string
	Token uint64
}

// Call is one Lock, TryLock, RLock, TryRLock, Wait, Acquire or TryAcquire
// of this process, from its start until its grant is released: the kit's
// record of it, which engines read and annotate. A granted call is the
// grant itself: its Lease methods (Unlock, Key, Token, Lost, Deadline,
// HandOff) are what a backend's Guard forwards to. Fields marked so are
// guarded by the Core's mutex (Core.Mu).
type Call struct {
	core  *Core
	key   string
	mode  Mode
	w     int64 // units asked for (1 outside a Semaphore)
	try   bool
	since time.Time     // when the call began
	lost  chan struct{} // closed when a held grant is lost
	sem   chan struct{} // cap 1: one Unlock at a time
	wake  chan struct{} // cap 1: there is news for the waiting call

	// Guarded by the Core's mutex.
	owner      owner.ID
	label      string   // the owner's label: owner.LabelOf of the call's ctx, or to's after a HandOff
	id         string   // the entry's id in the engine (Name)
	token      uint64   // the entry's fencing token
	session    *Session // the session whose renewals keep the entry
	data       any      // the engine's state for the call
	state      state
	grantedAt  time.Time
	ended      time.Time // when Unlock began or the grant was lost: Deadline from then on
	confirmed  bool      // the enqueue's reply arrived: the entry was written
	counted    bool      // the call counts in its session's calls
	granted    bool      // the entry holds the key (reply or notice)
	gone       bool      // the entry is gone, or its session is
	refresh    bool      // the engine asked for a re-read (Refresh)
	releasing  bool      // Unlock has begun
	lostClosed bool      // lost is closed
	turnBound  uint64    // a Turn's: the highest bound of GrantTurnsLocked met before its token was known

	// turnDone: a Turn that GrantTurnsLocked ended for its call (its
	// books are closed; the call returns without taking the mutex).
	// Written under the Core's mutex, read without it.
	turnDone atomic.Bool
}

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
	watcher Watcher      // engine, if it is one
	checker Checker      // engine, if it is one
	ender   SessionEnder // the Keeper, or the engine if it is one
	pkg     string       // Config.Package
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

	wmu   sync.Mutex // guards idleW
	idleW []*worker  // workers waiting for a round trip (spawn), newest last

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

// Engine is what a backend provides: its engine's protocol, and nothing
// else. The kit calls it, without its mutex held, from the call's
// goroutine or one of the kit's; each method may make round trips and
// must return once its ctx ends. An engine may also implement Watcher,
// Checker and SessionEnder. The package doc lists what each must
// guarantee.
type Engine interface {
	// Enqueue writes c's entry at the back of its key's queue (for a Try
	// form, only if it would be granted at once; for a Turn, only if its
	// turn would not come at once) and reports the outcome. It calls
	// c.Name with the entry's id before it sends the write. It returns
	// fairlock.ErrWouldBlock for a Try form that would wait, SizeError
	// for a semaphore of another size, Unwritten(err) for any failure
	// known to have written nothing, and any other error for an unknown
	// outcome (the kit then removes the named entry should it show up).
	// ctx is the call's, detached from its cancellation: the kit gives up
	// on it at the call's end and lets it finish, for a bounded time.
	Enqueue(ctx context.Context, c *Call) (Enqueued, error)

	// Release removes the entry of c, a held grant, and grants the calls
	// it was blocking. removed reports whether the entry was there and
	// current (its session alive): false means the grant had been lost.
	// A release that fails leaves the outcome unknown; the kit retries it
	// as Remove. It must remove nothing but this entry, even if retried
	// late.
	Release(ctx context.Context, c *Call) (removed bool, err error)

	// Remove removes an entry that must go (a cancelled call's, a
	// finished Turn's, one of unknown outcome: Token 0), wherever it is;
	// an entry already gone is not an error.
	Remove(ctx context.Context, e Entry) error

	// Renew renews the sessions, within ctx, and reports each one's
	// outcome in a Renewal, in any order; a session missing from the
	// result counts as failed. attempt counts the rounds since the last
	// one that completed: 1 or more means the last ran out of its bound
	// (a server that does not answer), so an engine may send its
	// renewals on more than one connection.
	Renew(ctx context.Context, ss []*Session, attempt int) []Renewal

	// Shutdown is Close's last step, once every call has ended and the
	// kit's goroutines have stopped: it ends the engine's own goroutines
	// and sessions, and returns the entries in left (every entry the
	// Locker still had) that it could not make sure are gone, which the
	// kit then removes; all within ctx.
	Shutdown(ctx context.Context, left []Entry) (remaining []Entry, err error)
}

// A Watcher is an Engine that judges each waiting call's turn itself
// (etcd: from the deletions of the keys ahead of it) rather than name
// the granted entries in its notices (Core.Granted). Its methods are
// called with the Core's mutex held, except Refresh; they must not block
// nor call the kit's locking methods (they may call its ...Locked ones).
type Watcher interface {
	// WatchLocked starts delivering c's grant, once c's entry is
	// confirmed (recorded from Enqueue's reply). If the engine cannot
	// tell yet (its notices are down), it returns a channel closed once
	// it can; the kit then calls Refresh. Otherwise it returns nil, and
	// a grant arrives as GrantLocked, a loss as LoseLocked, a need to
	// read the queue again as RefreshLocked.
	WatchLocked(c *Call) <-chan struct{}

	// Refresh reads c's queue again and watches it from there, as
	// WatchLocked: it returns a channel to wait on before another
	// Refresh, or nil. ErrGone: c's entry is gone. Final(err): c fails
	// with err. Any other error is retried with backoff.
	Refresh(ctx context.Context, c *Call) (<-chan struct{}, error)

	// UnwatchLocked stops delivering anything for c's current entry: it
	// is released, cancelled, or queued again.
	UnwatchLocked(c *Call)
}

// A Checker is an Engine whose notices can be lost (a subscription that
// was down) or cannot cover a holder that died: the kit calls Check every
// third of the TTL while calls wait, and after Core.Reread.
type Checker interface {
	// Check reads again the queues of the waiting calls (one per key at
	// most is given: its key's first waiting call), purging the entries
	// of dead sessions the engine's own rules can see, and reports what
	// it finds through Granted and Lose.
	Check(ctx context.Context, waiting []*Call)
}

// A SessionEnder hears when one of the Core's sessions ends (expired,
// reported gone by Renew, or ended with EndSessionLocked), to replace it:
// a Keeper is one (NewKeeper makes it the Core's), and an Engine that
// replaces its sessions itself may be one. It is called once per
// session, with the Core's mutex held.
type SessionEnder interface {
	SessionEndedLocked(s *Session)
}

// Enqueued is the outcome of a write that queued a call (Engine.Enqueue).
type Enqueued struct {
	// Token is the entry's fencing token: larger than every earlier
	// entry's of the key.
	Token uint64
	// Granted: the reply says the entry holds the key (for a Turn: its
	// turn has come).
	Granted bool
	// Free: a Turn found the key free and wrote nothing.
	Free bool
	// Session is the session of the entry (Core.Session).
	Session *Session
	// Sent is when the write was sent. A reply that arrives after the
	// session's TTL less its margin has passed since is not trusted: the
	// kit queues the call again.
	Sent time.Time
	// Renewed: the write renewed the session too (it set its marker with
	// the TTL), so its deadline moves to Sent plus the TTL.
	Renewed bool
}

// Renewal is the outcome of one session's renewal (Engine.Renew).
type Renewal struct {
	Session *Session
	// Err is why the renewal failed; nil when it was confirmed.
	Err error
	// Sent is when the confirmed renewal was sent, TTL the TTL the
	// engine granted (0: the session's last).
	Sent time.Time
	TTL  time.Duration
	// Expired: the engine says the session is gone for good (a lease
	// that cannot come back): every call on it is lost, and it ends.
	Expired bool
	// Lapsed: the session had expired on the server, but a later write
	// may start it again (a marker that the next enqueue sets anew): the
	// calls in Gone (every entry the renewal concerned) are lost, the
	// deadline does not move, and the session lives on while calls
	// confirmed since keep it.
	Lapsed bool
	// Gone lists the ids of the session's entries that are no longer in
	// their queues: those calls are lost, but for a call whose Unlock has
	// begun (its entry is gone because it was released) and an id the
	// Core no longer knows, which the kit passes over.
	Gone []string
}

// cleanup is an entry the janitor removes.
type cleanup struct {
	entry Entry
	until time.Time // keep removing until then (a write that may still land); zero: once
	after time.Time // not before then (a finished Turn's: turnRemovalDelay); zero: at once
}

// Session is one session of a Locker in its engine. Engines make them
// (Core.Session, Core.StartSession), and the kit renews them (Engine.Renew)
// and ends them. Fields are guarded by the Core's mutex.
type Session struct {
	id         string
	persistent bool          // renewed while the Locker is open, calls or not
	ttl        time.Duration // the TTL the engine granted last
	deadline   time.Time     // zero until a write or renewal set it
	next       time.Time     // when the next renewal is due
	calls      int           // confirmed calls on it, not released
	ended      bool
	data       any
}

// Lister is an Engine that can list a key's calls across every process,
// which an engine may implement: the kit then serves Core.Calls (a
// backend's keylock.Lister) and adds, in the debug views, the calls of
// other processes ahead of this Locker's on each of its keys.
//
// For it, an engine records with each entry the call's label
// (Call.Label) and its Locker's process (Core.Process), and something
// that gives its age; where it keeps them is its own business (in the
// entry itself, beside it, or with its session), as long as they go with
// the entry and cost the write that queues a call little.
type Lister interface {
	// List reads key's queue in the engine and returns its live calls
	// (an entry whose session the engine has expired is not one): the
	// granted ones first, as the engine's grant rule decides them (the
	// rule of the package doc, a Turn whose turn has come included, held
	// and transparent), then the waiting ones in queue order; each with
	// its label and process as recorded, mode, units (Units calls only),
	// token (granted calls only) and age. It makes its round trips with
	// ctx and returns once ctx ends.
	List(ctx context.Context, key string) ([]keylock.CallInfo, error)
}

// worker is a goroutine that runs round trips (work).
type worker struct{ job chan func() }

// A BatchRemover is an Engine that can remove several entries of one key
// in one round trip: the janitor hands it the finished Waits of a key
// together (one release frees every Wait directly behind it at once, and
// each then leaves an entry to remove), and whatever else it has for the
// key. Without it, the janitor removes them one by one.
type BatchRemover interface {
	// RemoveAll removes es, entries of key, as Remove removes one; an
	// entry already gone is not an error.
	RemoveAll(ctx context.Context, key string, es []Entry) error
}
