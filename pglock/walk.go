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
// A row once granted stays granted until it is deleted (rows are only
// appended behind it, and deleting a row ahead only shrinks what is
// ahead), so a grant is a fact a process can keep until its row goes.
// The granted rows are thus a prefix of the key's rows in id order, and
// only that prefix and the row after it decide anything: walkSQL walks
// the key's rows from the head, one index probe per row, and stops after
// the first row that is not granted, so a statement costs the length of
// the granted prefix, not of the queue (a release behind 500 waiters
// reads two or three rows). grantedSQL writes the same rule over a whole
// queue with window functions, for listings.
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
// a key deletes the dead rows its walk meets, except the rows that a
// Fence holds: it tries each one FOR UPDATE SKIP LOCKED, and Fence holds
// its row FOR SHARE until the fenced transaction ends. A fenced dead row
// stays and goes on holding the key. (So does, for a moment, a dead row
// whose own release has locked it and waits for the key's lock: the
// release then deletes it.) A dead row behind the first row not
// granted decides nothing until the rows ahead of it go, and the walk
// that then reaches it deletes it; the read (readSQL: a Locker's timer,
// the sweep of a crashed process's rows, Locked) deletes every dead row
// of the key.
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
// Parameters: $1 prefix, $2 key, $3 the channel. calls, if not empty, is
// a query of the (session, seq) pairs of the calls whose rows the
// statement deletes, wherever they are in the queue (a release's). With
// all, the statement also deletes the dead rows behind the walk (the
// read's). The CTEs:
//
//	walk    the key's rows from the head, in id order, after a seed row
//	        of id 0, up to the first row not granted (among the rows not
//	        gone), each with whether the statement deletes it (g), its
//	        grant among every row (before), and its grant among the rows
//	        not deleted (after), and the state of both walks so far
//	beyond  (all) the dead rows behind the walk that no Fence holds, locked
//	gone    the rows deleted: those of walk with g, the calls' and beyond's
//	before  granted among the rows as they were, dead ones included
//	after   granted among the rows left
//	sent    the notices of the rows in after and not in before, sent
//
// Each step of walk reads the next row of the key (the queue's index),
// whether its session is alive, and, for a dead row, whether it can be
// locked (no Fence holds it); and it carries, for each of the two walks,
// whether the walk still grants (before, after), whether it is still in
// the head's run of Waits (lead), and the count, all readers, all units
// and the sum of units of the rows after that run: the aggregates that
// grantedSQL's windows compute. The walk over the rows left skips the
// rows deleted. A step reads a run of rows of one mode at once, in one
// index range (last marks the row the next step starts from), where
// judging each row of the run from the state before it gives what a walk
// row by row gives: the Waits up to the next other row while the walk
// over the rows left is in the head's run of Waits (each is granted
// after; in the walk over every row, each is granted if that walk is in
// the run too, and otherwise the first of them ends its grants, as each
// of them would), and the readers up to the next other row while that
// walk has granted only readers (each is granted after; in the other
// walk, each is granted if it had granted only readers too, and not
// otherwise). Neither run changes a state that a later row reads but the
// count, which only matters at zero. So a release that frees 200 Waits,
// or a key that 500 readers hold, takes a few steps. The
// statement must read sent (a CTE that nothing reads is not run).
func walkSQL(calls string, all bool) string {
	mine := "false"
	if calls != "" {
		mine = "(c.session, c.seq) IN (" + calls + ")"
	}
	del := "SELECT id FROM walk WHERE g"
	if calls != "" {
		// OFFSET 0 keeps the key's test out of the lookup, which then
		// reads the calls' index (session, seq), not the key's rows.
		del += "\n        UNION SELECT id FROM (SELECT id, prefix, key FROM fairlock_calls WHERE (session, seq) IN (" + calls + ") OFFSET 0) c" +
			" WHERE prefix = $1 AND key = $2"
	}
	// The row's lead and fits in each walk (grantedSQL's), and whether the
	// walk over the rows left counts it (not deleted, not in the run).
	leadB := "(w.lead_b AND n.mode = 'w')"
	fitsB := "(w.cnt_b = 0 OR (n.mode = 'r' AND w.allr_b) OR (n.mode = 'u' AND w.allu_b AND w.sum_b + n.weight <= n.size))"
	leadA := "(w.lead_a AND n.mode = 'w')"
	fitsA := "(w.cnt_a = 0 OR (n.mode = 'r' AND w.allr_a) OR (n.mode = 'u' AND w.allu_a AND w.sum_a + n.weight <= n.size))"
	skipA := "(n.g OR " + leadA + ")"
	q := `WITH RECURSIVE walk (id, session, seq, mode, weight, size, g, last,
        before, lead_b, cnt_b, allr_b, allu_b, sum_b,
        after, lead_a, cnt_a, allr_a, allu_a, sum_a) AS (
    SELECT 0::bigint, 0::bigint, 0::bigint, 'w'::text, 0::bigint, 0::bigint, false, true,
        true, true, 0::bigint, true, true, 0::bigint,
        true, true, 0::bigint, true, true, 0::bigint
    UNION ALL
    SELECT n.id, n.session, n.seq, n.mode, n.weight, n.size, n.g, n.last,
        w.before AND (` + leadB + ` OR ` + fitsB + `), ` + leadB + `,
        w.cnt_b + CASE WHEN ` + leadB + ` THEN 0 ELSE 1 END,
        w.allr_b AND (` + leadB + ` OR n.mode = 'r'),
        w.allu_b AND (` + leadB + ` OR n.mode = 'u'),
        w.sum_b + CASE WHEN ` + leadB + ` THEN 0 ELSE n.weight END,
        w.after AND (` + skipA + ` OR ` + fitsA + `),
        CASE WHEN n.g THEN w.lead_a ELSE ` + leadA + ` END,
        w.cnt_a + CASE WHEN ` + skipA + ` THEN 0 ELSE 1 END,
        w.allr_a AND (` + skipA + ` OR n.mode = 'r'),
        w.allu_a AND (` + skipA + ` OR n.mode = 'u'),
        w.sum_a + CASE WHEN ` + skipA + ` THEN 0 ELSE n.weight END
    FROM walk w
    CROSS JOIN LATERAL (SELECT CASE WHEN w.lead_a THEN 'w' WHEN w.allr_a THEN 'r' END AS m) u
    CROSS JOIN LATERAL (
        SELECT * FROM (
            SELECT c.id, c.session, c.seq, c.mode, c.weight, c.size, CASE
                WHEN ` + mine + ` THEN true
                WHEN EXISTS (SELECT 1 FROM fairlock_sessions s WHERE s.id = c.session AND s.expires_at > clock_timestamp()) THEN false
                ELSE EXISTS (SELECT 1 FROM fairlock_calls x WHERE x.id = c.id FOR UPDATE SKIP LOCKED)
            END AS g,
            row_number() OVER o = 1 AS first,
            coalesce(lead(c.mode) OVER o <> u.m, true) AS last
            FROM fairlock_calls c
            WHERE c.prefix = $1 AND c.key = $2 AND c.id > w.id AND c.id <= CASE
                WHEN u.m IS NULL THEN (SELECT min(id) FROM fairlock_calls WHERE prefix = $1 AND key = $2 AND id > w.id)
                ELSE coalesce((SELECT min(id) FROM fairlock_calls
                    WHERE prefix = $1 AND key = $2 AND id > w.id AND mode <> u.m), 9223372036854775807)
            END
            WINDOW o AS (ORDER BY c.id)
        ) r WHERE r.first OR r.mode = u.m
    ) n
    WHERE w.after AND w.last
),`
	if all {
		q += `
beyond AS (
    SELECT c.id FROM fairlock_calls c
    WHERE c.prefix = $1 AND c.key = $2 AND c.id > (SELECT max(id) FROM walk)
      AND NOT EXISTS (SELECT 1 FROM fairlock_sessions s WHERE s.id = c.session AND s.expires_at > clock_timestamp())
    FOR UPDATE SKIP LOCKED
),`
		del += "\n        UNION SELECT id FROM beyond"
	}
	// gone deletes by id alone: every id of del is a row of the key
	// already, and with the key's test beside it a generic plan may read
	// the key's rows through the queue's index, filtering them by id.
	return q + `
gone AS (
    DELETE FROM fairlock_calls WHERE id = ANY (ARRAY(
        ` + del + `
    )) RETURNING id, session, seq
),
before AS (SELECT id FROM walk WHERE id > 0 AND before),
after AS (SELECT id FROM walk WHERE id > 0 AND NOT g AND after),
sent AS (
    SELECT pg_notify($3, string_agg(session || ':' || seq, ' ' ORDER BY id)) FROM (
        SELECT id, session, seq, (row_number() OVER (ORDER BY id) - 1) / ` + strconv.Itoa(noticeCalls) + ` AS chunk
        FROM walk WHERE id > 0 AND NOT g AND after AND NOT before
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
// not is refused, so it never overtakes. Those rows are judged by tail,
// the state of the walk over the rows left after its last row: when the
// walk stopped at a row not granted, that row's mode and units are in
// the state, so a new call does not fit behind it either. mine is the
// call's own row, wherever it is in the queue, for an enqueue sent again;
// other, a size other than the call's of units that count: any row the
// walk kept (a dead one among them may be one that was behind the walk
// when units of another size were written beside it, and that a Fence
// or a release in flight now holds), or the key's first live units: units
// of one size only are ever written beside live ones, so the first live
// one tells for all. It is read only for units.
var enqueueSQL = walkSQL("", false) + `,
alive AS (
    SELECT EXISTS (SELECT 1 FROM fairlock_sessions WHERE id = $4 AND expires_at > clock_timestamp()) AS ok
),
mine AS (
    SELECT id FROM (SELECT id, prefix, key FROM fairlock_calls WHERE session = $4 AND seq = $5 OFFSET 0) c
    WHERE prefix = $1 AND key = $2 AND id NOT IN (SELECT id FROM walk WHERE g)
),
tail AS (SELECT cnt_a AS n, allr_a AS all_r, allu_a AS all_u, sum_a AS units FROM walk ORDER BY id DESC LIMIT 1),
other AS (
    SELECT size FROM (
        (SELECT size FROM walk WHERE id > 0 AND NOT g AND mode = 'u' AND size <> $8::bigint LIMIT 1)
        UNION ALL
        (SELECT c.size FROM fairlock_calls c
        WHERE c.prefix = $1 AND c.key = $2 AND c.mode = 'u'
          AND EXISTS (SELECT 1 FROM fairlock_sessions s WHERE s.id = c.session AND s.expires_at > clock_timestamp())
        ORDER BY c.id LIMIT 1)
    ) f WHERE size <> $8::bigint LIMIT 1
),
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
SELECT v, coalesce((SELECT id FROM ins), (SELECT id FROM mine), 0), CASE WHEN v = 'n' THEN (SELECT size FROM other) ELSE 0 END,
    (SELECT count(*) FROM sent)
FROM verdict`

// releaseSQL deletes a call's row with the dead ones. Parameters after
// walkSQL's: $4 session, $5 seq. It returns whether the row was there,
// whether its session is alive, and the number of notices sent.
var releaseSQL = walkSQL("SELECT $4::bigint, $5::bigint", false) + `
SELECT EXISTS (SELECT 1 FROM gone WHERE session = $4 AND seq = $5),
    EXISTS (SELECT 1 FROM fairlock_sessions WHERE id = $4 AND expires_at > clock_timestamp()),
    (SELECT count(*) FROM sent)`

// releaseAllSQL deletes calls' rows with the dead ones. Parameters after
// walkSQL's: $4 sessions, $5 seqs (arrays: the calls, pairwise). It
// returns the number of notices sent.
var releaseAllSQL = walkSQL("SELECT * FROM unnest($4::bigint[], $5::bigint[])", false) + `
SELECT count(*) FROM sent`

// readSQL purges a key's dead rows, announces what that grants, and
// reports the key. Parameter after walkSQL's: $4 a session (0: none). It
// returns the number of live rows other than Waits', and the seq, id and
// grant of each of the session's rows on the key, in id order.
var readSQL = walkSQL("", true) + `,
mine AS (
    SELECT id, seq, id IN (SELECT id FROM after) AS granted FROM fairlock_calls
    WHERE session = $4 AND prefix = $1 AND key = $2 AND id NOT IN (SELECT id FROM gone)
)
SELECT (SELECT count(*) FROM fairlock_calls WHERE prefix = $1 AND key = $2 AND mode <> 'w' AND id NOT IN (SELECT id FROM gone)),
    array(SELECT seq FROM mine ORDER BY id),
    array(SELECT id FROM mine ORDER BY id),
    array(SELECT granted FROM mine ORDER BY id),
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
