package pglock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// row is a call as the model of the grant rule sees it.
type row struct {
	ref callRef
	m   mode
	w   int64
	n   int64
}

// model is the grant rule (walk.go) written as a loop over a key's rows
// in queue order, as redislock's script walks its sorted set: the tests
// hold the SQL to it.
func model(rows []row) []bool {
	granted := make([]bool, len(rows))
	i := 0
	for ; i < len(rows) && rows[i].m == modeWait; i++ {
		granted[i] = true // the head's Waits: their turn has come, and they are transparent
	}
	cnt, allR, allU, sum := 0, true, true, int64(0)
	for ; i < len(rows); i++ {
		r := rows[i]
		if !(cnt == 0 || (r.m == modeShared && allR) || (r.m == modeUnits && allU && sum+r.w <= r.n)) {
			break
		}
		granted[i] = true
		cnt++
		allR = allR && r.m == modeShared
		allU = allU && r.m == modeUnits
		sum += r.w
	}
	return granted
}

// TestGrantRule checks the grants of fixed queues, in every mode, built
// call by call: what enqueue says of each call, and what listCalls says
// of the whole queue after every step, against the expected letters
// ("G" granted, "." queued, "-" nothing written).
func TestGrantRule(t *testing.T) {
	type step struct {
		m    mode
		w    int64 // units; n is 4
		try  bool
		want string // enqueue's outcome: G, ., -
	}
	x := func(want string) step { return step{m: modeExclusive, want: want} }
	r := func(want string) step { return step{m: modeShared, want: want} }
	u := func(w int64, want string) step { return step{m: modeUnits, w: w, want: want} }
	wt := func(want string) step { return step{m: modeWait, want: want} }
	try := func(s step) step { s.try = true; return s }
	for _, tc := range []struct {
		name  string
		steps []step
		final string // the queue's grants after the last step
	}{
		{"exclusive FIFO", []step{x("G"), x("."), x(".")}, "G.."},
		{"readers share", []step{r("G"), r("G"), r("G")}, "GGG"},
		{"a reader behind a writer waits", []step{r("G"), x("."), r(".")}, "G.."},
		{"readers behind a writer", []step{x("G"), r("."), r(".")}, "G.."},
		{"units fit", []step{u(2, "G"), u(1, "G"), u(1, "G")}, "GGG"},
		{"units head-of-line", []step{u(3, "G"), u(2, "."), u(1, ".")}, "G.."},
		{"a Wait on a free key writes nothing", []step{wt("-")}, ""},
		{"a Wait behind a holder queues", []step{x("G"), wt(".")}, "G."},
		{"a reader behind a queued Wait waits", []step{r("G"), wt("."), r(".")}, "G.."},
		{"units behind a queued Wait wait", []step{u(1, "G"), wt("."), u(1, ".")}, "G.."},
		{"a Wait behind Waits at the head writes nothing", []step{x("G"), wt("."), wt(".")}, "G.."},
		{"TryLock on a free key", []step{try(x("G"))}, "G"},
		{"TryLock on a held key writes nothing", []step{x("G"), try(x("-"))}, "G"},
		{"TryRLock never overtakes a queued writer", []step{r("G"), x("."), try(r("-"))}, "G."},
		{"TryRLock beside readers", []step{r("G"), try(r("G"))}, "GG"},
		{"TryAcquire fits", []step{u(2, "G"), try(u(2, "G"))}, "GG"},
		{"TryAcquire does not fit", []step{u(3, "G"), try(u(2, "-"))}, "G"},
		{"TryAcquire never overtakes", []step{u(3, "G"), u(2, "."), try(u(1, "-"))}, "G."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, s := setup(t, 0)
			sess := newSession(t, pool, s, testTTL)
			for i, st := range tc.steps {
				_, out, token := mustEnqueue(t, pool, s, "k", sess, st.m, st.w, 4, st.try)
				got := map[enqueued]string{granted: "G", queued: ".", wouldBlock: "-", free: "-"}[out]
				if got != st.want {
					t.Errorf("step %d (%s w=%d try=%v): %q, want %q", i, st.m, st.w, st.try, got, st.want)
				}
				if (token != 0) != (got != "-") {
					t.Errorf("step %d: token %d with outcome %q", i, token, got)
				}
			}
			calls, err := listCalls(context.Background(), pool, s, "k")
			if err != nil {
				t.Fatal(err)
			}
			final := ""
			for _, c := range calls {
				final += map[bool]string{true: "G", false: "."}[c.Granted]
			}
			if final != tc.final {
				t.Errorf("queue %q, want %q", final, tc.final)
			}
		})
	}
}

// TestWaitsReleasedTogether checks that one release frees every Wait
// directly behind the holder and the call behind them, in one notice,
// and that those Waits stay transparent while their rows remain.
func TestWaitsReleasedTogether(t *testing.T) {
	pool, s := setup(t, 0)
	n := listenTo(t, pool, s, testTTL)
	sess := newSession(t, pool, s, testTTL)
	holder, _, _ := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
	var waits []callRef
	for range 3 {
		w, out, _ := mustEnqueue(t, pool, s, "k", sess, modeWait, 0, 0, false)
		if out != queued {
			t.Fatalf("a Wait behind a holder: %v", out)
		}
		waits = append(waits, w)
	}
	next, _, _ := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
	reader, _, _ := mustEnqueue(t, pool, s, "k", sess, modeShared, 0, 0, false)
	n.take()

	mustRelease(t, pool, s, "k", holder)
	want := append(slices.Clone(waits), next)
	got := n.await(t, want...)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the release's notices (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, grantedRefs(t, pool, s, "k")); diff != "" {
		t.Errorf("grants (-want +got):\n%s", diff)
	}
	// The Waits remove their rows; that grants nothing more.
	for _, w := range waits {
		mustRelease(t, pool, s, "k", w)
	}
	if diff := cmp.Diff([]callRef{next}, grantedRefs(t, pool, s, "k")); diff != "" {
		t.Errorf("grants after the Waits left (-want +got):\n%s", diff)
	}
	mustRelease(t, pool, s, "k", next)
	n.await(t, reader)
}

// TestGrantRuleRandom runs random enqueues (every mode, Try forms) and
// releases (mostly of holders) on one key and checks, after each, every call's grant against
// the model, what enqueue said, and that the notices of each change name
// exactly the calls it newly granted, in queue order.
func TestGrantRuleRandom(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 0)
	n := listenTo(t, pool, s, testTTL)
	sess := newSession(t, pool, s, testTTL)
	rng := rand.New(rand.NewPCG(1, 2))
	const size = 4
	var rows []row
	grantSet := func(rows []row) map[callRef]bool {
		set := map[callRef]bool{}
		for i, g := range model(rows) {
			if g {
				set[rows[i].ref] = true
			}
		}
		return set
	}
	announced := 0 // changes that granted calls to announce
	for op := range 300 {
		before := grantSet(rows)
		var self callRef // the call enqueued, which is told by enqueue's reply, not a notice
		if len(rows) == 0 || (len(rows) < 8 && rng.IntN(10) < 6) {
			m := []mode{modeExclusive, modeShared, modeUnits, modeWait}[rng.IntN(4)]
			var w int64
			if m == modeUnits {
				w = 1 + rng.Int64N(size)
			}
			try := m != modeWait && rng.IntN(5) == 0
			ref, out, _ := mustEnqueue(t, pool, s, "k", sess, m, w, size, try)
			self = ref
			next := append(slices.Clone(rows), row{ref, m, w, size})
			g := model(next)
			wantOut := queued
			switch {
			case m == modeWait && !slices.ContainsFunc(rows, func(r row) bool { return r.m != modeWait }):
				wantOut = free
			case g[len(g)-1]:
				wantOut = granted
			case try:
				wantOut = wouldBlock
			}
			if out != wantOut {
				t.Fatalf("op %d: enqueue %s w=%d try=%v on %v: %v, want %v", op, m, w, try, rows, out, wantOut)
			}
			if out == granted || out == queued {
				rows = next
			}
		} else {
			// Mostly a holder releases; sometimes a waiter leaves.
			i := rng.IntN(len(rows))
			if g := model(rows); rng.IntN(10) < 7 {
				for !g[i] {
					i = rng.IntN(len(rows))
				}
			}
			if !mustRelease(t, pool, s, "k", rows[i].ref) {
				t.Fatalf("op %d: release of %v found no row", op, rows[i].ref)
			}
			rows = slices.Delete(rows, i, i+1)
		}
		after := grantSet(rows)
		var want []callRef
		for _, r := range rows {
			if after[r.ref] && !before[r.ref] && r.ref != self {
				want = append(want, r.ref)
			}
		}
		// The grants, read back.
		calls, err := listCalls(ctx, pool, s, "k")
		if err != nil {
			t.Fatal(err)
		}
		var gotRefs, wantRefs []string
		for _, c := range calls {
			gotRefs = append(gotRefs, fmt.Sprintf("%v %s %v", c.Ref, c.Mode, c.Granted))
		}
		for _, r := range rows {
			wantRefs = append(wantRefs, fmt.Sprintf("%v %s %v", r.ref, r.m, after[r.ref]))
		}
		if diff := cmp.Diff(wantRefs, gotRefs); diff != "" {
			t.Fatalf("op %d: queue (-model +listCalls):\n%s", op, diff)
		}
		// The notices: everything sent before a marker notice has arrived
		// once the marker has (a channel's notices arrive in commit order).
		marker := callRef{Session: 0, Seq: int64(op)}
		if _, err := pool.Exec(ctx, "SELECT pg_notify($1, $2)", s.channel, marker.String()); err != nil {
			t.Fatal(err)
		}
		n.await(t, marker)
		got := slices.DeleteFunc(n.take(), func(r callRef) bool { return r == marker })
		if diff := cmp.Diff(want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("op %d: notices (-want +got):\n%s", op, diff)
		}
		if len(want) > 0 {
			announced++
		}
	}
	t.Logf("%d of 300 changes announced grants; %d calls left on the key", announced, len(rows))
}

// TestGrantRuleDeadRandom runs, on one key over three sessions, random
// enqueues (every mode, Try forms, units of two semaphore sizes, and
// enqueues sent again for a row already there), releases of one row (a
// live or a dead one, anywhere in the queue) or of several at once
// (releaseAll, with a call never written among them), reads, expiries
// of whole sessions, and Fences that hold a granted row (FOR SHARE) until
// their transaction commits. After each statement it checks the rows
// left, each with its grant over all of them, dead ones included, and
// what the statement said against the model, and that its notices name
// exactly the calls it newly granted. An expiry changes nothing by
// itself: the next statement on the key deletes the dead rows its walk
// meets, except those a Fence holds, which go on holding (walkPurge); a
// read deletes every dead row no Fence holds.
func TestGrantRuleDeadRandom(t *testing.T) {
	total := map[string]int{}
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			for k, v := range grantRuleDeadRandom(t, seed) {
				total[k] += v
			}
		})
	}
	t.Logf("statements: %v", total)
	for _, what := range []string{"expiry", "fence", "read", "resend", "releaseAll", "release", "release of a dead row", "dead rows left",
		"announced", "enqueue: granted", "enqueue: queued", "enqueue: other size", "enqueue: would block", "enqueue: free"} {
		if total[what] == 0 {
			t.Errorf("no statement of kind %q: the test exercised too little", what)
		}
	}
}

// outcomes names enqueue's outcomes, for messages.
var outcomes = map[enqueued]string{queued: "queued", granted: "granted", wouldBlock: "would block", free: "free", otherSize: "other size"}

// qrow is a row of the model: its call, whether its session has expired,
// and whether a Fence holds it.
type qrow struct {
	row
	dead, fenced bool
}

// plain returns the rows as the model sees them, dead ones included.
func plain(rows []qrow) []row {
	out := make([]row, len(rows))
	for i, r := range rows {
		out[i] = r.row
	}
	return out
}

// walkPurge returns rows less the dead rows that a writing statement's
// walk deletes (walk.go): from the head, every dead row it meets that no
// Fence holds, until the first row left that the rule does not grant
// among the rows left ahead of it; the rows behind that one stay as they
// are. It also returns how many of the rows left the walk read.
func walkPurge(rows []qrow) ([]qrow, int) {
	var out []qrow
	for i, r := range rows {
		if r.dead && !r.fenced {
			continue
		}
		out = append(out, r)
		if g := model(plain(out)); !g[len(g)-1] {
			return append(out, rows[i+1:]...), len(out)
		}
	}
	return out, len(out)
}

// grantsOf returns the calls of rows that the model grants, dead rows
// counted as live (as a statement reads the rows before it deletes any).
func grantsOf(rows []qrow) map[callRef]bool {
	set := map[callRef]bool{}
	for i, g := range model(plain(rows)) {
		if g {
			set[rows[i].ref] = true
		}
	}
	return set
}

// checkStatement holds what a statement on key left to the model: the
// rows left (rows, in queue order), each with its grant over all of them,
// dead ones included (what the next statement reads as "before"), and the
// notices it sent, which must name exactly the calls granted now and not
// before (the grants before it), less self, the call it enqueued (told by
// its reply). It sends a marker notice (mark: a number unique on n's
// channel) to know that every notice of the statement has arrived. It
// fails t, naming the statement by what, and returns how many calls the
// statement announced.
func checkStatement(t testing.TB, pool *pgxpool.Pool, s space, n *notices, key string, before map[callRef]bool, rows []qrow, self callRef, mark int64, what string) int {
	t.Helper()
	ctx := context.Background()
	after := grantsOf(rows)
	var want []callRef
	for _, r := range rows {
		if after[r.ref] && !before[r.ref] && r.ref != self {
			want = append(want, r.ref)
		}
	}
	q := `WITH rows AS (SELECT id, mode, weight, size FROM fairlock_calls WHERE prefix = $1 AND key = $2),
` + grantedSQL("granted", "rows") + `
SELECT c.session, c.seq, c.mode, c.id IN (SELECT id FROM granted) FROM fairlock_calls c WHERE prefix = $1 AND key = $2 ORDER BY id`
	dbRows, err := pool.Query(ctx, q, s.prefix, []byte(key))
	if err != nil {
		t.Fatal(err)
	}
	var got, wantRows []string
	for dbRows.Next() {
		var ref callRef
		var m string
		var g bool
		if err := dbRows.Scan(&ref.Session, &ref.Seq, &m, &g); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%v %s %v", ref, m, g))
	}
	if err := dbRows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		wantRows = append(wantRows, fmt.Sprintf("%v %s %v", r.ref, r.m, after[r.ref]))
	}
	if diff := cmp.Diff(wantRows, got); diff != "" {
		t.Fatalf("%s: rows (-model +server):\n%s", what, diff)
	}
	marker := callRef{Session: 0, Seq: mark}
	if _, err := pool.Exec(ctx, "SELECT pg_notify($1, $2)", s.channel, marker.String()); err != nil {
		t.Fatal(err)
	}
	n.await(t, marker)
	notices := slices.DeleteFunc(n.take(), func(r callRef) bool { return r == marker })
	if diff := cmp.Diff(want, notices, cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("%s: notices (-want +got):\n%s", what, diff)
	}
	return len(want)
}

// grantRuleDeadRandom is one run of TestGrantRuleDeadRandom, and returns
// how many statements of each kind it ran.
func grantRuleDeadRandom(t *testing.T, seed uint64) map[string]int {
	ctx := context.Background()
	pool, s := setup(t, 0)
	n := listenTo(t, pool, s, testTTL)
	var sessions [3]int64
	for i := range sessions {
		sessions[i] = newSession(t, pool, s, testTTL)
	}
	rng := rand.New(rand.NewPCG(seed, 99))
	const size = 4
	var rows []qrow
	fences := map[callRef]pgx.Tx{}
	defer func() {
		for _, tx := range fences {
			tx.Rollback(ctx)
		}
	}()
	without := func(rows []qrow, refs ...callRef) []qrow {
		return slices.DeleteFunc(slices.Clone(rows), func(r qrow) bool { return slices.Contains(refs, r.ref) })
	}
	tokens := map[callRef]int64{}
	stats := map[string]int{}
	for op := range 400 {
		before := grantsOf(rows)
		var live []qrow  // the rows after the statement
		var self callRef // the call enqueued, which is told by enqueue's reply, not a notice
		var what string
		switch pick := rng.IntN(100); {
		case pick < 8 && len(rows) > 0:
			// A session expires: its rows die where they are.
			i := rng.IntN(len(sessions))
			expire(t, pool, sessions[i])
			for j := range rows {
				if rows[j].ref.Session == sessions[i] {
					rows[j].dead = true
				}
			}
			sessions[i] = newSession(t, pool, s, testTTL)
			stats["expiry"]++
			continue
		case pick < 14 && len(fences) < 2:
			// A Fence holds a granted live row.
			var cands []int
			for i, g := range model(plain(rows)) {
				if g && !rows[i].dead && !rows[i].fenced {
					cands = append(cands, i)
				}
			}
			if len(cands) == 0 {
				continue
			}
			i := cands[rng.IntN(len(cands))]
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := fence(ctx, tx, rows[i].ref.Session, tokens[rows[i].ref]); err != nil {
				t.Fatalf("op %d: fence %v: %v", op, rows[i], err)
			}
			fences[rows[i].ref] = tx
			rows[i].fenced = true
			stats["fence"]++
			continue
		case pick < 20 && len(fences) > 0:
			for ref, tx := range fences {
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				delete(fences, ref)
				for j := range rows {
					if rows[j].ref == ref {
						rows[j].fenced = false
					}
				}
				break
			}
			continue
		case pick < 26:
			what = "read"
			if _, _, err := readKey(ctx, pool, s, "k", 0); err != nil {
				t.Fatal(err)
			}
			live = slices.DeleteFunc(slices.Clone(rows), func(r qrow) bool { return r.dead && !r.fenced })
		case pick < 34 && len(rows) > 0:
			// An enqueue sent again, for a row still there and alive.
			r := rows[rng.IntN(len(rows))]
			if r.dead {
				continue
			}
			what = "resend"
			out, token, _, err := enqueue(ctx, pool, s, "k", call{ref: r.ref, mode: r.m, weight: r.w, size: r.n}, false)
			if err != nil {
				t.Fatal(err)
			}
			live, _ = walkPurge(rows)
			want := queued
			if grantsOf(live)[r.ref] {
				want = granted
			}
			if out != want || token != tokens[r.ref] {
				t.Fatalf("op %d: enqueue of %v sent again on %v: %v token %d, want %v token %d", op, r.ref, rows, out, token, want, tokens[r.ref])
			}
		case pick < 70 || len(rows) < 10:
			m := []mode{modeExclusive, modeShared, modeShared, modeUnits, modeWait, modeWait, modeWait}[rng.IntN(7)]
			var w, sz int64
			if m == modeUnits {
				w, sz = 1+rng.Int64N(size), size
				if rng.IntN(8) == 0 {
					sz = size + 1
				}
			}
			try := m != modeWait && rng.IntN(4) == 0
			ref := callRef{Session: sessions[rng.IntN(len(sessions))], Seq: seqs.Add(1)}
			self = ref
			out, token, other, err := enqueue(ctx, pool, s, "k", call{ref: ref, mode: m, weight: w, size: sz}, try)
			if err != nil {
				t.Fatal(err)
			}
			var walked int
			live, walked = walkPurge(rows)
			next := append(slices.Clone(live), qrow{row: row{ref, m, w, sz}})
			g := model(plain(next))
			var otherWant int64 // units of another size: a row the walk kept, or a live one behind it
			if m == modeUnits {
				for i, r := range live {
					if r.m == modeUnits && r.n != sz && (i < walked || !r.dead) {
						otherWant = r.n
					}
				}
			}
			want := queued
			switch {
			case otherWant != 0:
				want = otherSize
			case m == modeWait && !slices.ContainsFunc(live, func(r qrow) bool { return r.m != modeWait }):
				want = free
			case g[len(g)-1]:
				want = granted
			case try:
				want = wouldBlock
			}
			what = fmt.Sprintf("enqueue %s w=%d n=%d try=%v", m, w, sz, try)
			if out != want || (want == otherSize && other != otherWant) {
				t.Fatalf("op %d: %s on %v: %v (other size %d), want %v (other size %d)", op, what, rows, out, other, want, otherWant)
			}
			if out == granted || out == queued {
				live = next
				tokens[ref] = token
			}
			what = "enqueue: " + outcomes[out]
		case pick < 82 && len(rows) > 1:
			// Several calls go in one statement, as the janitor removes
			// the rows of ended Waits with whatever else it has; one of
			// them was never written.
			var refs []callRef
			for _, i := range rng.Perm(len(rows))[:2+rng.IntN(len(rows)-1)] {
				if !rows[i].fenced {
					refs = append(refs, rows[i].ref)
				}
			}
			refs = append(refs, callRef{Session: sessions[0], Seq: seqs.Add(1)})
			what = "releaseAll"
			if err := releaseAll(ctx, pool, s, "k", refs); err != nil {
				t.Fatal(err)
			}
			live, _ = walkPurge(without(rows, refs...))
		default:
			// Mostly a holder releases; sometimes a waiter leaves.
			if len(rows) == 0 {
				continue
			}
			i := rng.IntN(len(rows))
			if g := model(plain(rows)); rng.IntN(10) < 7 {
				for range 20 {
					if g[i] {
						break
					}
					i = rng.IntN(len(rows))
				}
			}
			if rows[i].fenced {
				continue
			}
			what = "release"
			if rows[i].dead {
				what = "release of a dead row"
			}
			if !mustRelease(t, pool, s, "k", rows[i].ref) {
				t.Fatalf("op %d: %s of %v found no row", op, what, rows[i].ref)
			}
			live, _ = walkPurge(without(rows, rows[i].ref))
		}
		stats[what]++
		old := rows
		rows = live
		if slices.ContainsFunc(rows, func(r qrow) bool { return r.dead && !r.fenced }) {
			stats["dead rows left"]++
		}
		if checkStatement(t, pool, s, n, "k", before, rows, self, int64(op), fmt.Sprintf("op %d: %s on %v", op, what, old)) > 0 {
			stats["announced"]++
		}
	}
	return stats
}

// TestOtherSize checks that units of a semaphore of another size are
// refused, naming the size queued, and write nothing.
func TestOtherSize(t *testing.T) {
	pool, s := setup(t, 0)
	sess := newSession(t, pool, s, testTTL)
	mustEnqueue(t, pool, s, "k", sess, modeUnits, 1, 4, false)
	for _, try := range []bool{false, true} {
		out, token, other, err := enqueue(context.Background(), pool, s, "k",
			call{ref: callRef{sess, seqs.Add(1)}, mode: modeUnits, weight: 1, size: 5}, try)
		if err != nil || out != otherSize || other != 4 || token != 0 {
			t.Errorf("try=%v: enqueue of size 5 behind size 4: %v, token %d, other %d, %v; want otherSize, 0, 4, nil", try, out, token, other, err)
		}
	}
	if calls, _ := listCalls(context.Background(), pool, s, "k"); len(calls) != 1 {
		t.Errorf("%d calls on the key, want 1", len(calls))
	}
}

// TestOtherSizeBesideADeadRowBeingReleased checks the refusal of units of
// another size when the key's first units row is a dead one that a
// release has locked (releaseRowSQL, before the key's advisory lock) while
// the statements ahead of it in the advisory lock's queue run: their
// walks cannot lock that row, so they keep it as if a Fence held it. It
// was behind the walk, dead, when units of size 3 were queued beside it,
// so it is no proof that the key's live units are of its size.
func TestOtherSizeBesideADeadRowBeingReleased(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 0)
	b := newSession(t, pool, s, testTTL)
	a := newSession(t, pool, s, testTTL)
	d := newSession(t, pool, s, testTTL)
	e := newSession(t, pool, s, testTTL)
	x, _, _ := mustEnqueue(t, pool, s, "k", b, modeExclusive, 0, 0, false)
	mustEnqueue(t, pool, s, "k", b, modeExclusive, 0, 0, false) // y, queued behind x
	u5, _, _ := mustEnqueue(t, pool, s, "k", a, modeUnits, 1, 5, false)
	expire(t, pool, a)
	// The walk stops at y: a's dead units are behind it and do not count.
	mustEnqueue(t, pool, s, "k", d, modeUnits, 1, 3, false)

	// A statement holds the key's advisory lock (h); a's process releases
	// its call meanwhile (its row is locked, then it waits for the key).
	h, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Rollback(ctx)
	if _, err := h.Exec(ctx, keyLockSQL, int32(lockClass), s.keyLock("k")); err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() {
		_, _, err := release(ctx, pool, s, "k", u5)
		released <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE application_name = $1 AND wait_event_type = 'Lock' AND wait_event = 'advisory'`, t.Name()).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the release never waited for the key")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Under the key's lock, x is released, then e asks for units of size
	// 5 (two statements of h, as two transactions that had queued for the
	// key before a's release would run).
	if _, err := h.Exec(ctx, releaseSQL, s.prefix, []byte("k"), s.channel, x.Session, x.Seq); err != nil {
		t.Fatal(err)
	}
	var verdict string
	var id, other, sent int64
	if err := h.QueryRow(ctx, enqueueSQL, s.prefix, []byte("k"), s.channel,
		e, seqs.Add(1), string(modeUnits), int64(1), int64(5), "", false).Scan(&verdict, &id, &other, &sent); err != nil {
		t.Fatal(err)
	}
	if err := h.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if verdict != verdictOtherSize || other != 3 {
		t.Errorf("units of size 5 beside d's live units of size 3: verdict %q, other size %d; want %q, 3", verdict, other, verdictOtherSize)
	}
	calls, err := listCalls(ctx, pool, s, "k")
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[int64]bool{}
	for _, c := range calls {
		if c.Alive && c.Mode == modeUnits {
			sizes[c.Size] = true
		}
	}
	if len(sizes) > 1 {
		t.Errorf("live units of sizes %v on one key: %+v", sizes, calls)
	}
}

// TestEnqueueIdempotent checks that an enqueue sent again for the same
// call (after a lost reply) finds its row and reports it as the first
// did, with the grant as it is now, and writes no second row.
func TestEnqueueIdempotent(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 0)
	sess := newSession(t, pool, s, testTTL)
	first, _, _ := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
	c := call{ref: callRef{sess, seqs.Add(1)}, mode: modeExclusive}
	out1, token1, _, err1 := enqueue(ctx, pool, s, "k", c, false)
	out2, token2, _, err2 := enqueue(ctx, pool, s, "k", c, false)
	if err1 != nil || err2 != nil || out1 != queued || out2 != queued || token1 != token2 {
		t.Fatalf("two enqueues of one call: %v %d %v, then %v %d %v", out1, token1, err1, out2, token2, err2)
	}
	mustRelease(t, pool, s, "k", first)
	out3, token3, _, err3 := enqueue(ctx, pool, s, "k", c, false)
	if err3 != nil || out3 != granted || token3 != token1 {
		t.Errorf("after the holder left, the enqueue again: %v %d %v; want granted %d", out3, token3, err3, token1)
	}
	if calls, _ := listCalls(ctx, pool, s, "k"); len(calls) != 1 {
		t.Errorf("%d calls on the key, want 1", len(calls))
	}
}

// TestRelease checks what release reports: a row there and alive; a row
// gone (a second release); a row whose session expired (lost); and that
// releasing a queued call grants nothing and leaves the others.
func TestRelease(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 0)
	sess := newSession(t, pool, s, testTTL)
	a, _, _ := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
	b, _, _ := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
	c, _, _ := mustEnqueue(t, pool, s, "k", sess, modeExclusive, 0, 0, false)
	if removed, alive, err := release(ctx, pool, s, "k", b); !removed || !alive || err != nil {
		t.Errorf("release of a queued call: %v %v %v", removed, alive, err)
	}
	if diff := cmp.Diff([]callRef{a}, grantedRefs(t, pool, s, "k")); diff != "" {
		t.Errorf("grants after a queued call left (-want +got):\n%s", diff)
	}
	if removed, alive, err := release(ctx, pool, s, "k", b); removed || !alive || err != nil {
		t.Errorf("second release: %v %v %v; want false true nil", removed, alive, err)
	}
	expire(t, pool, sess)
	if removed, alive, err := release(ctx, pool, s, "k", a); !removed || alive || err != nil {
		t.Errorf("release after the session expired: %v %v %v; want true false nil", removed, alive, err)
	}
	if calls, _ := listCalls(ctx, pool, s, "k"); len(calls) != 0 {
		t.Errorf("the release left %d calls (c %v is dead and must be purged)", len(calls), c)
	}
	_, _, _, err := enqueue(ctx, pool, s, "k", call{ref: callRef{sess, seqs.Add(1)}, mode: modeExclusive}, false)
	if !errors.Is(err, errSessionExpired) {
		t.Errorf("enqueue with an expired session: %v, want errSessionExpired", err)
	}
}
