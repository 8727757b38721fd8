// Package pglock is fairlock's fair, strict-FIFO keyed lock across
// processes on PostgreSQL (13 or newer), through pgx v5's *pgxpool.Pool,
// for services whose one shared engine is their database.
//
// Every call is its own row in a table (fairlock_calls: Schema), and a
// key's calls are granted in the order of their rows' ids: an exclusive
// call when it is first, a reader when every call ahead is a reader, a
// semaphore's Acquire(w) when the units of every call ahead plus w fit
// (head-of-line), a Wait when everything ahead has been released. Each
// enqueue, release and re-read of a key is one round trip, in one
// transaction that holds the key's transaction-scoped advisory lock, so
// ids commit in id order per key and every process reads the same grants
// from the same rows. The promises are fairlock's: ErrReentrant at once
// for an owner that already holds the key through this Locker (checked in
// this process, without a round trip), Try forms that never overtake a
// queued call, Wait, Close. Errors are *fairlock.LockError values naming
// the key and wrapping fairlock's sentinels, a context's error, a
// database error, or ErrLost.
//
// # Sessions and loss
//
// Liveness uses the server's clock alone: each Locker has a session row
// whose expiry PostgreSQL sets to clock_timestamp() plus the TTL, renewed
// every third of the TTL. A call whose session has expired is dead, and
// the next statement on its key deletes it, so a crashed or paused
// process blocks others for at most about one TTL however many of its
// calls are queued; a Locker whose session expired makes a new one. A
// grant can therefore be lost, and Guard.Lost says so. Guard.Token (the
// row's id: strictly increasing per key, never going back across a
// restart) lets a store refuse the writes of a grant that is no longer
// current, and Guard.Fence does better for the same database: inside the
// caller's own transaction it proves the grant current and keeps it so
// until the transaction ends. docs/distributed.md states the failure
// model.
//
// # Hand-off
//
// Each Locker keeps one connection of its own that LISTENs on its
// prefix's channel. Every statement that grants calls sends their names
// there (pg_notify, delivered when it commits), and the Locker wakes its
// calls among them, without polling and without another round trip.
// Waiting calls hold no connection: 500 calls can wait on a pool of ten.
// A notice missed while the listening connection is down is covered by
// re-reading the keys of the waiting calls when it is back, and a waiting
// Locker re-reads each of its keys every third of the TTL (which also
// deletes the rows of a holder that died), once per key for all its calls
// on it. Connection poolers in transaction mode cannot carry LISTEN, and
// New refuses them with an error that names them.
//
// # Memory model
//
// For a key k, the n'th successful Unlock of k, by any process, happens
// before the return of the m'th Lock of k for n < m, in the sense
// PostgreSQL gives: the release commits before the statement whose result
// or notice grants the next call. A transaction fenced with Guard.Fence
// commits before the next grant of its key; other writes made under a
// grant are ordered with the next holder's only through a store that
// checks fencing tokens.
//
// # The protocol
//
// The files hold the engine's protocol from the bottom up: schema.go (the
// tables, their creation, the privileges), space.go (a prefix's channel,
// a key's advisory lock, a call's name), walk.go (the grant rule in SQL,
// why ids commit in id order, why tokens never go back, the purge of dead
// rows, the notices), queue.go (enqueue, release, read), session.go,
// fence.go and listen.go (the listening connection and the refusal of a
// pooler in transaction mode). engine.go and keeper.go put it under
// package backend's kit, which every backend shares.
package pglock
