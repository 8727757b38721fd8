package backend

import (
	"context"
	"time"

	"github.com/fairlock/fairlock/keylock"
)

// Engine is what a backend provides: its engine's protocol, and nothing
// else. The kit calls it; methods whose names end in Locked are called
// with the Core's mutex held and must neither block nor call back into
// the kit's locking methods (they may call the kit's ...Locked methods).
// The others are called without it, from the call's goroutine or one of
// the kit's, and may make round trips; each must return once its ctx
// ends. The package doc lists what each must guarantee.
type Engine interface {
	// Enqueue writes c's entry at the back of its key's queue (for a Try
	// form, only if it would be granted at once; for a Turn, only if the
	// queue is not empty) and reports the outcome. It calls c.Name with
	// the entry's id before it sends the write. It returns
	// fairlock.ErrWouldBlock for a Try form that would wait, SizeError
	// for a semaphore of another size, Unwritten(err) for any failure
	// known to have written nothing, and any other error for an unknown
	// outcome (the kit then removes the named entry should it show up).
	// ctx is the call's, detached from its cancellation and bounded: the
	// kit gives up on it at the call's end and lets it finish.
	Enqueue(ctx context.Context, c *Call) (Enqueued, error)

	// WatchLocked starts delivering c's grant, once c's entry is
	// confirmed (recorded from Enqueue's reply). If the engine cannot
	// tell yet (its notices are down), it returns a channel closed once
	// it can; the kit then calls Refresh. Otherwise it returns nil, and
	// a grant arrives as GrantLocked or Granted, a loss as LoseLocked,
	// a need to read the queue again as RefreshLocked.
	WatchLocked(c *Call) <-chan struct{}

	// Refresh reads c's queue again and watches it from there, as
	// WatchLocked: it returns a channel to wait on before another
	// Refresh, or nil. ErrGone: c's entry is gone. Final(err): c fails
	// with err. Any other error is retried with backoff.
	Refresh(ctx context.Context, c *Call) (<-chan struct{}, error)

	// UnwatchLocked stops delivering anything for c's current entry: it
	// is released, cancelled, or queued again.
	UnwatchLocked(c *Call)

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

	// Check reads again the queues of the waiting calls (one per key at
	// most is given: its key's first waiting call), purging the entries
	// of dead sessions the engine's own rules can see, and reports what
	// it finds through Granted and Lose. The kit calls it every third of
	// the TTL while calls wait, and after Reread. An engine whose
	// notices cover every change may do nothing.
	Check(ctx context.Context, waiting []*Call)

	// SessionEndedLocked tells the engine that s ended (expired,
	// reported gone by Renew, or ended by the engine itself with
	// EndSessionLocked): its calls are lost. It is called once per
	// session.
	SessionEndedLocked(s *Session)

	// Shutdown is Close's last step, once every call has ended and the
	// kit's goroutines have stopped: it ends the engine's own goroutines
	// and sessions, and returns the entries in left (every entry the
	// Locker still had) that it could not make sure are gone, which the
	// kit then removes; all within ctx.
	Shutdown(ctx context.Context, left []Entry) (remaining []Entry, err error)
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
	// their queues: those calls are lost.
	Gone []string
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
