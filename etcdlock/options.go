package etcdlock

import (
	"log/slog"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/fairlock"
)

// ttlSeconds rounds d up to whole seconds, at least one: etcd's unit.
func ttlSeconds(d time.Duration) time.Duration {
	s := (d + time.Second - 1) / time.Second
	return max(s, 1) * time.Second
}

// The options of New and NewSemaphore. They are package backend's, which
// every distributed backend takes; what each means on etcd is said here.

// DefaultTTL is the lease TTL of a Locker built without WithTTL: how
// long a process that stopped renewing (crashed, partitioned, paused)
// keeps its keys, and the margin a live one has before a stall costs it
// its grants (backend.DefaultTTL; etcd's concurrency.Session uses 60 s).
const DefaultTTL = backend.DefaultTTL

// An Option configures a Locker in New, or a Semaphore in NewSemaphore:
// the options every backend takes (package backend).
type Option = backend.Option

// WithTTL sets the TTL of the Locker's lease (DefaultTTL without it). etcd
// counts lease TTLs in whole seconds: d is rounded up to a whole second,
// and at least 1 s; the server may raise it to its own minimum (one and a
// half election timeouts). The lease is renewed every third of the TTL;
// each attempt is given a sixth of it (at least 250 ms) and then retried
// at once, which the client sends on its next connection, so that one
// member that stops answering costs no lease while the others answer. A
// live process that cannot reach a quorum until its Deadline sees its
// grants' Lost close. d <= 0 means DefaultTTL.
func WithTTL(d time.Duration) Option { return backend.WithTTL(d) }

// WithName names the Locker in debug output and the observer's
// fairlock.locker attribute ("etcdlock-N" without it). It is not written
// to etcd.
func WithName(name string) Option { return backend.WithName(name) }

// WithObserver sets the hook that receives the Locker's metrics (package
// otelmetrics implements it), as backend.WithObserver says; its results
// include lost (a lease ended under a grant) and error (etcd failed).
func WithObserver(o fairlock.Observer) Option { return backend.WithObserver(o) }

// WithDebug lists the Locker in package debug (Kind "etcdlock.Locker" or
// "etcdlock.Semaphore"): this process's holders and waiters; the keys of
// other processes are in etcd under the prefix (etcdctl get --prefix
// shows them, each with its "host:pid owner" value).
func WithDebug() Option { return backend.WithDebug() }

// WithLogger sets where the Locker reports what it cannot return to a
// caller (a lease it replaced, a watch it restarted, a key it deletes in
// the background); nil means slog.Default().
func WithLogger(l *slog.Logger) Option { return backend.WithLogger(l) }
