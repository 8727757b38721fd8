package redislock

import (
	"errors"
	"log/slog"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/fairlock"
)

// The options of New and NewSemaphore. They are package backend's, which
// every distributed backend takes; what each means on Redis is said here.

// DefaultTTL is the session TTL of a Locker built without WithTTL: how
// long a process that stopped renewing (crashed, paused, partitioned from
// Redis) keeps its grants and queue places, and the margin a live one has
// before a stall costs it its grants (backend.DefaultTTL; redsync's
// expiry is 8 s).
const DefaultTTL = backend.DefaultTTL

// An Option configures a Locker or Semaphore in New or NewSemaphore: the
// options every backend takes (package backend), and WithReplicas.
type Option = backend.Option

// WithTTL sets the TTL of the Locker's session (DefaultTTL without it), in
// whole milliseconds, at least 10 ms: a marker key per lock key, set with
// the TTL by Redis (PX) and renewed every third of it while the Locker
// has calls on the key. When the server lets it expire, the Locker's
// grants and queue places on the key are dead and the next script that
// meets them removes them; a live process that cannot renew before its
// Deadline sees its grants' Lost close. d <= 0 means DefaultTTL.
func WithTTL(d time.Duration) Option { return backend.WithTTL(d) }

// WithReplicas makes every grant and every session renewal count only
// once n replicas of the Redis primary acknowledged it: the enqueueing
// script and each round of renewals are followed, on the same connection
// and in the same round trip, by WAIT n timeout. An enqueue that fewer
// than n replicas acknowledged within timeout fails the call with an
// error wrapping ErrNotReplicated (its entry is removed), and a renewal
// that fewer acknowledged does not move the grant's Deadline, so a
// holder whose replicas stopped acknowledging sees Lost close at its
// Deadline rather than hold a grant a failover could forget. A failover
// to a replica that acknowledged can then neither grant a key twice nor
// hand a token out again; this is what Redisson does by default when
// replicas exist, and what redsync, bsm/redislock and rueidislock do not
// (docs/distributed.md, "Redis"). It costs each enqueue and renewal the
// replicas' acknowledgement, up to timeout: keep timeout well below a
// sixth of the TTL (a renewal round's bound). n <= 0 turns it off (the
// default); timeout is rounded to whole milliseconds, at least 1. It
// applies to a single primary with replicas (Sentinel's failover client
// included); on a Cluster each master's own replicas acknowledge its
// keys.
func WithReplicas(n int, timeout time.Duration) Option {
	return backend.EngineOption(replicas{n: n, timeout: max(timeout.Round(time.Millisecond), time.Millisecond)})
}

// replicas is WithReplicas's setting.
type replicas struct {
	n       int
	timeout time.Duration
}

// ErrNotReplicated is wrapped by the error of a call that fewer replicas
// than WithReplicas asks for acknowledged within its timeout: it was not
// granted (its entry was removed), and may be retried.
var ErrNotReplicated = errors.New("redislock: not acknowledged by the replicas WithReplicas asks for")

// WithName names the Locker in debug output and the observer's
// fairlock.locker attribute ("redislock-N", or "redislock-semaphore-N",
// without it). It is not written to Redis.
func WithName(name string) Option { return backend.WithName(name) }

// WithObserver sets the hook that receives the Locker's metrics (package
// otelmetrics implements it), as backend.WithObserver says; its results
// include lost (a session expired under a grant) and error (Redis failed).
func WithObserver(o fairlock.Observer) Option { return backend.WithObserver(o) }

// WithDebug lists the Locker in package debug (Kind "redislock.Locker" or
// "redislock.Semaphore"): this process's holders and waiters; every
// process's entries are in Redis (ZRANGE on the key's queue, QueueKey).
func WithDebug() Option { return backend.WithDebug() }

// WithLogger sets where the Locker reports what it cannot return to a
// caller (a session it lost on a key, a subscription it restarted, an
// entry it removes in the background); nil means slog.Default().
func WithLogger(l *slog.Logger) Option { return backend.WithLogger(l) }

// ttlOf rounds a TTL to Redis's unit for PX: whole milliseconds, at least
// 10 ms.
func ttlOf(d time.Duration) time.Duration {
	return max(d.Round(time.Millisecond), 10*time.Millisecond)
}
