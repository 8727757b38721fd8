package pglock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock/keylock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Tests across processes re-execute the test binary as workers: TestMain
// sees workerEnv and calls runWorker, which connects to the parent's
// server (PGLOCK_TEST_DSN), does its role, reports on stdout one line per
// event, and exits.

// workerEnv names the role of a re-executed test binary.
const workerEnv = "PGLOCK_TEST_WORKER"

// runWorker runs a worker process's role and returns its exit code.
func runWorker(role string) int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("PGLOCK_TEST_DSN"))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer pool.Close()
	ttl, _ := time.ParseDuration(os.Getenv("PGLOCK_TEST_TTL"))
	prefix, key := os.Getenv("PGLOCK_TEST_PREFIX"), os.Getenv("PGLOCK_TEST_KEY")
	switch role {
	case "call":
		err = workCall(ctx, pool, prefix, key, ttl)
	case "hold", "paused":
		err = workHold(ctx, pool, prefix, key, ttl, role == "paused")
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	return 0
}

// workCall makes a Locker (a Semaphore of PGLOCK_TEST_SIZE units, if set)
// and says "ready", then makes the one call that stdin asks for ("x", "r",
// "w" for a Wait, or "u W") and says "granted TOKEN" (a Wait: "waited")
// when it returns, then unlocks when stdin says "unlock" and says
// "unlocked". It closes the Locker at the end of stdin.
func workCall(ctx context.Context, pool *pgxpool.Pool, prefix, key string, ttl time.Duration) error {
	size, _ := strconv.ParseInt(os.Getenv("PGLOCK_TEST_SIZE"), 10, 64)
	var l *Locker
	var s *Semaphore
	var err error
	if size > 0 {
		s, err = NewSemaphore(pool, prefix, size, WithTTL(ttl))
	} else {
		l, err = New(pool, prefix, WithTTL(ttl))
	}
	if err != nil {
		return err
	}
	defer func() {
		if l != nil {
			l.Close(ctx)
		} else {
			s.Close(ctx)
		}
	}()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	var g keylock.Lease
	for in.Scan() {
		f := strings.Fields(in.Text())
		switch {
		case len(f) == 0:
		case f[0] == "unlock":
			if err := g.Unlock(ctx); err != nil {
				return err
			}
			fmt.Println("unlocked")
		case f[0] == "w":
			if err := l.Wait(ctx, key); err != nil {
				return err
			}
			fmt.Println("waited")
		default:
			switch f[0] {
			case "x":
				g, err = l.Lock(ctx, key)
			case "r":
				g, err = l.RLock(ctx, key)
			case "u":
				w, _ := strconv.ParseInt(f[1], 10, 64)
				g, err = s.Acquire(ctx, key, w)
			}
			if err != nil {
				return err
			}
			fmt.Println("granted", g.Token())
		}
	}
	return in.Err()
}

// workHold locks key and says "held TOKEN SESSION", then stays until
// killed; paused, it then waits for a line on stdin (the parent sends it
// after SIGCONT) and says what a holder that was paused past its TTL
// finds: a write fenced with its grant's row by the protocol itself
// ("row fence: ..."), then through Guard.Fence ("guard fence: ..."), each
// refused with ErrLost ("lost") or committed ("committed"), then whether
// Lost closed within a minute ("lost") and whether Unlock said so
// ("unlock lost: true").
func workHold(ctx context.Context, pool *pgxpool.Pool, prefix, key string, ttl time.Duration, paused bool) error {
	l, err := New(pool, prefix, WithTTL(ttl))
	if err != nil {
		return err
	}
	defer l.Close(ctx)
	g, err := l.Lock(ctx, key)
	if err != nil {
		return err
	}
	ref := refOfLease(g)
	fmt.Println("held", g.Token(), ref.Session)
	if !paused {
		select {}
	}
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	table := os.Getenv("PGLOCK_TEST_TABLE")
	write := func(what string, fn func(tx pgx.Tx) error) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		err = fn(tx)
		switch {
		case errors.Is(err, ErrLost):
			fmt.Println(what, "fence: lost")
			return nil
		case err != nil:
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" VALUES ($1, $2)", int64(g.Token()), "paused"); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		fmt.Println(what, "fence: committed")
		return nil
	}
	if err := write("row", func(tx pgx.Tx) error { return fence(ctx, tx, ref.Session, int64(g.Token())) }); err != nil {
		return err
	}
	if err := write("guard", func(tx pgx.Tx) error { return g.(*Guard).Fence(ctx, tx) }); err != nil {
		return err
	}
	select {
	case <-g.Lost():
		fmt.Println("lost")
	case <-time.After(time.Minute):
		return errors.New("Lost not closed within a minute")
	}
	fmt.Println("unlock lost:", errors.Is(g.Unlock(ctx), ErrLost))
	return nil
}

// line is one line a worker said, and when this process read it.
type line struct {
	text string
	at   time.Time
}

// proc is a worker process.
type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan line  // its stdout, line by line; closed at EOF
	done  chan error // its exit
}

// startWorker starts the test binary as a worker with role on key under
// prefix, on the server of dsn, with env added to its environment;
// t.Cleanup kills it if it is still running.
func startWorker(t *testing.T, role, dsn, prefix, key string, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerEnv+"="+role,
		"PGLOCK_TEST_DSN="+dsn,
		"PGLOCK_TEST_TTL="+lockTTL.String(),
		"PGLOCK_TEST_PREFIX="+prefix,
		"PGLOCK_TEST_KEY="+key)
	// A binary built with -race sleeps a second at exit (the race
	// detector's atexit_sleep_ms) unless told not to.
	cmd.Env = append(cmd.Env, "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, stdin: stdin, lines: make(chan line, 100), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- line{sc.Text(), time.Now()}
		}
		close(p.lines)
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		stdin.Close()
		for range p.lines {
		}
		<-p.done
	})
	return p
}

// say writes s and a newline to the worker's stdin.
func (p *proc) say(t *testing.T, s string) {
	t.Helper()
	if _, err := io.WriteString(p.stdin, s+"\n"); err != nil {
		t.Fatal(err)
	}
}

// next returns the worker's next line, failing t if none comes within d,
// or if it is an error.
func (p *proc) next(t *testing.T, d time.Duration) line {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatal("worker exited")
		}
		if strings.HasPrefix(l.text, "error") {
			t.Fatalf("worker: %s", l.text)
		}
		return l
	case <-time.After(d):
		t.Fatalf("worker said nothing within %v", d)
	}
	return line{}
}

// silent fails t if the worker has said something not yet read.
func (p *proc) silent(t *testing.T, who string) {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		t.Fatalf("%s said %q (open %v) too early", who, l.text, ok)
	default:
	}
}

// wait waits for the worker to exit and returns its output lines; it
// fails the test if the worker fails or takes longer than d.
func (p *proc) wait(t *testing.T, d time.Duration) []string {
	t.Helper()
	var lines []string
	timeout := time.After(d)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				if err := <-p.done; err != nil {
					t.Fatalf("worker: %v; output %q", err, lines)
				}
				p.done <- nil // for Cleanup
				return lines
			}
			lines = append(lines, l.text)
		case <-timeout:
			t.Fatalf("worker still running after %v; output %q", d, lines)
		}
	}
}
