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
// long the grants and queue places of a process that stopped renewing
// (crashed, paused, partitioned from Redis) keep blocking others, and the
// margin a live process has before a stall costs it its grants. It is
// etcdlock's default, between Consul's lock (15 s session TTL) and
// redsync (8 s expiry).
const DefaultTTL = backend.DefaultTTL

// An Option configures a Locker or Semaphore in New or NewSemaphore.
type Option = backend.Option

// WithTTL sets the TTL of the Locker's session (DefaultTTL, 10 s, without
// it), in whole milliseconds, at least 10 ms. The session is a marker key
// per lock key with the TTL, set by Redis (PX) and renewed every third of
// the TTL while the Locker has calls on the key; when the server lets it
// expire, the Locker's grants and queue places on the key are dead and
// the next script that meets them removes them. A live process that
// cannot renew for about a TTL sees its grants' Lost channels close (see
// Guard.Lost), and Guard.Deadline says until when a grant is certain.
// d <= 0 means DefaultTTL.
func WithTTL(d time.Duration) Option { return backend.WithTTL(d) }

// WithName names the Locker in debug output (package debug) and in the
// observer's fairlock.locker attribute. Without it a Locker is named
// "redislock-N" (a Semaphore "redislock-semaphore-N"), N counting those
// made by this process from 1. The name is local: it is not written to
// Redis.
func WithName(name string) Option { return backend.WithName(name) }

// WithObserver sets the hook that receives the Locker's metrics, as for a
// fairlock.Locker (package otelmetrics implements it): every call that
// asks for a key reports its result (lost: its session expired; error:
// Redis failed) and how long it waited, every Unlock of a held grant how
// long it was held, and the stats callback counts this process's held
// keys and queued calls. Wait is not reported: it acquires nothing. A nil
// Observer means none.
func WithObserver(o fairlock.Observer) Option { return backend.WithObserver(o) }

// WithDebug registers the Locker in the process-wide debug registry while
// it is open, so package debug lists it (Kind "redislock.Locker" or
// "redislock.Semaphore"): for each key this process holds or waits for,
// its holders with their fencing tokens and ages, and its queued calls in
// arrival order. Only this process's calls are shown; every process's are
// in Redis (ZRANGE on the key's queue, keys.go). It costs nothing per call
// beyond the bookkeeping every Locker does.
func WithDebug() Option { return backend.WithDebug() }

// WithLogger sets where the Locker reports what it cannot return to a
// caller: a session it lost on a key, a subscription it restarted, an
// entry it could not remove at once and retries in the background. A nil
// logger means slog.Default(), the default.
func WithLogger(l *slog.Logger) Option { return backend.WithLogger(l) }

// ttlOf rounds a TTL to Redis's unit for PX: whole milliseconds, at least
// 10 ms.
func ttlOf(d time.Duration) time.Duration {
	return max(d.Round(time.Millisecond), 10*time.Millisecond)
}

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
