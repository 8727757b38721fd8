// Package proccmp is the harness of the comparisons across processes,
// rediscmp's and pgcmp's: a fairlock lock beside the locks a Go service
// would otherwise use on the same server, measured in a parent process
// and three worker processes (the program re-executed) in interleaved
// rounds. The scenarios are an uncontended Lock+Unlock, the hand-off to
// a waiter queued in another process, a hot key shared by three
// processes, the order in which queued waiters are granted, and what a
// waiter sees when the holder's process is killed.
//
// An engine package gives what differs: its locks (Locks, in the parent
// and in each worker), their names and its command's (Engine), its
// configuration beyond Config, and the header's words on its server and
// how each lock waits (Setup). The worker processes (RunWorker, Proc),
// the table (Results) and the command line (Command) are here; flightcmp,
// a comparison of another kind, shares the worker processes' start
// (StartProc, IsWorker, ReadSpec), Proc, Summarize, Table, Machine and
// Command with them.
package proccmp

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"
)

// Comparison is a running comparison: this process's locks and three
// worker processes.
type Comparison struct {
	e       *Engine
	cfg     Config
	spec    any
	argv    []string
	ls      Locks
	procs   [3]*Proc
	seq     int
	rng     *rand.Rand
	server  string
	waiting string
}

// Setup is what Start needs of an engine's comparison.
type Setup struct {
	Config  Config   // defaults filled in (Config.WithDefaults)
	Locks   Locks    // this process's; Close closes them
	Argv    []string // the program to run as a worker (see Engine.IsWorker)
	Spec    any      // what each worker is told (JSON), for RunWorker's open
	Server  string   // the server, as the header names it: "redis-server"
	Waiting string   // the header's sentence on how each lock waits
}

// Start starts a comparison of e's locks as s sets it: it starts three
// workers by running s.Argv. Close stops them; if Start fails, it has
// closed s.Locks.
func Start(e *Engine, s Setup) (*Comparison, error) {
	c := &Comparison{
		e:       e,
		cfg:     s.Config,
		spec:    s.Spec,
		argv:    s.Argv,
		ls:      s.Locks,
		rng:     rand.New(rand.NewPCG(1, 2)),
		server:  s.Server,
		waiting: s.Waiting,
	}
	for i := range c.procs {
		var err error
		if c.procs[i], err = c.startProc(); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// startProc starts a worker.
func (c *Comparison) startProc() (*Proc, error) {
	return StartProc(c.e.Name, c.argv, c.e.Env, c.spec)
}

// Close stops the workers and closes the locks.
func (c *Comparison) Close() error {
	for _, p := range c.procs {
		if p != nil {
			p.Stop()
		}
	}
	return c.ls.Close()
}

// Config returns the comparison's configuration.
func (c *Comparison) Config() Config { return c.cfg }

// Names returns the names of the locks, an index an implementation.
func (c *Comparison) Names() []string { return c.e.Names }

// key returns a key not used before in this comparison.
func (c *Comparison) key(what string) string {
	c.seq++
	return what + strconv.Itoa(c.seq)
}

// answer is how long the parent waits for a worker's answer to a call
// that may wait the whole bound.
func (c *Comparison) answer() time.Duration { return c.cfg.Bound + 10*time.Second }

// Uncontended returns the median time of a Lock+Unlock of a free key by
// impl, over cfg.Uncontended pairs in this process, after one untimed
// pair (the first loads the scripts into the server, or prepares the
// statements on a connection).
func (c *Comparison) Uncontended(ctx context.Context, impl int) (time.Duration, error) {
	key := c.key("free")
	d := make([]time.Duration, c.cfg.Uncontended+1)
	for i := range d {
		start := time.Now()
		unlock, _, err := c.ls.Lock(ctx, impl, key, nil)
		if err != nil {
			return 0, err
		}
		if err := unlock(ctx); err != nil {
			return 0, err
		}
		d[i] = time.Since(start)
	}
	return median(d[1:]), nil
}

// awaitQueued returns once the call id of worker p on key waits: for a
// lock whose waiters the server shows (Locks.Queued), once n calls hold
// or wait for the key; for the others, once the worker said "queued id"
// (the call's first try failed).
func (c *Comparison) awaitQueued(ctx context.Context, p *Proc, impl int, key, id string, n int64) error {
	deadline := time.Now().Add(c.answer())
	for {
		got, ok, err := c.ls.Queued(ctx, impl, key)
		if err != nil {
			return err
		}
		if !ok {
			_, err := p.Expect(c.answer(), Is("queued", id))
			return err
		}
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %d of %d calls queued on %q", c.e.Name, got, n, key)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// granted waits for worker p's answer to the wait call id and returns
// the time its Lock returned and the grant's rank; ok is false if the
// call gave up.
func (c *Comparison) granted(p *Proc, id string) (at time.Time, rank int, ok bool, err error) {
	f, err := p.Expect(c.answer(), func(f []string) bool {
		return len(f) >= 3 && (f[0] == "granted" || f[0] == "gaveup") && f[1] == id
	})
	if err != nil {
		return time.Time{}, 0, false, err
	}
	ns, _ := strconv.ParseInt(f[2], 10, 64)
	if f[0] == "gaveup" {
		return time.Unix(0, ns), 0, false, nil
	}
	rank, _ = strconv.Atoi(f[3])
	return time.Unix(0, ns), rank, true, nil
}

// HandOffs returns the median hand-off of impl over holds, one hand-off
// each: this process locks a key, a worker process calls Lock on it, and
// once that call waits the holder keeps the key for the hold and
// unlocks. A hand-off is the time from the holder's Unlock call to the
// waiter's Lock return (the two processes read the same clock). The holds
// model a waiter that arrives during a critical section; with a polling
// lock, they set where in its sleep the release falls.
func (c *Comparison) HandOffs(ctx context.Context, impl int, holds []time.Duration) (time.Duration, error) {
	p := c.procs[0]
	d := make([]time.Duration, 0, len(holds))
	for _, hold := range holds {
		key := c.key("handoff")
		unlock, _, err := c.ls.Lock(ctx, impl, key, nil)
		if err != nil {
			return 0, err
		}
		if err := p.Send("wait", impl, key, "h"); err != nil {
			return 0, err
		}
		if err := c.awaitQueued(ctx, p, impl, key, "h", 2); err != nil {
			_ = unlock(ctx)
			return 0, err
		}
		time.Sleep(hold)
		start := time.Now()
		if err := unlock(ctx); err != nil {
			return 0, err
		}
		at, _, ok, err := c.granted(p, "h")
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, fmt.Errorf("%s: %s: the waiter gave up", c.e.Name, c.e.Names[impl])
		}
		d = append(d, at.Sub(start))
	}
	return median(d), nil
}

// Holds returns n holds for HandOffs, drawn uniformly below cfg.MaxHold;
// a round gives every lock the same holds.
func (c *Comparison) Holds(n int) []time.Duration {
	h := make([]time.Duration, n)
	for i := range h {
		h[i] = time.Duration(c.rng.Int64N(int64(c.cfg.MaxHold)))
	}
	return h
}

// HotKey runs cfg.HotG goroutines in each of the three workers, locking
// and unlocking one key (an empty critical section) for cfg.HotDuration,
// and returns the grants per second of them all and Jain's index of the
// grants per goroutine: 1 when every goroutine got the same number,
// 1/(3·HotG) when one got them all.
func (c *Comparison) HotKey(ctx context.Context, impl int) (rate, jain float64, err error) {
	key := c.key("hot")
	start := time.Now().Add(200 * time.Millisecond)
	for _, p := range c.procs {
		if err := p.Send("hot", impl, key, c.cfg.HotG, start.UnixNano(), c.cfg.HotDuration.Nanoseconds()); err != nil {
			return 0, 0, err
		}
	}
	var counts []float64
	for _, p := range c.procs {
		f, err := p.Expect(c.cfg.HotDuration+c.answer(), Is("hot"))
		if err != nil {
			return 0, 0, err
		}
		for _, s := range f[1:] {
			n, _ := strconv.Atoi(s)
			counts = append(counts, float64(n))
		}
	}
	var sum, sq float64
	for _, n := range counts {
		sum += n
		sq += n * n
	}
	if sq == 0 {
		return 0, math.NaN(), nil
	}
	return sum / c.cfg.HotDuration.Seconds(), sum * sum / (float64(len(counts)) * sq), nil
}

// GrantOrder holds a key in this process, queues cfg.Waiters calls on it
// one after another, waiter i in worker i mod 3, each only once the one
// before it waits, then unlocks, and returns how many grants went to a
// waiter while one queued before it still waited (each waiter learns its
// place in the grant order from a counter it increments under the lock).
func (c *Comparison) GrantOrder(ctx context.Context, impl int) (int, error) {
	key := c.key("order")
	unlock, _, err := c.ls.Lock(ctx, impl, key, nil)
	if err != nil {
		return 0, err
	}
	n := c.cfg.Waiters
	for i := range n {
		p, id := c.procs[i%3], "o"+strconv.Itoa(i)
		err := p.Send("wait", impl, key, id)
		if err == nil {
			err = c.awaitQueued(ctx, p, impl, key, id, int64(i+2))
		}
		if err != nil {
			_ = unlock(ctx)
			return 0, err
		}
	}
	if err := unlock(ctx); err != nil {
		return 0, err
	}
	byRank := make([]int, n) // waiter granted n'th
	for i := range n {
		_, rank, ok, err := c.granted(c.procs[i%3], "o"+strconv.Itoa(i))
		if err != nil {
			return 0, err
		}
		if !ok || rank < 1 || rank > n {
			return 0, fmt.Errorf("%s: %s: waiter %d gave up or has rank %d", c.e.Name, c.e.Names[impl], i, rank)
		}
		byRank[rank-1] = i
	}
	return outOfOrder(byRank), nil
}

// outOfOrder counts the grants, in grant order (waiters by their arrival
// index), that went to a waiter while one that arrived earlier still
// waited.
func outOfOrder(grants []int) int {
	waiting := make([]bool, len(grants))
	for i := range waiting {
		waiting[i] = true
	}
	first, bad := 0, 0 // first: the earliest arrival still waiting
	for _, w := range grants {
		if w != first {
			bad++
		}
		waiting[w] = false
		for first < len(waiting) && !waiting[first] {
			first++
		}
	}
	return bad
}

// HolderDies starts a fifth process that locks a key and keeps its grant
// (renewing it where the lock needs renewals), queues a call of worker 0
// on the key, waits the given delay (below a third of the TTL, so that
// the kill falls anywhere between two renewals), kills the holder with
// SIGKILL, and returns the time from the kill to the waiter's grant; ok
// is false if the waiter gave up instead (within the bound).
func (c *Comparison) HolderDies(ctx context.Context, impl int, delay time.Duration) (d time.Duration, ok bool, err error) {
	key := c.key("dies")
	h, err := c.startProc()
	if err != nil {
		return 0, false, err
	}
	defer h.Kill()
	if err := h.Send("hold", impl, key); err != nil {
		return 0, false, err
	}
	if _, err := h.Expect(c.answer(), Is("held")); err != nil {
		return 0, false, err
	}
	p := c.procs[0]
	if err := p.Send("wait", impl, key, "d"); err != nil {
		return 0, false, err
	}
	if err := c.awaitQueued(ctx, p, impl, key, "d", 2); err != nil {
		return 0, false, err
	}
	time.Sleep(delay)
	killed := time.Now()
	h.Kill()
	at, _, ok, err := c.granted(p, "d")
	if err != nil || !ok {
		return 0, false, err
	}
	return at.Sub(killed), true, nil
}

// Delays returns n delays for HolderDies, drawn uniformly below a third
// of the TTL; a round gives every lock the same delay.
func (c *Comparison) Delays(n int) []time.Duration {
	h := make([]time.Duration, n)
	for i := range h {
		h[i] = time.Duration(c.rng.Int64N(int64(c.cfg.TTL / 3)))
	}
	return h
}

// median returns the median of d (the mean of the middle two for an even
// count); d is sorted in place.
func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	n := len(d)
	if n%2 == 0 {
		return (d[n/2-1] + d[n/2]) / 2
	}
	return d[n/2]
}

// Run runs every scenario for cfg.Rounds interleaved rounds (each round
// measures every lock in every scenario, the locks in an order rotated by
// the round) and returns the figures. progress, if not nil, gets a line
// per scenario and round.
func (c *Comparison) Run(ctx context.Context, progress io.Writer) (*Results, error) {
	r := newResults(c)
	for round := range c.cfg.Rounds {
		holds := c.Holds(c.cfg.HandOffs)
		delay := c.Delays(1)[0]
		for _, sc := range []struct {
			name string
			run  func(impl int) error
		}{
			{"uncontended", func(impl int) error {
				d, err := c.Uncontended(ctx, impl)
				r.add(rowUncontended, impl, float64(d))
				return err
			}},
			{"hand-off", func(impl int) error {
				d, err := c.HandOffs(ctx, impl, holds)
				r.add(rowHandOff, impl, float64(d))
				return err
			}},
			{"hot key", func(impl int) error {
				rate, jain, err := c.HotKey(ctx, impl)
				r.add(rowHotRate, impl, rate)
				r.add(rowHotJain, impl, jain)
				return err
			}},
			{"grant order", func(impl int) error {
				n, err := c.GrantOrder(ctx, impl)
				r.add(rowOrder, impl, float64(n))
				return err
			}},
			{"holder killed", func(impl int) error {
				d, ok, err := c.HolderDies(ctx, impl, delay)
				v := float64(d)
				if !ok {
					v = math.Inf(1)
				}
				r.add(rowDies, impl, v)
				return err
			}},
		} {
			for _, impl := range c.order(round) {
				if err := sc.run(impl); err != nil {
					return nil, fmt.Errorf("%s, %s, round %d: %w", sc.name, c.e.Names[impl], round+1, err)
				}
			}
			if progress != nil {
				fmt.Fprintf(progress, "round %d/%d: %s\n", round+1, c.cfg.Rounds, sc.name)
			}
		}
	}
	return r, nil
}

// order returns the implementations rotated left by round.
func (c *Comparison) order(round int) []int {
	n := len(c.e.Names)
	o := make([]int, n)
	for i := range o {
		o[i] = (i + round) % n
	}
	return o
}
