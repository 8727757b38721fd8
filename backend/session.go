package backend

import "time"

// Sessions. Every entry an engine writes belongs to a session: what the
// engine renews, and whose end loses the entries it kept (etcd: the
// Locker's lease; Redis: the Locker's marker on one key; PostgreSQL: the
// Locker's session row). The kit keeps, per session, its deadline: the
// send time of the last write or renewal the engine confirmed, plus the
// TTL the engine granted, less a tenth of it (margin). The engine's
// server cannot have expired the session before that instant, as long as
// the two clocks run at rates within 10% of each other; the send time,
// not the reply's arrival, starts the count. The deadline only moves
// forward; when it passes without a renewal the kit loses the session's
// calls (their Lost channels close) and ends it.

// margin is the share of a TTL that a deadline keeps back for clock-rate
// drift between this process and the engine's server: a tenth.
func margin(ttl time.Duration) time.Duration { return ttl / 10 }

// ID returns the id the engine gave the session.
func (s *Session) ID() string { return s.id }

// TTL returns the TTL the engine granted the session last. The Core's
// mutex must be held.
func (s *Session) TTL() time.Duration { return s.ttl }

// Data returns what the engine stored with SetData. The Core's mutex
// must be held.
func (s *Session) Data() any { return s.data }

// SetData stores the engine's state for the session (etcd's lease id, a
// Redis node). The Core's mutex must be held.
func (s *Session) SetData(v any) { s.data = v }

// Ended reports whether the session has ended: lost, expired, or given
// up. The Core's mutex must be held.
func (s *Session) Ended() bool { return s.ended }

// extend moves the deadline to sent+ttl-margin if that is later, and
// schedules the next renewal a third of the TTL after sent. The Core's
// mutex is held.
func (s *Session) extend(sent time.Time, ttl time.Duration) {
	if ttl > 0 {
		s.ttl = ttl
	}
	if d := sent.Add(s.ttl - margin(s.ttl)); d.After(s.deadline) {
		s.deadline = d
	}
	if n := sent.Add(s.ttl / 3); n.After(s.next) {
		s.next = n
	}
}

// live reports whether the kit renews s: it has not ended, and it is
// persistent or keeps a confirmed call. The Core's mutex is held.
func (s *Session) live() bool { return !s.ended && (s.persistent || s.calls > 0) }
