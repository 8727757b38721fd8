package redislock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// Tests across processes re-execute the test binary as workers: TestMain
// sees workerEnv and calls runWorker, which connects to the parent's
// redis-server (REDISLOCK_TEST_ADDR), does its role, reports on stdout
// one line per event, and exits.

// fenceScript is a fenced store (Kleppmann's): it appends ARGV[2] to the
// list KEYS[2] only if the token ARGV[1] is larger than every token it
// accepted before (kept in KEYS[1]), and returns 1; else 0.
var fenceScript = redis.NewScript(`
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
local tok = tonumber(ARGV[1])
if tok <= last then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
`)

// fencedWrite appends entry to the log of key if token is the largest
// the store has seen for key.
func fencedWrite(ctx context.Context, c redis.UniversalClient, key string, token uint64, entry string) (bool, error) {
	n, err := fenceScript.Run(ctx, c, []string{"fence:" + key, "log:" + key}, strconv.FormatUint(token, 10), entry).Int()
	return n == 1, err
}

// runWorker runs a worker process's role and returns its exit code.
func runWorker(role string) int {
	client := redis.NewClient(&redis.Options{Addr: os.Getenv("REDISLOCK_TEST_ADDR")})
	defer client.Close()
	ttl, _ := time.ParseDuration(os.Getenv("REDISLOCK_TEST_TTL"))
	l, err := redislock.New(client, os.Getenv("REDISLOCK_TEST_PREFIX"), redislock.WithTTL(ttl))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer l.Close(context.Background())
	key := os.Getenv("REDISLOCK_TEST_KEY")
	ctx := context.Background()
	var g keylock.Lease
	switch role {
	case "fifo":
		// Lock once and log "id:token" through the fenced store: the log
		// is the grant order.
		id := os.Getenv("REDISLOCK_TEST_ID")
		if g, err = l.Lock(ctx, key); err == nil {
			var ok bool
			ok, err = fencedWrite(ctx, client, key, g.Token(), fmt.Sprintf("%s:%d", id, g.Token()))
			if err == nil && !ok {
				err = errors.New("fenced write refused")
			}
			if err == nil {
				fmt.Println("granted", id, g.Token())
				err = g.Unlock(ctx)
			}
		}
	case "hold":
		// Lock, say so, and stay until killed.
		if g, err = l.Lock(ctx, key); err == nil {
			fmt.Println("held", g.Token(), redislock.Member(g))
			select {}
		}
	case "paused":
		// Lock, say so, then (after the parent's SIGSTOP and SIGCONT)
		// report the loss, try a fenced write, and Unlock.
		if g, err = l.Lock(ctx, key); err == nil {
			fmt.Println("held", g.Token())
			select {
			case <-g.Lost():
				fmt.Println("lost")
			case <-time.After(time.Minute):
				fmt.Println("error Lost not closed within a minute")
				return 1
			}
			ok, werr := fencedWrite(ctx, client, key, g.Token(), "paused")
			fmt.Println("write accepted:", ok, werr)
			uerr := g.Unlock(ctx)
			fmt.Println("unlock lost:", errors.Is(uerr, redislock.ErrLost))
		}
	case "queue":
		// Lock: queue until granted or killed.
		if g, err = l.Lock(ctx, key); err == nil {
			fmt.Println("granted")
			err = g.Unlock(ctx)
		}
	default:
		if run, ok := roles[role]; ok {
			err = run(ctx, client, l, key)
		} else {
			err = fmt.Errorf("unknown role %q", role)
		}
	}
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	return 0
}

// roles are the worker roles that other test files add (flight_test.go
// does, in its init), by name: each runs in a worker process with the
// worker's client, its Locker on REDISLOCK_TEST_PREFIX and
// REDISLOCK_TEST_KEY, and fails the worker with its error.
var roles = map[string]func(ctx context.Context, client *redis.Client, l *redislock.Locker, key string) error{}

// proc is a worker process.
type proc struct {
	cmd   *exec.Cmd
	lines chan string // its stdout, line by line; closed at EOF
	done  chan error  // its exit
}

// startWorker starts the test binary as a worker with role on key under
// prefix, on the server at addr, with env added to its environment;
// t.Cleanup kills it if it is still running.
func startWorker(t *testing.T, role, addr, prefix, key string, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerEnv+"="+role,
		"REDISLOCK_TEST_ADDR="+addr,
		"REDISLOCK_TEST_TTL="+testTTL.String(),
		"REDISLOCK_TEST_PREFIX="+prefix,
		"REDISLOCK_TEST_KEY="+key)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, lines: make(chan string, 100), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		for range p.lines {
		}
		<-p.done
	})
	return p
}

// line returns the worker's next line, failing t if none comes within d.
func (p *proc) line(t *testing.T, d time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatal("worker exited")
		}
		return l
	case <-time.After(d):
		t.Fatalf("worker said nothing within %v", d)
	}
	return ""
}

// wait waits for the worker to exit and returns its output lines; it
// fails the test if the worker fails or takes longer than d.
func (p *proc) wait(t *testing.T, d time.Duration) []string {
	t.Helper()
	var lines []string
	timeout := time.After(d)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				if err := <-p.done; err != nil {
					t.Fatalf("worker: %v; output %q", err, lines)
				}
				p.done <- nil // for Cleanup
				return lines
			}
			lines = append(lines, line)
		case <-timeout:
			t.Fatalf("worker still running after %v; output %q", d, lines)
		}
	}
}

// awaitQueue polls until key's queue under prefix has n entries, failing
// t after d. A poll, not an ordering: the count decides.
func awaitQueue(t testing.TB, c redis.UniversalClient, prefix, key string, n int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got := queueLen(t, c, prefix, key)
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue of %q: %d entries, want %d within %v", key, got, n, d)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestProcessesFIFO: three worker processes queue on one key in a known
// order (each one's entry is seen in the queue before the next starts),
// behind a holder in this process, and are granted in that order with
// strictly increasing tokens, as a fenced store logs them.
func TestProcessesFIFO(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.NewClient(t)
	const prefix = "pfifo"
	l := newLocker(t, c, prefix)
	ctx := context.Background()
	g, err := l.Lock(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	var procs []*proc
	for i := range n {
		procs = append(procs, startWorker(t, "fifo", srv.Addr(), prefix, "hot", "REDISLOCK_TEST_ID="+strconv.Itoa(i)))
		awaitQueue(t, c, prefix, "hot", i+2, 30*time.Second)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		p.wait(t, 60*time.Second)
	}
	entries, err := c.LRange(ctx, "log:hot", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("grant log: %q", entries)
	if len(entries) != n {
		t.Fatalf("%d grants logged, want %d", len(entries), n)
	}
	last := g.Token()
	for i, e := range entries {
		id, tok, _ := strings.Cut(e, ":")
		token, _ := strconv.ParseUint(tok, 10, 64)
		if id != strconv.Itoa(i) {
			t.Errorf("grant %d went to worker %s, queued %d-th", i, id, i)
		}
		if token <= last {
			t.Errorf("grant %d: token %d after %d", i, token, last)
		}
		last = token
	}
	awaitQueue(t, c, prefix, "hot", 0, 10*time.Second)
}

// TestProcessKilled: a holder process killed with SIGKILL stops renewing
// its session; the session's marker expires on the server and the next
// waiter is granted within the TTL plus one re-read period (TTL/3) plus
// a margin for a loaded machine; a write fenced with the dead grant's
// token is refused.
func TestProcessKilled(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.NewClient(t)
	const prefix = "kill"
	p := startWorker(t, "hold", srv.Addr(), prefix, "hot")
	f := strings.Fields(p.line(t, 30*time.Second))
	if len(f) != 3 || f[0] != "held" {
		t.Fatalf("worker: %q", f)
	}
	dead, _ := strconv.ParseUint(f[1], 10, 64)
	l := newLocker(t, c, prefix)
	type grant struct {
		g  keylock.Lease
		at time.Time
	}
	granted := make(chan grant, 1)
	go func() {
		g, err := l.Lock(context.Background(), "hot")
		if err != nil {
			t.Error(err)
		}
		granted <- grant{g, time.Now()}
	}()
	awaitQueue(t, c, prefix, "hot", 2, 10*time.Second)
	killed := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gr := recvWithin(t, granted, testTTL+10*time.Second, "the waiter was not granted after the holder was killed")
	if gr.g == nil {
		t.FailNow()
	}
	took := gr.at.Sub(killed)
	bound := testTTL + testTTL/3 + 2*time.Second
	t.Logf("granted %v after SIGKILL (TTL %v)", took, testTTL)
	if took > bound {
		t.Errorf("granted %v after SIGKILL, more than %v", took, bound)
	}
	ctx := context.Background()
	if ok, err := fencedWrite(ctx, c, "hot", gr.g.Token(), "next"); err != nil || !ok {
		t.Fatalf("the next holder's fenced write: %v %v", ok, err)
	}
	if ok, err := fencedWrite(ctx, c, "hot", dead, "dead"); err != nil || ok {
		t.Fatalf("the dead grant's fenced write: accepted %v, %v; want refused", ok, err)
	}
	if err := gr.g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	awaitQueue(t, c, prefix, "hot", 0, 10*time.Second)
}

// TestProcessPaused: a holder process stopped with SIGSTOP for longer
// than its TTL loses its grant: the waiter is granted, and once resumed
// the holder sees Lost close (its renewal deadline has passed), its
// fenced write is refused (the waiter wrote with a larger token), and its
// Unlock returns ErrLost.
func TestProcessPaused(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.NewClient(t)
	const prefix = "pause"
	p := startWorker(t, "paused", srv.Addr(), prefix, "hot")
	if line := p.line(t, 30*time.Second); !strings.HasPrefix(line, "held ") {
		t.Fatalf("worker: %q", line)
	}
	l := newLocker(t, c, prefix)
	granted := lockAsync(t, context.Background(), l, "hot")
	awaitQueue(t, c, prefix, "hot", 2, 10*time.Second)
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	g := awaitGrant(t, granted, testTTL+10*time.Second, "the waiter was not granted while the holder was stopped")
	ctx := context.Background()
	if ok, err := fencedWrite(ctx, c, "hot", g.Token(), "waiter"); err != nil || !ok {
		t.Fatalf("the waiter's fenced write: %v %v", ok, err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	lines := p.wait(t, 30*time.Second)
	want := []string{"lost", "write accepted: false <nil>", "unlock lost: true"}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("the resumed holder said\n%q\nwant\n%q", lines, want)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	log, _ := c.LRange(ctx, "log:hot", 0, -1).Result()
	if strings.Join(log, " ") != "waiter" {
		t.Errorf("the store's log: %q, want only the waiter's write", log)
	}
}

// TestDeadWaitersDoNotAddUp: three waiter processes queued in the middle
// of a key's queue are killed, and the holder releases at once, handing
// the key to the first of them. The live waiter behind them is granted
// once their sessions expire, all at about the same time: within one
// TTL, one re-read period and a margin of the kill, not one TTL per dead
// waiter (redisson/redisson#1353).
func TestDeadWaitersDoNotAddUp(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.NewClient(t)
	const prefix = "deadwaiters"
	holder := newLocker(t, c, prefix)
	ctx := context.Background()
	h, err := holder.Lock(ctx, "hot")
	if err != nil {
		t.Fatal(err)
	}
	var dead []*proc
	for i := range 3 {
		dead = append(dead, startWorker(t, "queue", srv.Addr(), prefix, "hot"))
		awaitQueue(t, c, prefix, "hot", i+2, 30*time.Second)
	}
	live := newLocker(t, srv.NewClient(t), prefix)
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
	awaitQueue(t, c, prefix, "hot", 5, 10*time.Second)
	for _, p := range dead {
		if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	killed := time.Now()
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	at := recvWithin(t, granted, 5*testTTL, "the live waiter was not granted")
	took := at.Sub(killed)
	bound := testTTL + testTTL/3 + 2*time.Second // < 3 TTLs: dead waiters do not add up
	t.Logf("the live waiter was granted %v after three waiters ahead of it were killed (TTL %v)", took, testTTL)
	if took > bound {
		t.Errorf("granted %v after the kill, more than %v", took, bound)
	}
	awaitQueue(t, c, prefix, "hot", 0, 10*time.Second)
}
