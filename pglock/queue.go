package pglock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The calls on a key: enqueue, release, read, list. Each function is one
// round trip on one connection of the pool, held only for that round trip
// (a connection's first use of a statement adds one, to prepare it, with
// pgx's default statement cache): nothing holds a connection while a call
// waits for its grant. The SQL, and why it is correct, is in walk.go.

// errSessionExpired is returned by enqueue when the session has expired
// on the server: nothing was written, and the Locker needs a new session
// (an expired session is never renewed: its rows may already be purged).
var errSessionExpired = errors.New("pglock: session expired on the server")

// durableSQL turns synchronous_commit on for the transaction when the
// session has it off: a commit that returned must survive a crash, or a
// grant and its token could be handed out twice.
const durableSQL = `SELECT set_config('synchronous_commit', 'on', true) WHERE current_setting('synchronous_commit') = 'off'`

// keyLockSQL takes a key's advisory lock until the transaction ends.
const keyLockSQL = `SELECT pg_advisory_xact_lock($1::int4, $2::int4)`

// newTx returns a batch that opens a READ COMMITTED transaction (whatever
// the pool's default isolation: the order argument in walk.go needs a
// snapshot per statement) with synchronous commit. Statements queued on
// it, then commit, send it all as one round trip.
func newTx() *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	b.Queue(durableSQL)
	return b
}

// batcher is where a batch is sent: a pool (on one of its connections)
// or a connection.
type batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// commit queues COMMIT on b, sends b on a connection of pool (or on the
// connection pool is) and runs the queued callbacks. It returns the first
// error: a statement's error ends the transaction (PostgreSQL skips the
// rest, and pgxpool drops the connection, left in a failed transaction),
// and a lost connection leaves the outcome unknown.
func commit(ctx context.Context, pool batcher, b *pgx.Batch) error {
	b.Queue("COMMIT")
	return pool.SendBatch(ctx, b).Close()
}

// lockKey queues the key's advisory lock on b.
func (s space) lockKey(b *pgx.Batch, key string) {
	b.Queue(keyLockSQL, int32(lockClass), s.keyLock(key))
}

// enqueued is the outcome of an enqueue.
type enqueued int

const (
	queued     enqueued = iota // the call's row is written, and others are ahead of it
	granted                    // the call's row is written, and it holds the key
	wouldBlock                 // a Try that would have waited: nothing written
	free                       // a Wait on a key with nothing to wait for: nothing written
	otherSize                  // the key's queue holds units of a semaphore of another size: nothing written
)

// call is what enqueue writes for one call.
type call struct {
	ref    callRef
	mode   mode
	weight int64  // units asked (modeUnits); 0 otherwise
	size   int64  // the semaphore's units per key (modeUnits); 0 otherwise
	label  string // the owner's label, for listings
}

// enqueue writes c's row on key unless it would be a Try that waits, a
// Wait with nothing to wait for, or units of the wrong size, and says
// whether it is granted now (walk.go: enqueueSQL). With try it writes
// only a row that is granted now, so it never overtakes. It deletes the
// dead rows at the head of the key's queue first (those its walk meets:
// walk.go) and announces what that grants.
//
// It returns the outcome; the call's token (its row's id) for queued and
// granted; for otherSize, the size of the semaphore whose units are
// queued. It is one round trip in one transaction, which waits for the
// key's advisory lock while another enqueue, release or read of the key
// is in its transaction (one statement each). It is idempotent per call:
// sent again for the same c.ref (after a lost reply), it finds the row
// the first one wrote and reports it the same way, with the grant as it
// is now.
//
// Errors: errSessionExpired if the session has expired (nothing written);
// otherwise the database's or the connection's (the context's, if ctx
// ended), after which the outcome is unknown: the row may have been
// written, and release(c.ref) removes it, or enqueue(c) again learns it.
func enqueue(ctx context.Context, pool *pgxpool.Pool, s space, key string, c call, try bool) (enqueued, int64, int64, error) {
	b := newTx()
	s.lockKey(b, key)
	var verdict string
	var id, other, sent int64
	b.Queue(enqueueSQL, s.prefix, []byte(key), s.channel,
		c.ref.Session, c.ref.Seq, string(c.mode), c.weight, c.size, text(c.label), try,
	).QueryRow(func(row pgx.Row) error { return row.Scan(&verdict, &id, &other, &sent) })
	if err := commit(ctx, pool, b); err != nil {
		return 0, 0, 0, fmt.Errorf("pglock: enqueue: %w", err)
	}
	switch verdict {
	case verdictGranted, verdictWasGranted:
		return granted, id, 0, nil
	case verdictQueued, verdictWasQueued:
		return queued, id, 0, nil
	case verdictWouldBlock:
		return wouldBlock, 0, 0, nil
	case verdictFree:
		return free, 0, 0, nil
	case verdictOtherSize:
		return otherSize, 0, other, nil
	case verdictExpired:
		return 0, 0, 0, errSessionExpired
	}
	return 0, 0, 0, fmt.Errorf("pglock: enqueue: unknown verdict %q", verdict)
}

// releaseRowSQL locks a call's row before its key: a row that a Fence
// holds (FOR SHARE, until the fenced transaction ends) is waited for here,
// without the key's advisory lock, so enqueues and releases of other
// calls on the key go on meanwhile.
const releaseRowSQL = `SELECT id FROM fairlock_calls WHERE session = $1 AND seq = $2 FOR UPDATE`

// release deletes the row of call ref on key, wherever it is in the
// queue, with the dead rows at the head of the queue, and announces what
// that grants (walk.go: releaseSQL). It reports
// whether the row was there (false: it was never written, or was
// released or purged already) and whether its session is alive (false:
// the session expired, so the grant was lost even if the row was still
// there, whether or not anyone else was granted since). It is one round
// trip in one transaction; it waits while a Fence holds the row (until
// that transaction ends: a Guard must not be unlocked from inside its own
// fenced transaction, which would wait for itself) and then for the
// key's advisory lock. Running it again is harmless; it then reports
// false. Errors: the database's or the connection's, after which the
// row may or may not be gone (run it again).
func release(ctx context.Context, pool *pgxpool.Pool, s space, key string, ref callRef) (removed, alive bool, err error) {
	b := newTx()
	b.Queue(releaseRowSQL, ref.Session, ref.Seq)
	s.lockKey(b, key)
	var sent int64
	b.Queue(releaseSQL, s.prefix, []byte(key), s.channel, ref.Session, ref.Seq).
		QueryRow(func(row pgx.Row) error { return row.Scan(&removed, &alive, &sent) })
	if err := commit(ctx, pool, b); err != nil {
		return false, false, fmt.Errorf("pglock: release: %w", err)
	}
	return removed, alive, nil
}

// releaseRowsSQL locks the rows of calls before their key, as
// releaseRowSQL does one, in id order (so that two of them wait for each
// other's rows in the same order, never in a cycle). $1 sessions, $2
// seqs: the calls, pairwise.
const releaseRowsSQL = `SELECT id FROM fairlock_calls WHERE (session, seq) IN (SELECT * FROM unnest($1::bigint[], $2::bigint[])) ORDER BY id FOR UPDATE`

// releaseAll deletes the rows of the calls refs on key, with the dead
// rows at the head of the queue, and announces what that grants (walk.go: releaseAllSQL), as
// release does for one call: one round trip in one transaction, which
// waits while a Fence holds one of the rows and then for the key's
// advisory lock. Rows already gone are skipped. Running it again is
// harmless. Errors: the database's or the connection's, after which the
// rows may or may not be gone (run it again).
func releaseAll(ctx context.Context, pool *pgxpool.Pool, s space, key string, refs []callRef) error {
	sessions, seqs := make([]int64, len(refs)), make([]int64, len(refs))
	for i, r := range refs {
		sessions[i], seqs[i] = r.Session, r.Seq
	}
	b := newTx()
	b.Queue(releaseRowsSQL, sessions, seqs)
	s.lockKey(b, key)
	b.Queue(releaseAllSQL, s.prefix, []byte(key), s.channel, sessions, seqs)
	if err := commit(ctx, pool, b); err != nil {
		return fmt.Errorf("pglock: release: %w", err)
	}
	return nil
}

// callState is one of a session's calls on a key, as readKey found it.
type callState struct {
	Seq     int64
	Token   int64 // the row's id
	Granted bool
}

// readKey purges key's dead rows, announces what that grants, and
// reports the number of calls on the key other than Waits (live rows, and
// dead ones a Fence still holds: a Wait holds nothing, and a Wait whose
// turn came, whose row stays a moment after it returned, keeps nobody
// waiting) and, for session (0: none), the state of each of
// its calls there, in queue order (walk.go: readSQL). A Locker reads a
// key once for all its calls on it: on a timer (a holder's expiry purged
// here grants the next calls), and after its listening connection came
// back (notices sent meanwhile are lost). A call of the session that is
// not in the result is gone. It is one round trip in one transaction,
// which waits for the key's advisory lock. Errors: the database's or the
// connection's.
func readKey(ctx context.Context, pool *pgxpool.Pool, s space, key string, session int64) (calls int64, mine []callState, err error) {
	b := newTx()
	s.lockKey(b, key)
	var seqs, ids []int64
	var grants []bool
	var sent int64
	b.Queue(readSQL, s.prefix, []byte(key), s.channel, session).
		QueryRow(func(row pgx.Row) error { return row.Scan(&calls, &seqs, &ids, &grants, &sent) })
	if err := commit(ctx, pool, b); err != nil {
		return 0, nil, fmt.Errorf("pglock: read: %w", err)
	}
	if len(ids) != len(seqs) || len(grants) != len(seqs) {
		return 0, nil, fmt.Errorf("pglock: read: %d seqs, %d ids, %d grants", len(seqs), len(ids), len(grants))
	}
	for i := range seqs {
		mine = append(mine, callState{Seq: seqs[i], Token: ids[i], Granted: grants[i]})
	}
	return calls, mine, nil
}

// locked reports whether key has a call other than a Wait holding or
// queued in any process, after purging its dead rows (so a crashed holder
// does not count once its session has expired): readKey without a
// session. One round trip; errors as readKey's.
func locked(ctx context.Context, pool *pgxpool.Pool, s space, key string) (bool, error) {
	n, _, err := readKey(ctx, pool, s, key, 0)
	return n > 0, err
}

// callInfo is one call on a key, as listCalls shows it: who made it and
// whether it holds the key.
type callInfo struct {
	Token   int64 // the row's id: the fencing token when granted
	Ref     callRef
	Mode    mode
	Weight  int64
	Size    int64
	Label   string        // the owner's label
	Age     time.Duration // since the row was written, by the server's clock
	Alive   bool          // its session has not expired
	Name    string        // its Locker's name
	Host    string        // its process's host
	PID     int           // its process's id
	Granted bool          // it holds the key (computed over the live rows)
}

// listCalls returns key's calls in queue order, holders first, with the
// session of each: who holds the key and who waits, from any process. It
// changes nothing (dead rows are listed, not purged). One round trip, one
// statement: q may be a pool or the caller's transaction. Errors: the
// database's or the connection's.
func listCalls(ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, s space, key string) ([]callInfo, error) {
	rows, err := q.Query(ctx, listSQL, s.prefix, []byte(key))
	if err != nil {
		return nil, fmt.Errorf("pglock: list: %w", err)
	}
	var out []callInfo
	for rows.Next() {
		var ci callInfo
		var m string
		var age int64
		var pid int32
		if err := rows.Scan(&ci.Token, &ci.Ref.Session, &ci.Ref.Seq, &m, &ci.Weight, &ci.Size, &ci.Label,
			&age, &ci.Alive, &ci.Name, &ci.Host, &pid, &ci.Granted); err != nil {
			rows.Close()
			return nil, fmt.Errorf("pglock: list: %w", err)
		}
		ci.Mode, ci.Age, ci.PID = mode(m), time.Duration(age)*time.Microsecond, int(pid)
		out = append(out, ci)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pglock: list: %w", err)
	}
	return out, nil
}

// deadKeysSQL finds keys of a prefix with dead rows. $1 prefix, $2 limit.
const deadKeysSQL = `SELECT DISTINCT key FROM fairlock_calls c
WHERE prefix = $1
  AND NOT EXISTS (SELECT 1 FROM fairlock_sessions s WHERE s.id = c.session AND s.expires_at > clock_timestamp())
LIMIT $2`

// deadSessionsSQL deletes a prefix's expired sessions: their rows are
// dead already, and an expired session is never renewed.
const deadSessionsSQL = `DELETE FROM fairlock_sessions WHERE prefix = $1 AND expires_at <= clock_timestamp()`

// sweep purges the dead rows of up to limit keys of s, as readKey does
// (so the calls that waited behind them are granted and told), and
// deletes the prefix's expired sessions. Rows are otherwise purged only
// when a process touches their key, so a key that nobody locks again
// would keep a crashed process's rows for ever; a Locker sweeps when it
// starts. It returns the number of keys purged: limit means there may be
// more. Each key is a round trip, plus two. Errors: the database's or
// the connection's; the keys swept before one failed stay swept.
func sweep(ctx context.Context, pool *pgxpool.Pool, s space, limit int) (int, error) {
	rows, err := pool.Query(ctx, deadKeysSQL, s.prefix, limit)
	if err != nil {
		return 0, fmt.Errorf("pglock: sweep: %w", err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
	if err != nil {
		return 0, fmt.Errorf("pglock: sweep: %w", err)
	}
	for i, k := range keys {
		if _, _, err := readKey(ctx, pool, s, string(k), 0); err != nil {
			return i, fmt.Errorf("pglock: sweep: %w", err)
		}
	}
	if _, err := pool.Exec(ctx, deadSessionsSQL, s.prefix); err != nil {
		return len(keys), fmt.Errorf("pglock: sweep: %w", err)
	}
	return len(keys), nil
}
