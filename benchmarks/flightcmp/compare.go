package flightcmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/fairlock/fairlock/flight"
	"github.com/redis/go-redis/v9"
)

// Comparison is a running comparison: a client of the server and the
// worker processes.
type Comparison struct {
	cfg   Config
	rdb   *redis.Client
	procs []*proc
	seq   int
}

// Start starts a comparison on the Redis server at addr with cfg (zero
// fields take Defaults): it starts cfg.Procs workers by running argv (the
// program itself; see IsWorker). Close stops them.
func Start(addr string, argv []string, cfg Config) (*Comparison, error) {
	cfg = cfg.withDefaults()
	c := &Comparison{cfg: cfg, rdb: redis.NewClient(&redis.Options{Addr: addr})}
	spec, err := json.Marshal(workerSpec{Addr: addr, Config: cfg})
	if err != nil {
		return nil, err
	}
	for range cfg.Procs {
		p, err := startProc(argv, string(spec))
		if err != nil {
			c.Close()
			return nil, err
		}
		c.procs = append(c.procs, p)
	}
	return c, nil
}

// Close stops the workers and closes the client.
func (c *Comparison) Close() error {
	for _, p := range c.procs {
		p.stop()
	}
	return c.rdb.Close()
}

// Config returns the comparison's configuration, defaults filled in.
func (c *Comparison) Config() Config { return c.cfg }

// answer bounds the wait for a worker's answer.
const answer = time.Minute

// Expiry makes one key expire under cfg.Requests concurrent requests in
// each worker, through impl: it writes the key's entry as expired, has
// every worker arm, starts them all at once and returns the number of
// fills over all processes and every request's latency.
func (c *Comparison) Expiry(ctx context.Context, impl int) (fills int, lat []time.Duration, err error) {
	c.seq++
	key := "k" + strconv.Itoa(c.seq)
	stale, _ := json.Marshal(flight.Entry[string]{Value: "stale", Expires: time.Now().Add(-time.Second)})
	if err := c.rdb.Set(ctx, cacheKey(key), stale, 0).Err(); err != nil {
		return 0, nil, err
	}
	for _, p := range c.procs {
		if err := p.send("run", impl, key); err != nil {
			return 0, nil, err
		}
	}
	for _, p := range c.procs {
		if _, err := p.expect("armed", key); err != nil {
			return 0, nil, err
		}
	}
	signals := make([]any, len(c.procs))
	for i := range signals {
		signals[i] = 1
	}
	if err := c.rdb.RPush(ctx, goKey(key), signals...).Err(); err != nil {
		return 0, nil, err
	}
	for _, p := range c.procs {
		f, err := p.expect("lat", key)
		if err != nil {
			return 0, nil, err
		}
		for _, s := range f {
			ns, _ := strconv.ParseInt(s, 10, 64)
			lat = append(lat, time.Duration(ns))
		}
	}
	n, err := c.rdb.Get(ctx, fillsKey(key)).Int()
	return n, lat, err
}

// Run runs cfg.Rounds interleaved rounds, each of cfg.Expiries expiries
// per implementation (the implementations in an order rotated by the
// round, alternating expiry by expiry), and returns the figures.
// progress, if not nil, gets a line per round.
func (c *Comparison) Run(ctx context.Context, progress io.Writer) (*Results, error) {
	r := &Results{cfg: c.cfg}
	for round := range c.cfg.Rounds {
		var fills [numImpls]int
		var lat [numImpls][]time.Duration
		for range c.cfg.Expiries {
			for i := range numImpls {
				impl := (i + round) % numImpls
				n, l, err := c.Expiry(ctx, impl)
				if err != nil {
					return nil, fmt.Errorf("%s, round %d: %w", Names[impl], round+1, err)
				}
				fills[impl] += n
				lat[impl] = append(lat[impl], l...)
			}
		}
		for impl := range numImpls {
			r.add(impl, float64(fills[impl])/float64(c.cfg.Expiries), lat[impl])
		}
		if progress != nil {
			fmt.Fprintf(progress, "round %d/%d\n", round+1, c.cfg.Rounds)
		}
	}
	return r, nil
}

// proc is a worker process, seen from the parent.
type proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // its stdout, line by line; closed at EOF
	done  chan struct{}
}

// startProc starts argv as a worker with spec; its stderr is the
// parent's.
func startProc(argv []string, spec string) (*proc, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), workerEnv+"="+spec)
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
	p := &proc{cmd: cmd, stdin: stdin, lines: make(chan string, 16), done: make(chan struct{})}
	go func() {
		s := bufio.NewScanner(stdout)
		s.Buffer(nil, 1<<20) // a "lat" line holds a number per request
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

// expect returns the fields after "what key" of the worker's next line,
// which must be that; an "error" line, another line or the worker's exit
// is an error, and so is nothing within a minute.
func (p *proc) expect(what, key string) ([]string, error) {
	select {
	case line, ok := <-p.lines:
		if !ok {
			return nil, errors.New("flightcmp: a worker exited")
		}
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != what || f[1] != key {
			return nil, fmt.Errorf("flightcmp: worker: %q, want %s %s", line, what, key)
		}
		return f[2:], nil
	case <-time.After(answer):
		return nil, fmt.Errorf("flightcmp: no %s from a worker within %v", what, answer)
	}
}

// stop closes the worker's stdin, so that it exits, and kills it if it
// has not within 10 s.
func (p *proc) stop() {
	_ = p.stdin.Close()
	t := time.AfterFunc(10*time.Second, func() { _ = p.cmd.Process.Kill() })
	defer t.Stop()
	for range p.lines {
	}
	<-p.done
}
