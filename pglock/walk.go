package pglock

import "strconv"

// The grant rule and the statements built on it. pglock's queues are rows
// of fairlock_calls (schema.go), one per call, in the order of their ids;
// whether a row holds its key is not stored anywhere: it follows from the
// rows ahead of it, so a grant is never a separate write that could be
// lost, and every process reads the same answer from the same rows.
//
// # The rule
//
// Walk a key's rows in id order. A run of Waits at the head is
// transparent: each of them is granted (its turn has come: nothing is
// granted ahead of it but other Waits) and the rows behind are judged as
// if the run were gone, so one release frees every Wait directly behind
// it and the call behind them at once. Of the rest, the first is granted
// whatever its mode; a reader is granted when every row ahead of it
// (after the Waits) is a reader; units of a semaphore of size n when every
// row ahead is units and their weights plus its own fit in n; and the walk
// stops at the first row that is not granted, so nobody overtakes
// (head-of-line). A Wait that is not at the head is judged as an
// exclusive call, so calls behind it, readers included, wait as behind a
// Lock. This is the rule of etcdlock and redislock, and of fairlock in
// process (DESIGN.md, "Shared holds, semaphores, fencing tokens, Wait").
// grantedSQL writes it in SQL with window functions; a row once granted
// stays granted until it is deleted (rows are only appended behind it,
// and deleting a row ahead only shrinks what is ahead), so a grant is a
// fact a process can keep until its row goes.
//
// # Order
//
// Every statement that changes a key's rows (enqueue, release, and the
// purging read) runs in one READ COMMITTED transaction that first takes
// the key's transaction-scoped advisory lock, pg_advisory_xact_lock(
// lockClass, keyLock(key)), held until it commits. In READ COMMITTED each
// statement reads a snapshot taken when it starts, so the statements after
// the lock see every earlier change to the key committed. Hence ids,
// which the identity sequence gives out inside the lock, commit in id
// order per key: a later id cannot commit, see an empty queue and be
// granted while an earlier one is still in flight and is granted too.
// Every snapshot shows a key's rows as a prefix of its calls in id order,
// less those deleted, and the rule above gives every reader the same
// grants. The same lock makes "who did the change that granted a row"
// well defined, which the notices need: a change announces exactly the
// rows it newly granted, and a change that lands between another's read
// and its commit cannot happen. (Without it, an enqueue could read a
// holder that a concurrent release deletes, each missing the other: the
// enqueued call would wait for a notice nobody sends.)
//
// Tokens are the ids: strictly increasing per key, since they are given
// out in commit order, and never going back, since a logged table's
// identity sequence is WAL-logged (ahead of the values it hands out) and
// recovered after a crash. Each writing transaction sets
// synchronous_commit on for itself when the session has it off, so that a
// grant or a token returned to a caller cannot be lost in a crash and
// handed out again.
//
// # Dead rows
//
// A row whose session has expired by the server's clock
// (clock_timestamp(), read as the statement runs, not the transaction's
// start) or whose session row is gone is dead. Every writing statement on
// a key first deletes the key's dead rows (all of them, not only those at
// the head: each is a statement's scan of the key's rows, which the rule
// reads anyway), except the rows that a Fence holds: it selects them FOR
// UPDATE SKIP LOCKED, and Fence holds its row FOR SHARE until the fenced
// transaction ends. A fenced dead row stays and goes on holding the key.
//
// # Notices
//
// The statement then computes the grants before its change (over the rows
// as they were, dead ones included) and after it, and sends the rows
// newly granted with pg_notify on the prefix's channel, as
// "session:seq" words separated by spaces in queue order, at most
// noticeCalls of them per notice (a payload holds under 8000 bytes; the
// order of the notices of one change is not promised). PostgreSQL
// delivers them when the transaction commits, to every connection that
// LISTENs on the channel (listen.go), in the order the transactions
// committed.

// noticeCalls is how many calls one notice names at most: a call is at
// most 40 bytes ("session:seq", two int64s, and a space), and a payload
// must stay under 8000 bytes.
const noticeCalls = 190

// grantedSQL returns the CTE name: the ids of the rows of the relation
// from (with columns id, mode, weight, size) that the rule grants.
func grantedSQL(name, from string) string {
	return name + ` AS (
    SELECT id FROM (
        SELECT id, bool_and(lead OR fits) OVER o AS ok FROM (
            SELECT id, lead,
                count(*) FILTER (WHERE NOT lead) OVER o = 1
                OR bool_and(mode = 'r') FILTER (WHERE NOT lead) OVER o
                OR (bool_and(mode = 'u') FILTER (WHERE NOT lead) OVER o
                    AND sum(weight) FILTER (WHERE NOT lead) OVER o <= size) AS fits
            FROM (SELECT id, mode, weight, size, bool_and(mode = 'w') OVER o AS lead
                  FROM ` + from + ` WINDOW o AS (ORDER BY id)) a
            WINDOW o AS (ORDER BY id)
        ) b
        WINDOW o AS (ORDER BY id)
    ) c WHERE ok
)`
}

// walkSQL returns the CTEs every writing statement on a key starts with.
// Parameters: $1 prefix, $2 key, $3 the channel. also, if not empty, is
// a query of more ids to delete with the dead rows (a release's own
// row). The CTEs:
//
//	rows    the key's rows, as the statement's snapshot shows them
//	dead    the dead rows that no Fence holds, locked
//	gone    the rows deleted: dead, and also's
//	walk    rows, each with whether it is gone and whether the rule
//	        grants it among rows (before) and among rows less gone (after)
//	live    rows less gone
//	before  granted among rows
//	after   granted among live
//	sent    the notices of the rows in after and not in before, sent
//
// walk is the rule of grantedSQL computed twice in one pass over the rows
// in id order (one sort): once over every row, once over the rows not
// gone, whose aggregates skip the gone rows (FILTER), so that a row's
// "after" is its grant as if the gone rows were not there. A row is
// newly granted when it is not gone, granted after and not before.
//
// The statement must read sent (a CTE that nothing reads is not run).
func walkSQL(also string) string {
	del := "SELECT id FROM dead"
	if also != "" {
		del += " UNION " + also
	}
	return `WITH rows AS (
    SELECT id, session, seq, mode, weight, size FROM fairlock_calls WHERE prefix = $1 AND key = $2
),
dead AS (
    SELECT c.id FROM fairlock_calls c
    WHERE c.prefix = $1 AND c.key = $2
      AND NOT EXISTS (SELECT 1 FROM fairlock_sessions s WHERE s.id = c.session AND s.expires_at > clock_timestamp())
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM fairlock_calls c WHERE c.id IN (` + del + `) RETURNING c.id, c.session, c.seq
),
walk AS (
    SELECT id, session, seq, mode, weight, size, gone,
        bool_and(lead_b OR fits_b) OVER o AS before,
        bool_and(lead_a OR fits_a) FILTER (WHERE NOT gone) OVER o AS after
    FROM (
        SELECT *,
            count(*) FILTER (WHERE NOT lead_b) OVER o = 1
            OR bool_and(mode = 'r') FILTER (WHERE NOT lead_b) OVER o
            OR (bool_and(mode = 'u') FILTER (WHERE NOT lead_b) OVER o
                AND sum(weight) FILTER (WHERE NOT lead_b) OVER o <= size) AS fits_b,
            count(*) FILTER (WHERE NOT gone AND NOT lead_a) OVER o = 1
            OR bool_and(mode = 'r') FILTER (WHERE NOT gone AND NOT lead_a) OVER o
            OR (bool_and(mode = 'u') FILTER (WHERE NOT gone AND NOT lead_a) OVER o
                AND sum(weight) FILTER (WHERE NOT gone AND NOT lead_a) OVER o <= size) AS fits_a
        FROM (
            SELECT *, bool_and(mode = 'w') OVER o AS lead_b,
                bool_and(mode = 'w') FILTER (WHERE NOT gone) OVER o AS lead_a
            FROM (SELECT *, id IN (SELECT id FROM gone) AS gone FROM rows) r
            WINDOW o AS (ORDER BY id)
        ) a
        WINDOW o AS (ORDER BY id)
    ) b
    WINDOW o AS (ORDER BY id)
),
live AS (SELECT id, session, seq, mode, weight, size FROM walk WHERE NOT gone),
before AS (SELECT id FROM walk WHERE before),
after AS (SELECT id FROM walk WHERE NOT gone AND after),
sent AS (
    SELECT pg_notify($3, string_agg(session || ':' || seq, ' ' ORDER BY id)) FROM (
        SELECT id, session, seq, (row_number() OVER (ORDER BY id) - 1) / ` + strconv.Itoa(noticeCalls) + ` AS chunk
        FROM walk WHERE NOT gone AND after AND NOT before
    ) n GROUP BY chunk
)`
}

// The verdicts of enqueueSQL.
const (
	verdictGranted    = "g" // inserted, granted
	verdictQueued     = "q" // inserted, behind others
	verdictWasGranted = "G" // this call's row was there already (a resent enqueue), granted
	verdictWasQueued  = "Q" // likewise, not granted
	verdictWouldBlock = "b" // a Try that would wait: nothing written
	verdictFree       = "f" // a Wait with nothing to wait for: nothing written
	verdictOtherSize  = "n" // units of another semaphore size are queued: nothing written
	verdictExpired    = "e" // the session has expired: nothing written
)

// enqueueSQL queues a call. Parameters after walkSQL's: $4 session, $5
// seq, $6 mode, $7 weight, $8 size, $9 label, $10 try (write only if
// granted now). It returns the verdict, the call's id (0 if none) and the
// other size (0 unless the verdict is verdictOtherSize).
//
// A Wait is granted now when every live row is a Wait (all granted,
// transparent), and then writes nothing; any call is granted now when
// the rows after the head's Waits are none, or it is a reader and they
// are all readers, or it is units and they are all units that with it
// fit in size: it would be the last of the granted prefix. A Try that is
// not is refused, so it never overtakes.
var enqueueSQL = walkSQL("") + `,
alive AS (
    SELECT EXISTS (SELECT 1 FROM fairlock_sessions WHERE id = $4 AND expires_at > clock_timestamp()) AS ok
),
mine AS (SELECT id FROM live WHERE session = $4 AND seq = $5),
tail AS (
    SELECT count(*) AS n,
        coalesce(bool_and(mode = 'r'), true) AS all_r,
        coalesce(bool_and(mode = 'u'), true) AS all_u,
        coalesce(sum(weight), 0) AS units
    FROM live WHERE id >= (SELECT min(id) FROM live WHERE mode <> 'w')
),
other AS (SELECT min(size) AS size FROM live WHERE mode = 'u' AND size <> $8::bigint),
verdict AS (
    SELECT CASE
        WHEN NOT (SELECT ok FROM alive) THEN 'e'
        WHEN EXISTS (SELECT 1 FROM mine) THEN
            CASE WHEN (SELECT id FROM mine) IN (SELECT id FROM after) THEN 'G' ELSE 'Q' END
        WHEN $6::text = 'u' AND (SELECT size FROM other) IS NOT NULL THEN 'n'
        WHEN t.n = 0 THEN CASE WHEN $6::text = 'w' THEN 'f' ELSE 'g' END
        WHEN ($6::text = 'r' AND t.all_r) OR ($6::text = 'u' AND t.all_u AND t.units + $7::bigint <= $8::bigint) THEN 'g'
        WHEN $10::boolean THEN 'b'
        ELSE 'q'
    END AS v
    FROM tail t
),
ins AS (
    INSERT INTO fairlock_calls (prefix, key, session, seq, mode, weight, size, label)
    SELECT $1, $2, $4, $5, $6, $7, $8, $9 FROM verdict WHERE v IN ('g', 'q')
    RETURNING id
)
SELECT v, coalesce((SELECT id FROM ins), (SELECT id FROM mine), 0), coalesce((SELECT size FROM other), 0),
    (SELECT count(*) FROM sent)
FROM verdict`

// releaseSQL deletes a call's row with the dead ones. Parameters after
// walkSQL's: $4 session, $5 seq. It returns whether the row was there,
// whether its session is alive, and the number of notices sent.
var releaseSQL = walkSQL("SELECT id FROM rows WHERE session = $4 AND seq = $5") + `
SELECT EXISTS (SELECT 1 FROM gone WHERE session = $4 AND seq = $5),
    EXISTS (SELECT 1 FROM fairlock_sessions WHERE id = $4 AND expires_at > clock_timestamp()),
    (SELECT count(*) FROM sent)`

// releaseAllSQL deletes calls' rows with the dead ones. Parameters after
// walkSQL's: $4 sessions, $5 seqs (arrays: the calls, pairwise). It
// returns the number of notices sent.
var releaseAllSQL = walkSQL("SELECT id FROM rows WHERE (session, seq) IN (SELECT * FROM unnest($4::bigint[], $5::bigint[]))") + `
SELECT count(*) FROM sent`

// readSQL purges a key's dead rows, announces what that grants, and
// reports the key. Parameter after walkSQL's: $4 a session (0: none). It
// returns the number of live rows other than Waits', and the seq, id and
// grant of each of the session's rows on the key, in id order.
var readSQL = walkSQL("") + `
SELECT (SELECT count(*) FROM live WHERE mode <> 'w'),
    array(SELECT seq FROM live WHERE session = $4 ORDER BY id),
    array(SELECT id FROM live WHERE session = $4 ORDER BY id),
    array(SELECT id IN (SELECT id FROM after) FROM live WHERE session = $4 ORDER BY id),
    (SELECT count(*) FROM sent)`

// listSQL lists a key's rows with their sessions, in id order, without
// changing anything: $1 prefix, $2 key. Grants are computed over the
// live rows, as the next purge would leave them (a dead row that a Fence
// holds is shown dead and not granted, though it still holds the key).
var listSQL = `WITH rows AS (
    SELECT c.id, c.session, c.seq, c.mode, c.weight, c.size, c.label,
        (extract(epoch FROM clock_timestamp() - c.created_at) * 1000000)::bigint AS age,
        coalesce(s.expires_at > clock_timestamp(), false) AS alive,
        coalesce(s.name, '') AS name, coalesce(s.host, '') AS host, coalesce(s.pid, 0) AS pid
    FROM fairlock_calls c LEFT JOIN fairlock_sessions s ON s.id = c.session
    WHERE c.prefix = $1 AND c.key = $2
),
live AS (SELECT * FROM rows WHERE alive),
` + grantedSQL("granted", "live") + `
SELECT id, session, seq, mode, weight, size, label, age, alive, name, host, pid, id IN (SELECT id FROM granted)
FROM rows ORDER BY id`
