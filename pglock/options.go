package pglock

import (
	"log/slog"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/fairlock"
)

// The options of New and NewSemaphore. They are package backend's, which
// every distributed backend takes; what each means on PostgreSQL is said
// here.

// DefaultTTL is the session TTL of a Locker built without WithTTL: how
// long the grants and queue places of a process that stopped renewing
// (crashed, paused, cut off from the database) keep blocking others, and
// the margin a live process has before a stall costs it its grants. It is
// etcdlock's and redislock's default, between Consul's lock (15 s session
// TTL) and redsync (8 s expiry).
const DefaultTTL = backend.DefaultTTL

// minTTL is the shortest TTL WithTTL sets.
const minTTL = 100 * time.Millisecond

// An Option configures a Locker or Semaphore in New or NewSemaphore.
type Option = backend.Option

// WithTTL sets the TTL of the Locker's session (DefaultTTL, 10 s, without
// it), in whole milliseconds, at least 100 ms. The session is one row of
// fairlock_sessions whose expiry the server sets to its own clock plus
// the TTL (clock_timestamp(), when the statement runs); the Locker renews
// it every third of the TTL while it is open, calls or not. Once the
// server's clock passes the expiry, the Locker's grants and queue places
// are dead, and the next statement on each of their keys deletes them
// (a waiting Locker reads its keys every third of its own TTL, so a
// crashed holder's key goes to the next waiter within TTL + TTL/3 and a
// round trip). A live process that cannot renew for about a TTL sees its
// grants' Lost channels close (see Guard.Lost), and Guard.Deadline says
// until when a grant is certain. d <= 0 means DefaultTTL.
func WithTTL(d time.Duration) Option { return backend.WithTTL(d) }

// WithName names the Locker in debug output (package debug), in the
// observer's fairlock.locker attribute, and in its session row
// (fairlock_sessions.name), where every process's listing of a key's
// calls shows it. Without it a Locker is named "pglock-N" (a Semaphore
// "pglock-semaphore-N"), N counting those made by this process from 1.
func WithName(name string) Option { return backend.WithName(name) }

// WithObserver sets the hook that receives the Locker's metrics, as for a
// fairlock.Locker (package otelmetrics implements it): every call that
// asks for a key reports its result (lost: its session expired or its row
// was deleted; error: the database failed) and how long it waited, every
// Unlock of a held grant how long it was held, and the stats callback
// counts this process's held keys and queued calls. Wait is not reported:
// it acquires nothing. A nil Observer means none.
func WithObserver(o fairlock.Observer) Option { return backend.WithObserver(o) }

// WithDebug registers the Locker in the process-wide debug registry while
// it is open, so package debug lists it (Kind "pglock.Locker" or
// "pglock.Semaphore"): for each key this process holds or waits for, its
// holders with their fencing tokens and ages, and its queued calls in
// arrival order. Only this process's calls are shown; every process's are
// rows of fairlock_calls, joined with fairlock_sessions for who made
// them (Schema). It costs nothing per call beyond the bookkeeping every
// Locker does.
func WithDebug() Option { return backend.WithDebug() }

// WithLogger sets where the Locker reports what it cannot return to a
// caller: a session it lost, its listening connection down and back, a
// row it could not delete at once and retries in the background. A nil
// logger means slog.Default(), the default.
func WithLogger(l *slog.Logger) Option { return backend.WithLogger(l) }

// ttlOf rounds a TTL to whole milliseconds, at least minTTL.
func ttlOf(d time.Duration) time.Duration {
	return max(d.Round(time.Millisecond), minTTL)
}
