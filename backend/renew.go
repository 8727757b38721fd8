package backend

import (
	"context"
	"time"
)

// Session renewal and expiry. One loop (renewLoop) renews every live
// session when it is due (a third of its TTL after the send of its last
// confirmed renewal), loses the calls of a session whose deadline passes
// without a renewal, and re-reads the queues of the waiting calls (the
// engine's Check) every third of the TTL and after the engine lost
// notices (Reread). Each round of renewals runs on a goroutine of its
// own, one round at a time, bounded by renewBound: a round sent to a
// server that does not answer (a host gone from the network without
// resetting its connections: nothing fails, nothing arrives) is given up
// after that bound and retried at once, so that one stalled server or
// connection costs no session while another path answers; after a fast
// failure the next attempt waits a tenth of the TTL. The loop wakes for
// the next renewal or the earliest deadline, whichever is first, so a
// session is given up at its deadline, not a retry later.

// renewBound is how long one renewal round may take before it is given
// up and retried, for a Locker of TTL ttl: a sixth of it, and at least
// 250 ms.
func renewBound(ttl time.Duration) time.Duration {
	return max(ttl/6, 250*time.Millisecond)
}

// Session returns the live session of this Locker named id, making it
// (not persistent: it lives while it keeps a confirmed call) if there is
// none: how an engine whose writes start their session (a marker set
// with the TTL by the enqueue itself, Enqueued.Renewed) names it.
func (k *Core) Session(id string) *Session {
	k.mu.Lock()
	defer k.mu.Unlock()
	s := k.sessions[id]
	if s == nil {
		s = &Session{id: id, ttl: k.ttl}
		k.sessions[id] = s
	}
	return s
}

// StartSession records a session the engine made (an etcd lease granted
// with TTL ttl, the grant sent at sent): persistent, renewed until it
// ends, calls or not.
func (k *Core) StartSession(id string, sent time.Time, ttl time.Duration) *Session {
	s := &Session{id: id, persistent: true, ttl: ttl}
	s.extend(sent, ttl)
	k.mu.Lock()
	k.sessions[id] = s
	k.mu.Unlock()
	k.kickRenewal()
	return s
}

// EndSessionLocked ends s, as when its engine reports it gone: every call
// on it is lost (a held grant's Lost closes; a queued call queues again
// under a new session) and its SessionEnder hears of it (a Keeper, which
// replaces it).
// The Core's mutex must be held.
func (k *Core) EndSessionLocked(s *Session) int {
	if s.ended {
		return 0
	}
	s.ended = true
	if k.sessions[s.id] == s {
		delete(k.sessions, s.id)
	}
	now := time.Now()
	n := 0
	for _, c := range k.ids {
		if c.session == s && c.confirmed && c.state != released && !c.gone {
			k.loseLocked(c, now)
			n++
		}
	}
	if k.ender != nil {
		k.ender.SessionEndedLocked(s)
	}
	return n
}

// Reread makes the kit ask the engine to Check the queues of the waiting
// calls now: the engine's notices were down (a subscription restarted)
// and some may be lost.
func (k *Core) Reread() {
	select {
	case k.reread <- struct{}{}:
	default:
	}
}

// roundResult is what a round of renewals tells the loop.
type roundResult struct {
	hung bool // the round ran out of its bound
}

// renewLoop renews sessions, expires them and re-reads queues until the
// background context ends.
func (k *Core) renewLoop() {
	period := k.ttl / 3
	check := time.Now().Add(period) // the next re-read of the waiting calls
	t := time.NewTimer(period)
	defer t.Stop()
	var round chan roundResult // non-nil while a round runs
	attempt := 0               // rounds since the last that completed in its bound
	reread := false            // a re-read is due once the running round ends
	for {
		now := time.Now()
		wait := check.Sub(now)
		k.mu.Lock()
		for _, s := range k.sessions {
			if !s.live() {
				continue
			}
			if !s.next.IsZero() && round == nil {
				wait = min(wait, s.next.Sub(now))
			}
			if !s.deadline.IsZero() {
				wait = min(wait, s.deadline.Sub(now))
			}
		}
		k.mu.Unlock()
		t.Reset(max(wait, 0))
		select {
		case <-t.C:
		case <-k.renewKick:
		case <-k.reread:
			reread = true
		case r := <-round:
			round = nil
			if r.hung {
				attempt++
			} else {
				attempt = 0
			}
		case <-k.bg.Done():
			if round != nil {
				<-round
			}
			return
		}
		now = time.Now()
		k.expire(now)
		k.reportLost()
		if round != nil {
			continue
		}
		due := k.due(now)
		recheck := reread || !now.Before(check)
		if len(due) == 0 && !recheck {
			continue
		}
		if recheck {
			check = now.Add(period)
		}
		reread = false
		round = make(chan roundResult, 1)
		go func() {
			var r roundResult
			if len(due) > 0 {
				r.hung = k.renew(due, attempt)
			}
			if recheck {
				k.check()
			}
			round <- r
		}()
	}
}

// due returns the live sessions whose renewal is due at now.
func (k *Core) due(now time.Time) []*Session {
	k.mu.Lock()
	defer k.mu.Unlock()
	var ss []*Session
	for _, s := range k.sessions {
		if s.live() && !s.next.IsZero() && !now.Before(s.next) {
			ss = append(ss, s)
		}
	}
	return ss
}

// expire ends every live session whose deadline has passed, losing its
// calls. It logs after the mutex is released: the logger is the user's
// code.
func (k *Core) expire(now time.Time) {
	type loss struct {
		session string
		calls   int
	}
	var losses []loss
	k.mu.Lock()
	for _, s := range k.sessions {
		if s.live() && !s.deadline.IsZero() && !now.Before(s.deadline) {
			losses = append(losses, loss{s.id, k.EndSessionLocked(s)})
		}
	}
	k.mu.Unlock()
	for _, l := range losses {
		k.logger.Warn(k.pkg+": session not renewed for its TTL; its calls are lost",
			"locker", k.name, "session", l.session, "calls", l.calls)
	}
}

// renew renews the sessions ss (attempt as in Engine.Renew) and applies
// the outcomes. It reports whether the round ran out of its bound.
func (k *Core) renew(ss []*Session, attempt int) (hung bool) {
	bound := renewBound(k.ttl)
	ctx, cancel := context.WithTimeout(k.bg, bound)
	defer cancel()
	start := time.Now()
	rs := k.engine.Renew(ctx, ss, attempt)
	hung = time.Since(start) >= bound && k.bg.Err() == nil
	k.mu.Lock()
	done := make(map[*Session]bool, len(rs))
	type lostCalls struct {
		session string
		calls   int
		lapsed  bool // the session expired on the server
	}
	var losses []lostCalls
	var failed []error
	now := time.Now()
	for _, r := range rs {
		s := r.Session
		if s == nil || done[s] {
			continue
		}
		done[s] = true
		switch {
		case s.ended:
		case r.Expired:
			losses = append(losses, lostCalls{s.id, k.EndSessionLocked(s), true})
		case r.Err != nil:
			failed = append(failed, r.Err)
			k.retryLocked(s, hung, now)
		default:
			if !r.Lapsed {
				s.extend(r.Sent, r.TTL)
			}
			n := 0
			for _, id := range r.Gone {
				if c := k.ids[id]; c != nil && c.session == s && c.state != released && !c.gone && !c.releasing {
					k.loseLocked(c, now)
					n++
				}
			}
			if n > 0 {
				losses = append(losses, lostCalls{s.id, n, r.Lapsed})
			}
		}
	}
	for _, s := range ss {
		if !done[s] && !s.ended {
			k.retryLocked(s, hung, now)
		}
	}
	k.mu.Unlock()
	if len(failed) > 0 && k.bg.Err() == nil {
		k.logger.Warn(k.pkg+": session renewal failed; retrying", "locker", k.name, "sessions", len(failed), "error", failed[0])
	}
	for _, l := range losses {
		msg := k.pkg + ": entries gone from the server; their calls are lost"
		if l.lapsed {
			msg = k.pkg + ": session expired on the server; its calls are lost"
		}
		k.logger.Warn(msg, "locker", k.name, "session", l.session, "calls", l.calls)
	}
	return hung
}

// retryLocked schedules the next renewal of s after a failed one: at once
// after a round that ran out of its bound, else a tenth of the TTL later.
// The Core's mutex is held.
func (k *Core) retryLocked(s *Session, hung bool, now time.Time) {
	if hung {
		s.next = now
	} else {
		s.next = now.Add(s.ttl / 10)
	}
}

// check asks the engine to re-read the queue of every key on which this
// Locker has a waiting call, through its first waiting call.
func (k *Core) check() {
	var waiting []*Call
	k.mu.Lock()
	for _, cs := range k.keys {
		for _, c := range cs {
			if c.confirmed && c.state == queued && !c.granted && !c.gone {
				waiting = append(waiting, c)
				break
			}
		}
	}
	k.mu.Unlock()
	if len(waiting) == 0 || k.checker == nil {
		return
	}
	ctx, cancel := context.WithTimeout(k.bg, k.ttl/3) // one bound for the round
	defer cancel()
	k.checker.Check(ctx, waiting)
}
