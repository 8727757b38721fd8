package pglock

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// runCase is a crafted queue and one statement on it. queue is a list of
// rows separated by spaces: a mode (x, r, w, or uN: N units of a
// semaphore of size 4) followed by flags: "-" dead, "+" dead and held by
// a Fence, "*" released by the statement. op is "rel" (release the rows
// marked *, one release for one row, releaseAll for several), "read", or
// "enq ROW" with ROW a mode as in queue and optionally "?" for a Try.
type runCase struct {
	queue, op string
}

// parseRow parses one row of a runCase's queue.
func parseRow(s string) (m mode, w int64, flags string) {
	switch s[0] {
	case 'x':
		m = modeExclusive
	case 'r':
		m = modeShared
	case 'w':
		m = modeWait
	case 'u':
		m = modeUnits
		i := 1
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		w, _ = strconv.ParseInt(s[1:i], 10, 64)
		return m, w, s[i:]
	}
	return m, 0, s[1:]
}

// runCrafted builds c's queue on key (rows inserted directly, in order),
// runs c's statement, and holds the rows left, their grants, the notices
// and enqueue's verdict to the model (model, walkPurge).
func runCrafted(t *testing.T, env *craftEnv, key string, c runCase) {
	t.Helper()
	ctx := context.Background()
	pool, s := env.pool, env.s
	const size = 4
	var rows []qrow
	var released []callRef
	needFence := strings.Contains(c.queue, "+")
	var fsess int64
	if needFence {
		fsess = newSession(t, pool, s, testTTL)
	}
	var fenceRows []int
	for _, tok := range strings.Fields(c.queue) {
		m, w, flags := parseRow(tok)
		sess := env.live
		switch {
		case strings.Contains(flags, "+"):
			sess = fsess
		case strings.Contains(flags, "-"):
			sess = env.dead
		}
		var sz int64
		if m == modeUnits {
			sz = size
		}
		ref := callRef{Session: sess, Seq: seqs.Add(1)}
		var id int64
		if err := pool.QueryRow(ctx, `INSERT INTO fairlock_calls (prefix, key, session, seq, mode, weight, size, label)
VALUES ($1, $2, $3, $4, $5, $6, $7, '') RETURNING id`, s.prefix, []byte(key), ref.Session, ref.Seq, string(m), w, sz).Scan(&id); err != nil {
			t.Fatal(err)
		}
		q := qrow{row: row{ref, m, w, sz}, dead: strings.ContainsAny(flags, "-+"), fenced: strings.Contains(flags, "+")}
		if q.fenced {
			fenceRows = append(fenceRows, len(rows))
		}
		if strings.Contains(flags, "*") {
			released = append(released, ref)
		}
		rows = append(rows, q)
		env.tokens[ref] = id
	}
	// One transaction fences every row marked + (the pool has few
	// connections).
	var fenceTx pgx.Tx
	if needFence {
		var err error
		if fenceTx, err = pool.Begin(ctx); err != nil {
			t.Fatal(err)
		}
		defer fenceTx.Rollback(ctx)
	}
	for _, i := range fenceRows {
		if err := fence(ctx, fenceTx, fsess, env.tokens[rows[i].ref]); err != nil {
			t.Fatal(err)
		}
	}
	if needFence {
		expire(t, pool, fsess)
	}
	before := grantsOf(rows)
	var live []qrow
	var self callRef
	switch {
	case c.op == "rel":
		var err error
		if len(released) == 1 {
			_, _, err = release(ctx, pool, s, key, released[0])
		} else {
			err = releaseAll(ctx, pool, s, key, released)
		}
		if err != nil {
			t.Fatal(err)
		}
		live, _ = walkPurge(slices.DeleteFunc(slices.Clone(rows), func(r qrow) bool { return slices.Contains(released, r.ref) }))
	case c.op == "read":
		if _, _, err := readKey(ctx, pool, s, key, 0); err != nil {
			t.Fatal(err)
		}
		live = slices.DeleteFunc(slices.Clone(rows), func(r qrow) bool { return r.dead && !r.fenced })
	case strings.HasPrefix(c.op, "enq "):
		spec := strings.TrimPrefix(c.op, "enq ")
		m, w, flags := parseRow(spec)
		try := strings.Contains(flags, "?")
		var sz int64
		if m == modeUnits {
			sz = size
		}
		ref := callRef{Session: env.live, Seq: seqs.Add(1)}
		self = ref
		out, _, other, err := enqueue(ctx, pool, s, key, call{ref: ref, mode: m, weight: w, size: sz}, try)
		if err != nil {
			t.Fatal(err)
		}
		live, _ = walkPurge(rows)
		next := append(slices.Clone(live), qrow{row: row{ref, m, w, sz}})
		g := model(plain(next))
		want := queued
		switch {
		case m == modeWait && !slices.ContainsFunc(live, func(r qrow) bool { return r.m != modeWait }):
			want = free
		case g[len(g)-1]:
			want = granted
		case try:
			want = wouldBlock
		}
		if out != want {
			t.Fatalf("%q then %q: %v (other %d), want %v", c.queue, c.op, outcomes[out], other, outcomes[want])
		}
		if out == granted || out == queued {
			live = next
		}
	default:
		t.Fatalf("bad op %q", c.op)
	}
	env.marks++
	checkStatement(t, pool, s, env.n, key, before, live, self, env.marks, fmt.Sprintf("%q then %q", c.queue, c.op))
}

// craftEnv is what the crafted cases share: a pool, a space, a listener,
// a live session and an expired one.
type craftEnv struct {
	pool       *pgxpool.Pool
	s          space
	n          *notices
	live, dead int64
	tokens     map[callRef]int64
	marks      int64
}

// newCraftEnv returns the shared state of the crafted cases.
func newCraftEnv(t *testing.T) *craftEnv {
	pool, s := setup(t, 0)
	env := &craftEnv{pool: pool, s: s, n: listenTo(t, pool, s, testTTL), tokens: map[callRef]int64{}}
	env.live = newSession(t, pool, s, testTTL)
	env.dead = newSession(t, pool, s, testTTL)
	expire(t, pool, env.dead)
	return env
}

// TestWalkRuns holds the walk's runs (of Waits, of readers) to the
// row-by-row model on crafted queues: dead rows, rows the statement
// deletes in and around runs, Fences holding dead rows, Waits after
// readers, readers after a gone Wait or a gone writer.
func TestWalkRuns(t *testing.T) {
	env := newCraftEnv(t)
	cases := []runCase{
		{"x* w w r r r", "rel"},
		{"x* w w- w r r- r", "rel"},
		{"r r* r r", "rel"},
		{"r* r r* r x r", "rel"},
		{"x r* r r", "rel"},
		{"x* r r w r", "rel"},
		{"x* r r- r* w r", "rel"},
		{"w* r r r", "rel"},
		{"x* w* r r u1", "rel"},
		{"u1* r r r", "rel"},
		{"x- r r r x", "read"},
		{"x+ r r", "read"},
		{"r+ r r x", "read"},
		{"r- r r w r", "read"},
		{"x* u1 r r", "rel"},
		{"x* w r- r- r", "rel"},
		{"x w* r r", "rel"},
		{"x* w r w r", "rel"},
		{"x* w w x- r r r", "rel"},
		{"x* u1- r r r", "rel"},
		{"x* r- x- r r", "rel"},
		{"r r r", "enq r"},
		{"r r- r", "enq r?"},
		{"r r w", "enq r?"},
		{"w- w- r r", "enq r"},
		{"x- w r r", "enq w"},
		{"x- w- w-", "enq w"},
		{"x- r- r", "enq u1?"},
		{"r- r r", "enq x"},
		{"u1 u1 r", "enq u1"},
		{"x* r r r r r r r r r r", "rel"},
		{"r* r* r* r* x", "rel"},
		{"r r* r r*", "rel"},
		{"x* r r* r r* w r", "rel"},
		{"x* w* w* r", "rel"},
		{"w w* x r r", "read"},
	}
	for i, c := range cases {
		runCrafted(t, env, fmt.Sprintf("c%d", i), c)
	}
}

// TestWalkRunsRandom is TestWalkRuns on random short queues that favour
// runs of one mode.
func TestWalkRunsRandom(t *testing.T) {
	env := newCraftEnv(t)
	rng := rand.New(rand.NewPCG(5, 7))
	modes := []string{"x", "r", "r", "w", "w", "u1", "u2"}
	for i := range 400 {
		n := 1 + rng.IntN(9)
		var toks []string
		prev := ""
		op := []string{"rel", "rel", "read", "enq"}[rng.IntN(4)]
		anyRel := false
		for range n {
			m := modes[rng.IntN(len(modes))]
			if prev != "" && rng.IntN(2) == 0 {
				m = prev
			}
			prev = m
			tok := m
			switch f := rng.IntN(20); {
			case f < 4:
				tok += "-"
			case f < 5:
				tok += "+"
			}
			if op == "rel" && !strings.Contains(tok, "+") && rng.IntN(4) == 0 {
				tok += "*"
				anyRel = true
			}
			toks = append(toks, tok)
		}
		if op == "rel" && !anyRel {
			op = "read"
		}
		if op == "enq" {
			op = "enq " + modes[rng.IntN(len(modes))]
			if !strings.HasSuffix(op, "w") && rng.IntN(3) == 0 {
				op += "?"
			}
		}
		runCrafted(t, env, fmt.Sprintf("k%d", i), runCase{strings.Join(toks, " "), op})
	}
}
