package pglock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
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

// TestGrantRuleDeadRandom runs random enqueues (every mode, Try forms),
// releases of one call or of several at once (releaseAll), reads and
// expiries of whole sessions on one key over three sessions, and checks
// after each statement every call's grant and which rows are left
// against the model, what enqueue said, and that the statement's notices
// name exactly the calls it newly granted. An expiry changes nothing by
// itself: the next statement on the key deletes the dead rows its walk
// meets (from the head to the first row not granted; walkPurge), or all
// of them for a read, and announces what that grants, counted from the
// grants over the rows as they were, dead ones included. Units weigh up
// to the whole size, so that a row deleted from the middle of the queue
// changes the sums behind it.
func TestGrantRuleDeadRandom(t *testing.T) {
	ctx := context.Background()
	pool, s := setup(t, 0)
	n := listenTo(t, pool, s, testTTL)
	var sessions [3]int64
	for i := range sessions {
		sessions[i] = newSession(t, pool, s, testTTL)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	const size = 4
	var rows []qrow
	grantSet := func(rows []qrow) map[callRef]bool {
		set := map[callRef]bool{}
		for i, g := range model(plain(rows)) {
			if g {
				set[rows[i].ref] = true
			}
		}
		return set
	}
	alive := func(rows []qrow) []qrow {
		return slices.DeleteFunc(slices.Clone(rows), func(r qrow) bool { return r.dead })
	}
	without := func(rows []qrow, refs ...callRef) []qrow {
		return slices.DeleteFunc(slices.Clone(rows), func(r qrow) bool { return slices.Contains(refs, r.ref) })
	}
	purges, left, batches, announced := 0, 0, 0, 0
	for op := range 600 {
		before := grantSet(rows)
		calls := alive(rows)
		var live []qrow  // the rows after the statement
		var self callRef // the call enqueued, which is told by enqueue's reply, not a notice
		switch {
		case len(calls) > 0 && rng.IntN(8) == 0:
			// A session expires: its rows die where they are.
			i := rng.IntN(len(sessions))
			expire(t, pool, sessions[i])
			for j := range rows {
				if rows[j].ref.Session == sessions[i] {
					rows[j].dead = true
				}
			}
			sessions[i] = newSession(t, pool, s, testTTL)
			continue
		case rng.IntN(15) == 0:
			if _, _, err := readKey(ctx, pool, s, "k", 0); err != nil {
				t.Fatal(err)
			}
			live = calls
		case len(calls) == 0 || (len(calls) < 10 && rng.IntN(10) < 7):
			m := []mode{modeExclusive, modeShared, modeUnits, modeWait}[rng.IntN(4)]
			var w int64
			if m == modeUnits {
				w = 1 + rng.Int64N(size)
			}
			try := m != modeWait && rng.IntN(5) == 0
			ref, out, _ := mustEnqueue(t, pool, s, "k", sessions[rng.IntN(len(sessions))], m, w, size, try)
			self = ref
			live = walkPurge(rows)
			next := append(slices.Clone(live), qrow{row: row{ref, m, w, size}})
			g := model(plain(next))
			wantOut := queued
			switch {
			case m == modeWait && !slices.ContainsFunc(alive(live), func(r qrow) bool { return r.m != modeWait }):
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
				live = next
			}
		case len(calls) > 1 && rng.IntN(4) == 0:
			// Several calls go in one statement, as the janitor removes
			// the rows of ended Waits with whatever else it has.
			var refs []callRef
			for _, i := range rng.Perm(len(calls))[:2+rng.IntN(len(calls)-1)] {
				refs = append(refs, calls[i].ref)
			}
			if err := releaseAll(ctx, pool, s, "k", refs); err != nil {
				t.Fatal(err)
			}
			live = walkPurge(without(rows, refs...))
			batches++
		default:
			// Mostly a holder releases; sometimes a waiter leaves.
			i := rng.IntN(len(calls))
			if g := model(plain(calls)); rng.IntN(10) < 7 {
				for !g[i] {
					i = rng.IntN(len(calls))
				}
			}
			if !mustRelease(t, pool, s, "k", calls[i].ref) {
				t.Fatalf("op %d: release of %v found no row", op, calls[i].ref)
			}
			live = walkPurge(without(rows, calls[i].ref))
		}
		dead, deadLeft := len(rows)-len(calls), len(live)-len(alive(live))
		if deadLeft < dead {
			purges++
		}
		if deadLeft > 0 {
			left++
		}
		rows = live
		after := grantSet(rows)
		var want []callRef
		for _, r := range rows {
			if after[r.ref] && !before[r.ref] && r.ref != self {
				want = append(want, r.ref)
			}
		}
		// The rows, with their grants (listCalls computes them over the
		// live rows; a dead row left behind the walk is behind a row not
		// granted, so the model's grant of it, as a live row, is false too).
		listed, err := listCalls(ctx, pool, s, "k")
		if err != nil {
			t.Fatal(err)
		}
		var gotRefs, wantRefs []string
		for _, c := range listed {
			gotRefs = append(gotRefs, fmt.Sprintf("%v %s %v dead=%v", c.Ref, c.Mode, c.Granted, !c.Alive))
		}
		for _, r := range rows {
			wantRefs = append(wantRefs, fmt.Sprintf("%v %s %v dead=%v", r.ref, r.m, after[r.ref], r.dead))
		}
		if diff := cmp.Diff(wantRefs, gotRefs); diff != "" {
			t.Fatalf("op %d: queue (-model +listCalls):\n%s", op, diff)
		}
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
	t.Logf("%d statements deleted dead rows, %d left dead rows behind their walk, %d released several calls, %d announced grants; %d calls left",
		purges, left, batches, announced, len(rows))
	if purges < 20 || left < 20 || batches < 20 || announced < 40 {
		t.Errorf("%d purges, %d left dead rows, %d batches, %d announcements: the test exercised too little", purges, left, batches, announced)
	}
}

// qrow is a row of the model with whether its session has expired.
type qrow struct {
	row
	dead bool
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
// walk deletes (walk.go): from the head, every dead row it meets, until
// the first live row the rule does not grant among the live rows ahead of
// it; the rows behind that one stay as they are, dead or not.
func walkPurge(rows []qrow) []qrow {
	var out []qrow
	for i, r := range rows {
		if r.dead {
			continue
		}
		out = append(out, r)
		if g := model(plain(out)); !g[len(g)-1] {
			return append(out, rows[i+1:]...)
		}
	}
	return out
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
