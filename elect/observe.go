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
	// Since is when the term began, as well as this process can tell.
	// Leader reads it as: for a term of this Election, when its Campaign
	// saw the grant; otherwise when the leader's call joined the key's
	// queue, by its listing's age (in process: when it was granted),
	// which is earlier than the grant by however long it waited; the
	// instant of the read where the listing has no age. In an Observe
	// stream over a keylock.Follower, a term that began after the stream
	// did has its change's instant (keylock.Change.At: in process the
	// grant itself, on etcd and Redis when this process heard of it),
	// whichever Election campaigned for it; over a polling stream, the
	// instant of the read that found it (late by up to the interval), or
	// its Campaign's for a term of this Election.
	Since time.Time
	// Gap says that terms or vacancies between the previous Leader of
	// an Observe stream and this one may have gone unseen: always on a
	// polling stream (a Locker that is no keylock.Follower), after the
	// first; over a Follower, only where the backend's history was gone
	// (keylock.Change.Gap) and the leader changed across it. False in
	// the first Leader of a stream and in Election.Leader's.
	Gap bool
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
// call that holds the key exclusively (a Campaign's Lock), its Since its
// Campaign's if it is a term of this Election.
func (e *Election) leaderOf(calls []keylock.CallInfo, read time.Time) Leader {
	l := leaderIn(calls, read)
	if t := e.local(l.Token); !l.Vacant() && t != nil {
		l.Since = t.since
	}
	return l
}

// leaderIn returns the leader in calls, read at read: the first call that
// holds the key exclusively, since its age before read; the zero Leader
// if none does.
func leaderIn(calls []keylock.CallInfo, read time.Time) Leader {
	for _, c := range calls {
		if c.Held && c.Mode == keylock.ModeExclusive {
			return Leader{Value: c.Label, Token: c.Token, Since: read.Add(-c.Age), Process: c.Process}
		}
	}
	return Leader{}
}

// Observe returns a stream of who leads: the current Leader first, then
// every change, in order: a new term, or a vacancy (the zero Leader, but
// for Gap) when nobody leads. A hand-over from one candidate straight to
// the next, queued behind it, is one change: no vacancy comes between.
//
// Over a Locker that is a keylock.Follower (the in-process views,
// etcdlock, redislock), the stream is lossless: it follows the key's
// grants as the backend makes them (keylock.Follower.Follow), so every
// term and every vacancy is sent, however short, in the order they
// happened, with Gap set only where the backend's history was gone (an
// etcd compaction of revisions the stream had not read; entries of
// Redis's change log of the key lost before the stream read them; an
// in-process reader thousands of changes behind) and the leader changed
// across it. A change reaches the stream as soon as the backend delivers
// it (on etcd, one watch event; on Redis, one XREAD reply).
//
// Over any other Locker that can list (keylock.Lister: pglock), it
// polls: it reads the key's calls every interval (WithInterval), and at
// once when a candidate of this Election begins or ends a term; a change made in another process shows within the
// interval plus one read's round trip, a term that begins and ends
// between two reads is not seen (the etcd client's Election.Observe says
// the same of its own: it "will not necessarily fetch all historical
// leader updates"), and every Leader after the first has Gap set. A read
// that fails is tried again at the next interval, and the stream says
// nothing until one succeeds. Tokens grow from one term to the next, so
// what is seen is in order either way.
//
// Observe returns ErrNoListing at once if the Locker can neither follow
// nor list, and Follow's error if following the key fails (a
// *fairlock.LockError: the context's error, fairlock.ErrClosed, the
// backend's). Its goroutine sends each Leader and waits for it to be
// received (a slow reader delays the stream, never reorders it; a
// Follower buffers the changes meanwhile, see keylock.Follower for how
// many), and closes the channel when ctx ends, or when a Follower's
// stream ends (the Locker was closed).
func (e *Election) Observe(ctx context.Context) (<-chan Leader, error) {
	if ctx == nil {
		panic("elect: Observe with a nil context")
	}
	if f, ok := e.l.(keylock.Follower); ok {
		changes, err := f.Follow(ctx, e.key)
		if err != nil {
			return nil, err
		}
		ch := make(chan Leader)
		go e.relay(ctx, changes, ch)
		return ch, nil
	}
	if e.ls == nil {
		return nil, ErrNoListing
	}
	return e.poll(ctx), nil
}

// relay sends on ch the Leader after each change of changes that changes
// who leads, until changes closes or ctx ends, then closes ch.
func (e *Election) relay(ctx context.Context, changes <-chan keylock.Change, ch chan<- Leader) {
	defer close(ch)
	var last Leader
	sent := false
	for c := range changes {
		cur := leaderIn(c.Holders, c.At)
		if sent && cur.Token == last.Token {
			continue
		}
		if sent && !cur.Vacant() {
			cur.Since = c.At // it began with this change
		}
		if !sent && !cur.Vacant() {
			if t := e.local(cur.Token); t != nil {
				cur.Since = t.since
			}
		}
		cur.Gap = sent && c.Gap
		select {
		case ch <- cur:
		case <-ctx.Done():
			return // Follow's goroutine ends with ctx too
		}
		last, sent = cur, true
	}
}

// poll is Observe over a Lister: a read every interval, and at once when
// a term of this Election begins or ends.
func (e *Election) poll(ctx context.Context) <-chan Leader {
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
					cur.Gap = sent
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
	return ch
}
