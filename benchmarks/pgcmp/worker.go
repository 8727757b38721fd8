package pgcmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fairlock/fairlock/owner"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The scenarios across processes run the locks in worker processes: the
// program (cmd/pg-compare, or the test binary) re-executed with
// workerEnv set to the JSON of a workerSpec. A worker reads one command a
// line on stdin and answers on stdout, a line an event:
//
//	wait IMPL KEY ID        lock KEY; "queued ID" if the call had to wait
//	                        (the polling loop: its first try failed), then,
//	                        after the grant, an increment of the key's rank
//	                        counter (a row of pgcmp_rank) under the lock and
//	                        the unlock, "granted ID UNIXNANO RANK" (UNIXNANO:
//	                        the time Lock returned), or "gaveup ID UNIXNANO"
//	                        when the call gave up
//	hold IMPL KEY           lock KEY, "held", and keep the grant (pglock's
//	                        session renews itself; an advisory lock lives
//	                        with its connection) until the process is killed
//	hot IMPL KEY G START D  from START (Unix ns) for D (ns), G goroutines
//	                        lock and unlock KEY in a loop; "hot N1 … NG",
//	                        the grants of each
//
// and "error ID MESSAGE" for a call that failed otherwise. It exits when
// stdin closes.
const workerEnv = "PGCMP_WORKER"

// workerSpec is what a worker is told through workerEnv.
type workerSpec struct {
	DSN    string
	Config Config
}

// IsWorker reports whether this process was started as a worker of a
// comparison; the program's main (or TestMain) then calls RunWorker and
// exits with its result.
func IsWorker() bool { return os.Getenv(workerEnv) != "" }

// RunWorker runs a worker process (IsWorker) until its stdin closes, and
// returns its exit code.
func RunWorker() int {
	var spec workerSpec
	if err := json.Unmarshal([]byte(os.Getenv(workerEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "pgcmp worker:", err)
		return 2
	}
	pool, err := newPool(spec.DSN, spec.Config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgcmp worker:", err)
		return 1
	}
	defer pool.Close()
	ls, err := newLocks(pool, spec.Config)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgcmp worker:", err)
		return 1
	}
	defer ls.close()
	w := &worker{ls: ls, pool: pool}
	in := bufio.NewScanner(os.Stdin)
	var wg sync.WaitGroup
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) < 3 {
			w.say("error", "-", "bad command", strconv.Quote(in.Text()))
			continue
		}
		impl, _ := strconv.Atoi(f[1])
		wg.Go(func() { w.do(impl, f) })
	}
	wg.Wait()
	return 0
}

// worker is a worker process's state.
type worker struct {
	ls   *locks
	pool *pgxpool.Pool
	mu   sync.Mutex // serialises lines on stdout
}

func (w *worker) say(fields ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Println(fields...)
}

// do runs one command, f: its name, implementation, key and arguments.
func (w *worker) do(impl int, f []string) {
	ctx := owner.NewContext(context.Background())
	key := f[2]
	if need := map[string]int{"wait": 4, "hold": 3, "hot": 6}[f[0]]; len(f) < need {
		w.say("error", "-", "bad command", strings.Join(f, " "))
		return
	}
	switch f[0] {
	case "wait":
		id := f[3]
		unlock, err := w.ls.lock(ctx, impl, key, func() { w.say("queued", id) })
		at := time.Now().UnixNano()
		if errors.Is(err, errNotGranted) {
			w.say("gaveup", id, at)
			return
		}
		if err != nil {
			w.say("error", id, err)
			return
		}
		var rank int64
		err = w.pool.QueryRow(ctx, rankSQL, rankKey(impl, key)).Scan(&rank)
		if uerr := unlock(ctx); err == nil {
			err = uerr
		}
		if err != nil {
			w.say("error", id, err)
			return
		}
		w.say("granted", id, at, rank)
	case "hold":
		if _, err := w.ls.lock(ctx, impl, key, nil); err != nil {
			w.say("error", "hold", err)
			return
		}
		w.say("held")
		select {}
	case "hot":
		g, _ := strconv.Atoi(f[3])
		start, _ := strconv.ParseInt(f[4], 10, 64)
		d, _ := strconv.ParseInt(f[5], 10, 64)
		counts, err := w.hot(ctx, impl, key, g, time.Unix(0, start), time.Duration(d))
		if err != nil {
			w.say("error", "hot", err)
			return
		}
		out := []any{"hot"}
		for _, n := range counts {
			out = append(out, n)
		}
		w.say(out...)
	default:
		w.say("error", "-", "unknown command", f[0])
	}
}

// hot runs g goroutines, each its own owner, that lock and unlock key
// from start until start+d, and returns the grants of each. A call still
// waiting at the end is cut off by the context's deadline and not counted.
func (w *worker) hot(ctx context.Context, impl int, key string, g int, start time.Time, d time.Duration) ([]int, error) {
	time.Sleep(time.Until(start))
	ctx, cancel := context.WithDeadline(ctx, start.Add(d))
	defer cancel()
	counts := make([]int, g)
	errs := make([]error, g)
	var wg sync.WaitGroup
	for i := range g {
		wg.Go(func() {
			ctx := owner.NewContext(ctx)
			for ctx.Err() == nil {
				unlock, err := w.ls.lock(ctx, impl, key, nil)
				if err != nil {
					if ctx.Err() == nil && !errors.Is(err, errNotGranted) {
						errs[i] = err
						return
					}
					continue
				}
				counts[i]++
				if err := unlock(context.Background()); err != nil {
					errs[i] = err
					return
				}
			}
		})
	}
	wg.Wait()
	return counts, errors.Join(errs...)
}

// rankKey is the counter a waiter of wait increments under the lock: its
// value is the order of the grant.
func rankKey(impl int, key string) string {
	return strconv.Itoa(impl) + ":" + key
}

// rankTable is the table of the rank counters, which Start creates.
const rankTable = `CREATE TABLE IF NOT EXISTS pgcmp_rank (key text PRIMARY KEY, n bigint NOT NULL)`

// rankSQL increments a rank counter ($1) and returns its new value.
const rankSQL = `INSERT INTO pgcmp_rank VALUES ($1, 1) ON CONFLICT (key) DO UPDATE SET n = pgcmp_rank.n + 1 RETURNING n`

// newPool returns a pool on dsn sized for cfg (poolSize).
func newPool(dsn string, cfg Config) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = poolSize(cfg)
	return pgxpool.NewWithConfig(context.Background(), pc)
}

// proc is a worker process, seen from the parent.
type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // its stdout, line by line; closed at EOF
	stash [][]string  // lines read but not yet expected
	done  chan struct{}
}

// startProc starts argv as a worker for spec; its stderr is the parent's.
func startProc(argv []string, spec workerSpec) (*proc, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), workerEnv+"="+string(b))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, stdin: stdin, lines: make(chan string, 1024), done: make(chan struct{})}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			p.lines <- s.Text()
		}
		close(p.lines)
		_ = cmd.Wait() // after the last read, as exec.Cmd.StdoutPipe asks
		close(p.done)
	}()
	return p, nil
}

// send writes one command line.
func (p *proc) send(fields ...any) error {
	_, err := fmt.Fprintln(p.stdin, fields...)
	return err
}

// expect returns the first line, stashed or new, whose fields satisfy
// match, stashing the others; an "error" line or the worker's exit is an
// error, and so is nothing within timeout.
func (p *proc) expect(timeout time.Duration, match func(f []string) bool) ([]string, error) {
	if i := slices.IndexFunc(p.stash, match); i >= 0 {
		f := p.stash[i]
		p.stash = slices.Delete(p.stash, i, i+1)
		return f, nil
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				return nil, errors.New("pgcmp: the worker exited")
			}
			f := strings.Fields(line)
			if len(f) > 0 && f[0] == "error" {
				return nil, fmt.Errorf("pgcmp: worker: %s", line)
			}
			if match(f) {
				return f, nil
			}
			p.stash = append(p.stash, f)
		case <-t.C:
			return nil, fmt.Errorf("pgcmp: no answer from the worker within %v", timeout)
		}
	}
}

// is returns a match for expect: a line of the given first fields.
func is(first ...string) func([]string) bool {
	return func(f []string) bool {
		return len(f) >= len(first) && slices.Equal(f[:len(first)], first)
	}
}

// kill kills the worker (SIGKILL) and waits for it to exit.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	p.drain()
}

// stop closes the worker's stdin, so that it exits, and kills it if it
// has not within 10 s.
func (p *proc) stop() {
	_ = p.stdin.Close()
	t := time.AfterFunc(10*time.Second, func() { _ = p.cmd.Process.Kill() })
	defer t.Stop()
	p.drain()
}

// drain discards the worker's output until it exits.
func (p *proc) drain() {
	for range p.lines {
	}
	<-p.done
}
