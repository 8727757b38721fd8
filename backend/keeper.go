package backend

import (
	"context"
	"time"

	"github.com/fairlock/fairlock/ctxerr"
)

// Sessions the engine makes and ends on the server, one at a time per
// Locker: an etcd lease, a row of PostgreSQL's session table. Every call
// a Locker writes names its current session; when that session ends
// (expired, reported gone by a renewal or a write, or its deadline passed
// unrenewed: EndSessionLocked) its calls are lost or queue again, and the
// Locker goes on under a new one: it does not die with its session. The
// session given up is ended on the server in the background, so that the
// calls still written under it (grants lost to a deadline while the
// server was unreachable, say) do not keep others waiting until it
// expires; whatever is left of that at Close, Shutdown ends. (Redis needs
// none of this: its sessions are markers the scripts set as they go.)

// Keeper keeps a Locker's current session for an engine whose sessions
// are made and ended by round trips. NewKeeper makes one; Start makes the
// first session, Run replaces each one that ends, Current hands the
// current one to calls, and Shutdown ends them all. It is the Core's
// SessionEnder.
type Keeper struct {
	k     *Core
	what  string // "lease", "session": in log lines
	open  func(ctx context.Context) (*Session, error)
	end   func(ctx context.Context, s *Session) error
	bound time.Duration // the first try of open's bound, doubled after each that runs out

	cur     *Session      // guarded by k.mu: the current session; nil while the next is made
	ready   chan struct{} // guarded by k.mu: closed once cur is set
	replace chan struct{} // cap 1: the current session ended; make another
	ended   []*Session    // guarded by k.mu: given up, still to end on the server
}

// NewKeeper returns the Keeper of k's sessions, which k tells when one
// ends; call it before Core.Start. open makes a new session on the server
// and returns it, from Core.StartSession (one round trip, bounded by its
// ctx). end ends a session on the server, so that nothing written under
// it counts any more; a session already gone is not an error. what names
// the sessions in log lines ("lease"). bound (positive) is how long the
// first try of open may take when Run replaces a session: each try that
// fails is retried with Backoff, and each bound is twice the last, up to
// CleanupTimeout, so that a try sent to a server that stopped answering
// is given up soon and a slow one gets longer each time.
func NewKeeper(k *Core, what string, bound time.Duration,
	open func(ctx context.Context) (*Session, error), end func(ctx context.Context, s *Session) error) *Keeper {
	kp := &Keeper{
		k: k, what: what, open: open, end: end, bound: bound,
		ready: make(chan struct{}), replace: make(chan struct{}, 1),
	}
	k.ender = kp
	return kp
}

// Start makes the first session (open, with ctx), and returns open's
// error.
func (kp *Keeper) Start(ctx context.Context) error {
	s, err := kp.open(ctx)
	if err != nil {
		return err
	}
	kp.k.mu.Lock()
	kp.cur = s
	close(kp.ready)
	kp.k.mu.Unlock()
	return nil
}

// Current returns the session a call should write under, waiting while
// the last one is being replaced. It fails with the context's error, or
// fairlock.ErrClosed once the Locker is closing.
func (kp *Keeper) Current(ctx context.Context) (*Session, error) {
	closing := kp.k.closing
	for {
		kp.k.mu.Lock()
		if closing.Err() != nil {
			kp.k.mu.Unlock()
			return nil, errClosed
		}
		s, ch := kp.cur, kp.ready
		kp.k.mu.Unlock()
		if s != nil {
			return s, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctxerr.Of(ctx)
		case <-closing.Done():
			return nil, errClosed
		}
	}
}

// Failed ends s: the server said it is gone (a write under it was
// refused). It takes the Core's mutex.
func (kp *Keeper) Failed(s *Session) {
	kp.k.mu.Lock()
	kp.k.EndSessionLocked(s)
	kp.k.mu.Unlock()
}

// SessionEndedLocked is the Core's word that s ended: it is given up,
// and if it is the current one, calls wait for the next, which Run
// makes. The Core's mutex is held.
func (kp *Keeper) SessionEndedLocked(s *Session) {
	kp.ended = append(kp.ended, s)
	if kp.cur == s {
		kp.cur = nil
		kp.ready = make(chan struct{})
	}
	select {
	case kp.replace <- struct{}{}:
	default:
	}
}

// Run ends the sessions given up (each on a goroutine of its own: endLater)
// and makes a new session whenever the current one ended, until the
// Locker's background context ends. Start it with Core.Go.
func (kp *Keeper) Run() {
	bg := kp.k.bg
	for {
		select {
		case <-kp.replace:
		case <-bg.Done():
			return
		}
		kp.k.mu.Lock()
		old := kp.ended
		kp.ended = nil
		need := kp.cur == nil
		kp.k.mu.Unlock()
		for _, s := range old {
			kp.k.Go(func() { kp.endLater(s) })
		}
		if need && !kp.remake(bg) {
			return
		}
	}
}

// remake makes the next session, retrying until it succeeds; it reports
// false if bg ended first.
func (kp *Keeper) remake(bg context.Context) bool {
	retry := NewBackoff()
	bound := kp.bound
	for {
		ctx, cancel := context.WithTimeout(bg, bound)
		s, err := kp.open(ctx)
		cancel()
		if err == nil {
			kp.k.mu.Lock()
			kp.cur = s
			close(kp.ready)
			kp.k.mu.Unlock()
			return true
		}
		if bg.Err() != nil {
			return false
		}
		kp.k.logger.Warn(kp.k.pkg+": making a new "+kp.what+" failed; retrying", "locker", kp.k.name, "error", err)
		bound = min(2*bound, CleanupTimeout)
		if !retry.Wait(bg) {
			return false
		}
	}
}

// endLater ends s on the server, retrying until that succeeds, for at
// most twice its TTL (by then the server has expired it anyway), or until
// the Locker closes: s then goes back to the list that Shutdown ends.
func (kp *Keeper) endLater(s *Session) {
	bg := kp.k.bg
	kp.k.mu.Lock()
	giveUp := time.Now().Add(2 * s.TTL())
	kp.k.mu.Unlock()
	retry := NewBackoff()
	for {
		// On the background context: Close ends a try in progress (it
		// waits for this goroutine), and Shutdown takes over.
		ctx, cancel := context.WithTimeout(bg, CleanupTimeout)
		err := kp.end(ctx, s)
		cancel()
		if err == nil || !time.Now().Before(giveUp) {
			return
		}
		if !retry.Wait(bg) {
			kp.k.mu.Lock()
			kp.ended = append(kp.ended, s)
			kp.k.mu.Unlock()
			return
		}
	}
}

// Shutdown ends, within ctx, the current session and those given up that
// are not ended yet; call it from Engine.Shutdown (Run and endLater have
// returned by then). Nothing written under them counts from then on. It
// returns the sessions it ended and the first error.
func (kp *Keeper) Shutdown(ctx context.Context) (done []*Session, err error) {
	kp.k.mu.Lock()
	ss := kp.ended
	kp.ended = nil
	if kp.cur != nil {
		ss = append(ss, kp.cur)
		kp.cur = nil
	}
	kp.k.mu.Unlock()
	for _, s := range ss {
		if e := kp.end(ctx, s); e != nil {
			if err == nil {
				err = e
			}
			continue
		}
		done = append(done, s)
	}
	return done, err
}
