// Package pglock will be fairlock's fair, strict-FIFO keyed lock across
// processes on PostgreSQL (13 or newer), through pgx v5's *pgxpool.Pool:
// the third engine on the skeleton that etcdlock and redislock share
// (DESIGN.md, "Package pglock"). Its public API is not written yet. What
// it holds today is the engine's protocol, unexported, with its tests
// against a real server:
//
//   - schema.go: Schema, the tables (sessions, one row per call), and
//     their creation or the error that names the privileges missing;
//   - space.go: a prefix's notice channel, a key's advisory lock, a
//     call's name and mode;
//   - walk.go: the grant rule in SQL, why ids commit in id order per key,
//     why tokens never go back, the purge of dead rows, the notices;
//   - queue.go: enqueue, release, readKey, locked, listCalls, sweep;
//   - session.go: createSession, renewSession, endSession;
//   - fence.go: fence, the check inside the caller's own transaction;
//   - listen.go: the LISTEN connection, its reconnection and re-read, and
//     the refusal of a pooler in transaction mode.
package pglock
