// Package elect is leader election over any keylock.Locker: the
// in-process lock, etcdlock, redislock, the same code on each.
// Candidates queue for one key, in FIFO order, and the holder of the key
// leads; its term ends when it resigns (Unlock), or when its grant is
// lost, or at the grant's Deadline at the latest, whichever comes first.
//
// # Campaign, Term, Resign
//
// Campaign joins the candidates' queue with a value (an identity: a host
// name, an address; it becomes the label of the candidate's flow,
// owner.NewLabeledContext) and returns a Term once the candidate leads.
// The Term gives the leader's work what it needs to stop in time:
//
//   - a context (Term.Context) that ends when leadership ends: at Resign,
//     when the grant's Lost closes, and at its Deadline at the latest,
//     by a timer, so that the work stops before another candidate can be
//     granted the key even if the backend has not noticed the loss yet;
//     and whose Err checks the Deadline against the clock itself, so that
//     a leader paused past its deadline (a GC pause, SIGSTOP, a suspended
//     VM) sees its context done at its first check after resuming, before
//     any goroutine of its own has run;
//   - Term.Valid, the same synchronous check, to call right before an
//     action that must not run without leadership;
//   - the term's fencing token (Term.Token: the grant's), larger than
//     every earlier term's, for a store that refuses the writes of an
//     older term: the only protection against a leader paused between its
//     check and its write (Kleppmann, "How to do distributed locking",
//     2016).
//
// Campaign reports leadership only while keylock.Valid holds for the
// grant: a grant that arrives already past its deadline (the process was
// paused while it waited) is given back and the candidate queues again.
//
// Resign cancels the term's context first, then releases the grant, which
// hands the key to the next candidate at once: one round trip, and the
// next candidate's backend is notified without polling. If the release
// fails (the engine unreachable), Resign returns the error, the Locker
// goes on releasing the grant in the background, and Resign may be called
// again: a retry reads the key's calls and returns nil once the grant is
// gone. Run is the loop most leaders want: campaign, run fn while
// leading, resign, campaign again.
//
// # Who leads, from any process
//
// Leader and Observe tell who leads, its value, its term's token and
// since when, to any process, candidate or not. A plain keylock.Locker
// cannot say who holds a key, so Leader reads the key's calls through
// keylock.Lister, which every backend of fairlock implements (the
// in-process views, etcdlock, redislock, pglock): the leader is the first
// call that holds the key, its value the label its Campaign gave its
// flow, its process the host, pid and Locker name the backend recorded.
// A Locker that is no Lister can elect, but Leader fails with
// ErrNoListing, and so does Observe unless the Locker can follow the key.
//
// Observe sends the current leader, then every change, in order: a new
// term, and a vacancy (the zero Leader) when nobody leads. Over a Locker
// that streams the changes of a key's holders (keylock.Follower: the
// in-process views, etcdlock and redislock), it follows the grants as the
// backend makes them and misses none, however short; where the backend's
// history is gone (etcd compacted revisions the stream had not read;
// Redis's change log of the key lost entries it had not read), the next
// Leader says so (Leader.Gap). Over one that can only list (pglock), it
// re-reads the listing every interval (WithInterval, 1 s by default) and
// at once when a candidate of the same Election begins or ends a term: a change made in another process is seen within the
// interval plus one listing's round trip, and a term that begins and ends
// between two reads is not seen (the etcd client's Election.Observe says
// the same of its own: it "will not necessarily fetch all historical
// leader updates"), so every Leader after the first has Gap set. Tokens
// grow from one term to the next, so what is seen is in order either
// way.
//
// # Against other elections
//
// docs/election.md sets it feature by feature beside client-go's
// leaderelection (callbacks whose context ends with leadership, a leader
// identity, a health check; no fencing, which its doc says, polling of
// the lease) and etcd's concurrency.Election (Campaign, Proclaim,
// Leader, Observe, Resign, the revision as a term; etcd only; a Campaign
// that fails leaves its key, etcd-io/etcd#21128; a Resign that fails
// forgets leadership, etcd-io/etcd#22123), and gives the recipe for a
// job that runs once per period on the leader only.
package elect

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
)

var (
	// ErrNoListing is what Leader returns for an Election over a Locker
	// that cannot list a key's calls (not a keylock.Lister), and Observe
	// over one that can neither list nor follow them (not a
	// keylock.Follower either): nobody but the candidates then knows who
	// leads.
	ErrNoListing = errors.New("elect: the Locker cannot list a key's calls (it is no keylock.Lister)")
	// ErrResigned is the cause (context.Cause) of a term's context that
	// Resign ended.
	ErrResigned = errors.New("elect: the leader resigned")
)

// defaultInterval is how often Observe re-reads the listing unless
// WithInterval says otherwise.
const defaultInterval = time.Second

// resignTimeout bounds the Resign that Run makes after fn returns, on a
// context detached from Run's: long enough for a distributed backend's
// round trip, short enough that an unreachable engine cannot hold Run.
const resignTimeout = 5 * time.Second

// Option configures an Election.
type Option func(*Election)

// WithInterval sets how often a polling Observe (over a Locker that is
// no keylock.Follower) re-reads the key's calls when nothing in this
// process told it of a change (default 1 s; d <= 0 keeps the default):
// each read is one listing (keylock.Lister.Calls), one query on
// PostgreSQL. An Observe that follows the key reads no listing and
// ignores it.
func WithInterval(d time.Duration) Option {
	return func(e *Election) {
		if d > 0 {
			e.interval = d
		}
	}
}

// Election is one key's election over a Locker: every process that makes
// an Election with Lockers that exclude each other (the same backend,
// prefix and key) takes part in the same one. It is safe for concurrent
// use: several candidates may campaign through one Election, each with a
// flow of its own, and Leader and Observe may be called by anyone. Make
// one with New.
type Election struct {
	l        keylock.Locker
	ls       keylock.Lister // l as a Lister; nil if it is none
	key      string
	interval time.Duration

	mu      sync.Mutex
	terms   map[uint64]*Term      // guarded by mu: this Election's terms in progress, by token
	watches map[chan struct{}]int // guarded by mu: the wake-ups of this Election's Observe streams
}

// New returns the election on key among the candidates that campaign
// through l, or through Lockers that exclude l's grants (another process's
// on the same prefix). key should be given to elections only: a call on
// it that is not a Campaign's delays the candidates behind it, and counts
// as a leader for Leader if it holds the key exclusively. It starts
// nothing. It panics if l is nil.
func New(l keylock.Locker, key string, opts ...Option) *Election {
	if l == nil {
		panic("elect: New with a nil Locker")
	}
	e := &Election{l: l, key: key, interval: defaultInterval,
		terms: make(map[uint64]*Term), watches: make(map[chan struct{}]int)}
	e.ls, _ = l.(keylock.Lister)
	for _, o := range opts {
		if o != nil {
			o(e)
		}
	}
	return e
}

// Key returns the key the election is held on.
func (e *Election) Key() string { return e.key }

// Campaign joins the election with value and blocks until this candidate
// leads: it queues on the key (Lock) behind every candidate that
// campaigned before it, in any process, and returns the Term once it
// holds the key and keylock.Valid says the grant is certain. value is
// what Leader and Observe report as the leader's (a host name, an
// address: at most owner.MaxLabel bytes); it becomes the label of a flow
// of the candidate's own (owner.NewLabeledContext of ctx), so that debug
// dumps and listings show it too.
//
// ctx bounds the campaign only: the term lasts until Resign, a loss, or
// its Deadline, whatever becomes of ctx (its values are kept). Campaign
// fails with an error naming value if value is too long, or with the
// Locker's error (a *fairlock.LockError wrapping the context's error,
// fairlock.ErrClosed, or the backend's), having left the queue. A grant
// that arrives no longer certain (the process was paused past its
// deadline while it waited) is released, and the candidate queues again
// at the back. It starts one goroutine per term, which ends with the
// term.
func (e *Election) Campaign(ctx context.Context, value string) (*Term, error) {
	return e.campaign(ctx, value, true)
}

// campaign is Campaign; detach makes the term outlive ctx (Campaign),
// else the term ends when ctx does (Run).
func (e *Election) campaign(ctx context.Context, value string, detach bool) (*Term, error) {
	if ctx == nil {
		panic("elect: Campaign with a nil context")
	}
	if len(value) > owner.MaxLabel {
		return nil, fmt.Errorf("elect: Campaign on %q: a value of %d bytes; at most %d (owner.MaxLabel)", e.key, len(value), owner.MaxLabel)
	}
	fctx := owner.NewLabeledContext(ctx, value)
	for {
		l, err := e.l.Lock(fctx, e.key)
		if err != nil {
			return nil, err
		}
		if keylock.Valid(l) {
			parent := fctx
			if detach {
				parent = context.WithoutCancel(fctx)
			}
			return e.begin(parent, l, value), nil
		}
		// Granted, but no longer certain: another candidate may be
		// granted at any instant. Give it back and queue again.
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resignTimeout)
		_ = l.Unlock(uctx)
		cancel()
	}
}

// Run campaigns with value and, each time this candidate leads, runs fn
// with the term's context and the Term, then resigns, and campaigns
// again, until ctx ends or fn fails. This is client-go's
// leaderelection.RunOrDie with the term's fencing token and a
// pause-safe end, and with candidates served in FIFO order.
//
// fn should run until its context ends (leadership ended: a loss, the
// Deadline, or ctx) and then return. Run tells the two ends apart by the
// term: if fn returns while its term still holds, nil makes Run resign
// and campaign again at the back of the queue, and an error makes it
// resign and return that error; if the term had ended, Run campaigns
// again whatever fn returned. The Resign after fn runs on a context of
// its own, bounded by a few seconds (a failure is left to the Locker,
// which goes on releasing the grant). If fn panics, Run resigns the same
// way and the panic goes on. Run returns when ctx ends, with the
// Locker's error wrapping the context's if it was campaigning, or with
// ctx's error; or at once with Campaign's error (a value too long, a
// closed Locker).
func (e *Election) Run(ctx context.Context, value string, fn func(ctx context.Context, t *Term) error) error {
	for {
		t, err := e.campaign(ctx, value, false)
		if err != nil {
			return err
		}
		ferr, ended := e.lead(ctx, t, fn)
		if err := ctx.Err(); err != nil {
			return err
		}
		if ferr != nil && !ended {
			return ferr
		}
	}
}

// lead runs fn for the term t and resigns it, even if fn panics. It
// returns fn's error, and whether the term had ended when fn returned.
func (e *Election) lead(ctx context.Context, t *Term, fn func(context.Context, *Term) error) (err error, ended bool) {
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resignTimeout)
		_ = t.Resign(rctx)
		cancel()
	}()
	err = fn(t.Context(), t)
	return err, t.ctx.Context.Err() != nil
}

// begin starts the term of the grant l, with value, on a context derived
// from parent, and records it for Leader, Observe and their wake-ups.
func (e *Election) begin(parent context.Context, l keylock.Lease, value string) *Term {
	cctx, cancel := context.WithCancelCause(parent)
	t := &Term{e: e, lease: l, value: value, since: time.Now(), cancel: cancel}
	t.ctx = &termCtx{Context: cctx, t: t}
	e.mu.Lock()
	e.terms[l.Token()] = t
	e.mu.Unlock()
	e.wake()
	go t.watch()
	return t
}

// ended takes t out of the terms in progress and wakes the observers.
func (e *Election) ended(t *Term) {
	e.mu.Lock()
	if e.terms[t.Token()] == t {
		delete(e.terms, t.Token())
	}
	e.mu.Unlock()
	e.wake()
}

// wake tells this Election's Observe streams to read again.
func (e *Election) wake() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for ch := range e.watches {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// local returns this Election's term with token, or nil.
func (e *Election) local(token uint64) *Term {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.terms[token]
}
