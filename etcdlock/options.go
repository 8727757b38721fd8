package etcdlock

import (
	"log/slog"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/fairlock"
)

// The options of New and NewSemaphore. They are package backend's, which
// every distributed backend takes; what each means on etcd is said here.

// DefaultTTL is the lease TTL of a Locker built without WithTTL. It is how
// long the keys of a process that stopped renewing (crashed, partitioned,
// paused) keep blocking others, so it bounds fail-over; it is also the
// margin a live process has before a stall or a lost connection costs it
// its grants. Ten seconds sits between Consul's lock (15 s session TTL)
// and redsync (8 s expiry); etcd's concurrency.Session defaults to 60 s.
const DefaultTTL = backend.DefaultTTL

// An Option configures a Locker in New, or a Semaphore in NewSemaphore.
type Option = backend.Option

// WithTTL sets the TTL of the Locker's lease (DefaultTTL, 10 s, without
// it). etcd counts lease TTLs in whole seconds: d is rounded up to a whole
// second, and at least 1 s; the server may raise it to its own minimum
// (one and a half election timeouts). The Locker renews its lease every
// third of the TTL while it is open; each renewal attempt is given a
// sixth of the TTL (at least 250 ms) and then retried at once, which the
// client sends on its next connection, so that one member that stops
// answering costs no lease while the others answer. A process that stops
// renewing loses its grants when the TTL runs out on the server; a live
// process that cannot reach a quorum for about a TTL sees its grants'
// Lost channels close (see Guard.Lost and Guard.Deadline). d <= 0 means
// DefaultTTL.
func WithTTL(d time.Duration) Option { return backend.WithTTL(d) }

// WithName names the Locker in debug output (package debug) and in the
// observer's fairlock.locker attribute. Without it a Locker is named
// "etcdlock-N", N counting the Lockers made by this process from 1. Names
// need not be unique; the debug registry suffixes duplicates. The name is
// local to this process: it is not written to etcd.
func WithName(name string) Option { return backend.WithName(name) }

// WithObserver sets the hook that receives the Locker's metrics, as for a
// fairlock.Locker (package otelmetrics implements it): every Lock,
// TryLock, RLock, TryRLock, Acquire and TryAcquire reports its result
// (lost: its lease ended; error: etcd failed) and how long it waited,
// every Unlock of a held grant how long it was held, and the stats
// callback counts this process's held keys and queued calls. Wait is not
// reported: it acquires nothing. A nil Observer means none.
func WithObserver(o fairlock.Observer) Option { return backend.WithObserver(o) }

// WithDebug registers the Locker in the process-wide debug registry while
// it is open, so package debug lists it (Kind "etcdlock.Locker", or
// "etcdlock.Semaphore" with its units) like any fairlock Locker: for each
// key this process holds or waits for, its holders with their mode
// (exclusive, shared, or their units), fencing tokens and ages, and its
// queued calls in queue order with what each asks for. Only this
// process's calls are shown; the keys of other processes are in etcd
// under the prefix (etcdctl get --prefix shows them, each with its
// "host:pid owner" value). It costs nothing per call beyond the
// bookkeeping every Locker does, and nothing in etcd.
func WithDebug() Option { return backend.WithDebug() }

// WithLogger sets where the Locker reports what it cannot return to a
// caller: a lease it lost and replaced, a watch it restarted, a key it
// could not clean up at once and retries in the background. A nil logger
// means slog.Default(), the default.
func WithLogger(l *slog.Logger) Option { return backend.WithLogger(l) }
