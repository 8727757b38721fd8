package elect

import (
	"context"
	"time"

	"github.com/fairlock/fairlock/keylock"
)

// Leader is who leads an election, as Election.Leader and Observe report
// it. The zero Leader is a vacancy: nobody leads (Vacant).
type Leader struct {
	// Value is the value the leader campaigned with (its flow's label,
	// as the Locker recorded it: see keylock.Lister for what each
	// backend records; in process, a Locker without fairlock.WithDebug
	// shows it while the candidate's Term is reachable, which it is
	// while it leads).
	Value string
	// Token is the term's fencing token (Term.Token); 0 for a vacancy.
	Token uint64
	// Since is when the term began, as well as this process can tell:
	// for a term of this Election, when its Campaign saw the grant; in
	// an Observe stream, for a term that a read found after an earlier
	// read had found another state, the instant of that read (late by
	// up to the interval); otherwise when the leader's call joined the
	// key's queue, by its listing's age (in process: when it was
	// granted), which is earlier than the grant by however long it
	// waited; the instant of the read where the listing has no age.
	Since time.Time
	// Process is where the leader runs: its host, process id and
	// Locker's name.
	Process keylock.Process
}

// Vacant reports whether l is a vacancy: nobody leads.
func (l Leader) Vacant() bool { return l.Token == 0 }

// Leader reads who leads now: one listing of the key's calls
// (keylock.Lister.Calls), from any process, candidate or not. It returns
// the zero Leader if nobody leads, ErrNoListing if the Locker cannot
// list, or the listing's error (a *fairlock.LockError wrapping the
// context's error, fairlock.ErrClosed, or the backend's).
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	if e.ls == nil {
		return Leader{}, ErrNoListing
	}
	read := time.Now()
	calls, err := e.ls.Calls(ctx, e.key)
	if err != nil {
		return Leader{}, err
	}
	return e.leaderOf(calls, read), nil
}

// leaderOf returns the leader in calls, a listing read at read: the first
// call that holds the key exclusively (a Campaign's Lock).
func (e *Election) leaderOf(calls []keylock.CallInfo, read time.Time) Leader {
	for _, c := range calls {
		if !c.Held || c.Mode != keylock.ModeExclusive {
			continue
		}
		l := Leader{Value: c.Label, Token: c.Token, Since: read.Add(-c.Age), Process: c.Process}
		if t := e.local(c.Token); t != nil {
			l.Since = t.since
		}
		return l
	}
	return Leader{}
}

// Observe returns a stream of who leads: the current Leader first, then
// every change a read finds, in order: a new term, or a vacancy (the zero
// Leader) when nobody leads. It reads the key's calls (keylock.Lister)
// every interval (WithInterval), and at once when a candidate of this
// Election begins or ends a term; a change made in another process shows
// within the interval plus one read's round trip, and a term that begins
// and ends between two reads is not seen. A read that fails is tried
// again at the next interval, and the stream says nothing until one
// succeeds.
//
// Observe returns ErrNoListing at once if the Locker cannot list. Its
// goroutine sends each Leader and waits for it to be received before it
// reads again (a slow reader delays the reads, never reorders them), and
// closes the channel when ctx ends.
func (e *Election) Observe(ctx context.Context) (<-chan Leader, error) {
	if ctx == nil {
		panic("elect: Observe with a nil context")
	}
	if e.ls == nil {
		return nil, ErrNoListing
	}
	wake := make(chan struct{}, 1)
	e.mu.Lock()
	e.watches[wake]++
	e.mu.Unlock()
	ch := make(chan Leader)
	go func() {
		defer close(ch)
		defer func() {
			e.mu.Lock()
			delete(e.watches, wake)
			e.mu.Unlock()
		}()
		tick := time.NewTicker(e.interval)
		defer tick.Stop()
		var last Leader
		sent := false
		for {
			read := time.Now()
			calls, err := e.ls.Calls(ctx, e.key)
			if err == nil {
				cur := e.leaderOf(calls, read)
				if !sent || cur.Token != last.Token {
					if sent && !cur.Vacant() && e.local(cur.Token) == nil {
						cur.Since = read // it began after the last read
					}
					select {
					case ch <- cur:
					case <-ctx.Done():
						return
					}
					last, sent = cur, true
				}
			}
			select {
			case <-tick.C:
			case <-wake:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}
