package pglock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock/keylock"
	"github.com/jackc/pgx/v5/pgxpool"
)

// fifoStep is one worker's call in a FIFO scenario, and its generation:
// the calls of generation g are granted together, once every call of the
// generations before has been released, and not before.
type fifoStep struct {
	cmd string // what the worker is told (workCall)
	gen int
}

// TestProcessesFIFO queues calls of one worker process each on one key
// behind a holder in this process, in a known order (each call's row is
// seen before the next worker is told to call), and releases them one
// generation at a time: every call of a generation must be granted, and
// none of a later one, and no grant may arrive before the release that
// allows it; tokens grow in queue order. It runs the Locker's modes
// (exclusive, shared, Wait: readers share, a Wait is transparent at the
// head) and the Semaphore's units (head-of-line).
func TestProcessesFIFO(t *testing.T) {
	for _, tc := range []struct {
		name  string
		size  int64
		steps []fifoStep
	}{
		{"Locker", 0, []fifoStep{{"x", 1}, {"r", 2}, {"r", 2}, {"x", 3}, {"w", 4}, {"w", 4}, {"r", 4}, {"x", 5}}},
		{"Semaphore", 3, []fifoStep{{"u 2", 1}, {"u 1", 1}, {"u 3", 2}, {"u 1", 3}, {"u 2", 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, sp := setup(t, 0)
			prefix := string(sp.prefix)
			const key = "hot"
			ctx := context.Background()
			procs := make([]*proc, len(tc.steps))
			for i := range procs {
				procs[i] = startWorker(t, "call", server(t).ConnString(), prefix, key, "PGLOCK_TEST_SIZE="+strconv.FormatInt(tc.size, 10))
			}
			for _, p := range procs {
				if l := p.next(t, 60*time.Second); l.text != "ready" {
					t.Fatalf("worker: %q", l.text)
				}
			}
			var hold keylock.Lease
			var err error
			if tc.size > 0 {
				s, serr := NewSemaphore(pool, prefix, tc.size, WithTTL(lockTTL))
				if serr != nil {
					t.Fatal(serr)
				}
				t.Cleanup(func() { s.Close(context.Background()) })
				hold, err = s.Acquire(ctx, key, tc.size)
			} else {
				hold, err = newLocker(t, pool, prefix).Lock(ctx, key)
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range tc.steps {
				procs[i].say(t, st.cmd)
				awaitRows(t, pool, prefix, key, i+2, 30*time.Second)
			}
			released := time.Now()
			if err := hold.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			last := hold.Token()
			for gen := 1; ; gen++ {
				var members []int
				for i, st := range tc.steps {
					if st.gen == gen {
						members = append(members, i)
					}
				}
				if len(members) == 0 {
					break
				}
				for _, i := range members {
					l := procs[i].next(t, 30*time.Second)
					if !l.at.After(released) {
						t.Errorf("call %d (%s) granted before the release that allows it", i, tc.steps[i].cmd)
					}
					if tc.steps[i].cmd == "w" {
						if l.text != "waited" {
							t.Fatalf("call %d (Wait): %q", i, l.text)
						}
						continue
					}
					f := strings.Fields(l.text)
					if len(f) != 2 || f[0] != "granted" {
						t.Fatalf("call %d: %q", i, l.text)
					}
					token, _ := strconv.ParseUint(f[1], 10, 64)
					if token <= last {
						t.Errorf("call %d: token %d after %d", i, token, last)
					}
					last = token
				}
				for i, st := range tc.steps {
					if st.gen > gen {
						procs[i].silent(t, "call "+strconv.Itoa(i)+" ("+st.cmd+")")
					}
				}
				released = time.Now()
				for _, i := range members {
					if tc.steps[i].cmd == "w" {
						continue
					}
					procs[i].say(t, "unlock")
					if l := procs[i].next(t, 30*time.Second); l.text != "unlocked" {
						t.Fatalf("call %d: %q", i, l.text)
					}
				}
			}
			for _, p := range procs {
				p.stdin.Close()
			}
			for _, p := range procs {
				p.wait(t, 30*time.Second)
			}
			awaitRows(t, pool, prefix, key, 0, 10*time.Second)
		})
	}
}

// TestProcessKilled: a holder process killed with SIGKILL stops renewing
// its session; the server's clock expires it, and the waiter behind it
// (whose Locker re-reads the key every third of its TTL) is granted
// within TTL + TTL/3 and a round trip, here bounded with 2 s more for a
// loaded machine (a bound, not a timing). A transaction fenced with the
// dead grant is refused.
func TestProcessKilled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, sp := setup(t, 0)
	prefix := string(sp.prefix)
	p := startWorker(t, "hold", server(t).ConnString(), prefix, "hot")
	f := strings.Fields(p.next(t, 60*time.Second).text)
	if len(f) != 3 || f[0] != "held" {
		t.Fatalf("worker: %q", f)
	}
	deadToken, _ := strconv.ParseInt(f[1], 10, 64)
	deadSession, _ := strconv.ParseInt(f[2], 10, 64)
	l := newLocker(t, pool, prefix)
	type grant struct {
		g  keylock.Lease
		at time.Time
	}
	granted := make(chan grant, 1)
	go func() {
		g, err := l.Lock(ctx, "hot")
		if err != nil {
			t.Error(err)
		}
		granted <- grant{g, time.Now()}
	}()
	awaitRows(t, pool, prefix, "hot", 2, 10*time.Second)
	killed := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gr := recvWithin(t, granted, lockTTL+20*time.Second, "the waiter was not granted after the holder was killed")
	if gr.g == nil {
		t.FailNow()
	}
	took := gr.at.Sub(killed)
	bound := lockTTL + lockTTL/3 + 2*time.Second
	t.Logf("granted %v after SIGKILL (TTL %v)", took, lockTTL)
	if took > bound {
		t.Errorf("granted %v after SIGKILL, more than %v", took, bound)
	}
	if gr.g.Token() <= uint64(deadToken) {
		t.Errorf("token %d after the dead holder's %d", gr.g.Token(), deadToken)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := fence(ctx, tx, deadSession, deadToken); !errors.Is(err, ErrLost) {
		t.Errorf("a transaction fenced with the dead grant: %v, want ErrLost", err)
	}
	tx.Rollback(ctx)
	if err := gr.g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	awaitRows(t, pool, prefix, "hot", 0, 10*time.Second)
}

// TestProcessPaused is the fence test across processes: a holder process
// stopped with SIGSTOP for longer than its TTL loses its grant; the waiter
// in this process is granted and writes, fenced, to a table of the same
// database. Resumed, the old holder tries its own fenced write, by the
// protocol's fence on its row (the server's check alone) and through
// Guard.Fence: both are refused with ErrLost, nothing of it is committed,
// its Lost closes and its Unlock says ErrLost.
func TestProcessPaused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, sp := setup(t, 0)
	prefix := string(sp.prefix)
	table := guarded(t, pool)
	p := startWorker(t, "paused", server(t).ConnString(), prefix, "hot", "PGLOCK_TEST_TABLE="+table)
	if l := p.next(t, 60*time.Second); !strings.HasPrefix(l.text, "held ") {
		t.Fatalf("worker: %q", l.text)
	}
	l := newLocker(t, pool, prefix)
	granted := make(chan keylock.Lease, 1)
	go func() {
		g, err := l.Lock(ctx, "hot")
		if err != nil {
			t.Error(err)
		}
		granted <- g
	}()
	awaitRows(t, pool, prefix, "hot", 2, 10*time.Second)
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	g := recvWithin(t, granted, lockTTL+20*time.Second, "the waiter was not granted while the holder was stopped")
	if g == nil {
		t.FailNow()
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.(*Guard).Fence(ctx, tx); err != nil {
		t.Fatalf("the new holder's fence: %v", err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, $2)", int64(g.Token()), "waiter"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	p.say(t, "go")
	lines := p.wait(t, 60*time.Second)
	want := []string{"row fence: lost", "guard fence: lost", "lost", "unlock lost: true"}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("the resumed holder said\n%q\nwant\n%q", lines, want)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if got := writers(t, pool, table); strings.Join(got, " ") != "waiter" {
		t.Errorf("the table holds writes of %q, want only the waiter's", got)
	}
}

// awaitValid fails t unless l is still valid (its grant held and certain).
func awaitValid(t *testing.T, l keylock.Lease, what string) {
	t.Helper()
	if !keylock.Valid(l) {
		t.Fatalf("%s: the grant is no longer valid (lost: %v)", what, isClosed(l.Lost()))
	}
}

// namedPools returns n pools of at most 4 connections on dsn, each with
// application_name name-i, and the schema in place.
func namedPools(t testing.TB, dsn, name string, n int) []*pgxpool.Pool {
	t.Helper()
	var out []*pgxpool.Pool
	for i := range n {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.MaxConns = 4
		cfg.ConnConfig.RuntimeParams["application_name"] = name + "-" + strconv.Itoa(i)
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Close)
		if err := ensureSchema(context.Background(), p); err != nil {
			t.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// TestDeadWaitersDoNotAddUp: three waiter processes queued in the middle
// of a key's queue are killed, and the holder releases at once, handing
// the key to the first of them. The live waiter behind them is granted
// once their sessions expire, all at once: within one TTL, one re-read
// period and a margin for a loaded machine, not one TTL per dead waiter
// (redisson/redisson#1353).
func TestDeadWaitersDoNotAddUp(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, sp := setup(t, 0)
	prefix := string(sp.prefix)
	holder := newLocker(t, pool, prefix)
	h, err := holder.Lock(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	var dead []*proc
	for range 3 {
		dead = append(dead, startWorker(t, "call", server(t).ConnString(), prefix, "hot"))
	}
	for i, p := range dead {
		if l := p.next(t, 60*time.Second); l.text != "ready" {
			t.Fatalf("worker: %q", l.text)
		}
		p.say(t, "x")
		awaitRows(t, pool, prefix, "hot", i+2, 30*time.Second)
	}
	live := newLocker(t, pool, prefix)
	granted := make(chan time.Time, 1)
	go func() {
		g, err := live.Lock(ctx, "hot")
		if err != nil {
			t.Error(err)
		}
		granted <- time.Now()
		if g != nil {
			g.Unlock(ctx)
		}
	}()
	awaitRows(t, pool, prefix, "hot", 5, 10*time.Second)
	for _, p := range dead {
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	killed := time.Now()
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	at := recvWithin(t, granted, 5*lockTTL+10*time.Second, "the live waiter was not granted")
	took := at.Sub(killed)
	bound := lockTTL + lockTTL/3 + 2*time.Second // < 3 TTLs: dead waiters do not add up
	t.Logf("the live waiter was granted %v after three waiters ahead of it were killed (TTL %v)", took, lockTTL)
	if took > bound {
		t.Errorf("granted %v after the kill, more than %v", took, bound)
	}
	awaitRows(t, pool, prefix, "hot", 0, 10*time.Second)
}
