// Package backend is the half of fairlock's distributed backends
// (etcdlock, redislock, pglock) that is not their engine's protocol,
// written once: the Locker's core and the grant every call returns. A
// backend is its engine's protocol (an Engine) on a Core; a fourth
// backend is its protocol and nothing else. It is a public package of
// the core module because the backends are modules of their own; it
// imports only the standard library and the core module's packages.
// Users of a backend never see it: its types are behind the backend's
// Locker, Semaphore and Guard.
//
// # What an engine must provide
//
// Each call (Lock, TryLock, RLock, TryRLock, Wait, Acquire, TryAcquire) is
// its own entry in its key's queue in the engine, and the entries of a key
// are granted in queue order, across every process on the same prefix:
// an Exclusive entry when it is first; a Shared one when every entry ahead
// is Shared; Units when the units of every entry ahead plus its own fit in
// the semaphore's size (head-of-line); and a Turn (Wait) when every entry
// ahead has been granted and released, at which instant it is transparent:
// the entries behind it are judged as if it were gone, so one release
// frees every Turn directly behind it and the call behind them at once.
// The Engine interface (engine.go) asks for:
//
//   - Enqueue: write a call's entry at the back of its key's queue,
//     atomically with the decision whether it is granted at once (so a Try
//     form never overtakes: it writes only if granted), and return its
//     fencing token, larger than every earlier entry's of the key, and
//     the session that keeps it. The entry's id is chosen before the
//     write is sent (Call.Name), so that a lost reply leaves an entry the
//     kit can find and remove; a write retried after a lost reply must
//     not queue the call twice.
//   - Release: remove one grant's entry (only it, even if retried late),
//     say whether it was still current, and let the engine grant the
//     calls behind it.
//   - Remove: remove an entry by id, for cancelled calls and the janitor.
//   - Renew: renew sessions, saying for each when the confirmed renewal
//     was sent, the TTL granted, and which entries are gone (removed by
//     someone else, or purged because their session had expired).
//   - Shutdown: end the engine's sessions and goroutines at Close.
//
// and for notices, one of two ways. An engine that names in its notices
// the entries a change granted (a Redis announcement, a PostgreSQL
// NOTIFY) hands them to Core.Granted, and implements Checker: Check reads
// a key's queue again, purging the entries of dead sessions, to cover a
// notice lost while its channel was down and a holder that died (the kit
// calls it every third of the TTL while calls wait, and after
// Core.Reread). Such an engine may announce Turns by a bound instead of
// by name (Core.GrantTurns: every Turn of a key with a token below the
// bound has had its turn), so that a release frees any number of them
// without walking or naming each. An engine that judges each waiting call's turn itself
// from what it sees change (etcd's watch of the keys ahead) implements
// Watcher: WatchLocked, Refresh and UnwatchLocked bracket each call, and
// it calls Core.GrantLocked, LoseLocked and RefreshLocked. An engine whose
// sessions are made and ended by round trips (an etcd lease, a
// PostgreSQL session row) hands them to a Keeper, which replaces each
// one that ends and ends those given up.
//
// Liveness must follow the engine's clock alone: an entry whose session
// the engine has expired is dead, and the engine's own rules purge it
// when they meet it, so a crashed or paused process blocks others for at
// most about one TTL.
//
// # What the kit guarantees on top
//
//   - Calls per key and the owner table: ErrReentrant at once, without a
//     round trip, for an owner that holds the key through this Locker in
//     any mode; HandOff moves a grant to another flow.
//   - Writes with known outcomes: the write that queues a call runs apart
//     from the call's context; a call that gives up returns at once and
//     what the write left is removed; an unknown outcome goes to the
//     janitor, which retries removals every second (etcd-io/etcd#18082 is
//     what happens without it).
//   - Sessions and deadlines (session.go, renew.go): every session's
//     deadline, which only moves forward while held and which Deadline
//     returns; renewals bounded and retried at once when a server does
//     not answer; Lost closed when a deadline passes, even in a process
//     that was paused (a timer), and keylock.Valid reads the clock for a
//     paused process that has not run since; a grant is never handed out
//     past its session's deadline.
//   - The Call: idempotent Unlock that wraps fairlock.ErrLost for a lost
//     grant (with the failure, when the release also failed), Lost,
//     Token, Deadline, HandOff.
//   - Errors: a *fairlock.LockError naming the operation, the key and the
//     owner, wrapping a sentinel, the context's error (with its cause:
//     package ctxerr) or the engine's; ErrInvalidWeight with both sizes
//     (SizeError).
//   - Close and its drain; the Observer's results (fairlock.ResultOf:
//     lost and error are results of their own); the debug registry's
//     view of this process's calls; the options every backend takes.
//
// # Memory model
//
// For a key k, the n'th successful Unlock of k, by any process, happens
// before the return of the m'th Lock of k for n < m, in the sense the
// engine gives: the release is applied before the write or notice whose
// outcome grants the next call. Writes made under a grant are ordered
// with the next holder's only through the engine's own fencing or a store
// that checks fencing tokens (Kleppmann, "How to do distributed locking",
// 2016).
package backend
