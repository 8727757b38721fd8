package pgcmp

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Comparison is a running comparison: a pool of the server, this
// process's locks, and three worker processes.
type Comparison struct {
	cfg   Config
	spec  workerSpec
	argv  []string
	pool  *pgxpool.Pool
	ls    *locks
	procs [3]*proc
	seq   int
	rng   *rand.Rand
}

// Start starts a comparison on the PostgreSQL server of dsn with cfg
// (zero fields take Defaults): it creates the rank counters' table
// (pgcmp_rank) and pglock's tables if missing, makes this process's
// locks and starts three workers by running argv (the program itself;
// see IsWorker). Close stops them.
func Start(dsn string, argv []string, cfg Config) (*Comparison, error) {
	cfg = cfg.withDefaults()
	pool, err := newPool(dsn, cfg)
	if err != nil {
		return nil, err
	}
	c := &Comparison{
		cfg:  cfg,
		spec: workerSpec{DSN: dsn, Config: cfg},
		argv: argv,
		pool: pool,
		rng:  rand.New(rand.NewPCG(1, 2)),
	}
	if _, err := pool.Exec(context.Background(), rankTable); err != nil {
		pool.Close()
		return nil, err
	}
	if c.ls, err = newLocks(pool, cfg); err != nil {
		pool.Close()
		return nil, err
	}
	for i := range c.procs {
		if c.procs[i], err = startProc(argv, c.spec); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Close stops the workers and closes the locks and the pool.
func (c *Comparison) Close() error {
	for _, p := range c.procs {
		if p != nil {
			p.stop()
		}
	}
	err := c.ls.close()
	c.pool.Close()
	return err
}

// Config returns the comparison's configuration, defaults filled in.
func (c *Comparison) Config() Config { return c.cfg }

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
// pair (the first prepares the statements on a connection).
func (c *Comparison) Uncontended(ctx context.Context, impl int) (time.Duration, error) {
	key := c.key("free")
	d := make([]time.Duration, c.cfg.Uncontended+1)
	for i := range d {
		start := time.Now()
		unlock, err := c.ls.lock(ctx, impl, key, nil)
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

// callsSQL counts pglock's calls on a key ($1) under Prefix.
const callsSQL = `SELECT count(*) FROM fairlock_calls WHERE prefix = '` + Prefix + `'::bytea AND key = convert_to($1, 'UTF8')`

// lockersSQL counts the sessions that hold or wait for an advisory lock
// ($1, a bigint: its high half is the classid, its low half the objid).
const lockersSQL = `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1
    AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid`

// awaitQueued returns once the call id of worker p on key waits: for
// pglock, once the key has n calls; for the blocking advisory lock, once
// n sessions hold or wait for it; for the polling loop, once the worker
// said "queued id" (its first try failed).
func (c *Comparison) awaitQueued(ctx context.Context, p *proc, impl int, key, id string, n int64) error {
	if impl == Polling {
		_, err := p.expect(c.answer(), is("queued", id))
		return err
	}
	deadline := time.Now().Add(c.answer())
	for {
		var got int64
		var err error
		if impl == PgLock {
			err = c.pool.QueryRow(ctx, callsSQL, key).Scan(&got)
		} else {
			err = c.pool.QueryRow(ctx, lockersSQL, advisoryKey(key)).Scan(&got)
		}
		if err != nil {
			return err
		}
		if got >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgcmp: %d of %d calls queued on %q", got, n, key)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// granted waits for worker p's answer to the wait call id and returns
// the time its Lock returned and the grant's rank; ok is false if the
// call gave up.
func (c *Comparison) granted(p *proc, id string) (at time.Time, rank int, ok bool, err error) {
	f, err := p.expect(c.answer(), func(f []string) bool {
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
		unlock, err := c.ls.lock(ctx, impl, key, nil)
		if err != nil {
			return 0, err
		}
		if err := p.send("wait", impl, key, "h"); err != nil {
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
			return 0, fmt.Errorf("pgcmp: %s: the waiter gave up", Names[impl])
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
		if err := p.send("hot", impl, key, c.cfg.HotG, start.UnixNano(), c.cfg.HotDuration.Nanoseconds()); err != nil {
			return 0, 0, err
		}
	}
	var counts []float64
	for _, p := range c.procs {
		f, err := p.expect(c.cfg.HotDuration+c.answer(), is("hot"))
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
	unlock, err := c.ls.lock(ctx, impl, key, nil)
	if err != nil {
		return 0, err
	}
	n := c.cfg.Waiters
	for i := range n {
		p, id := c.procs[i%3], "o"+strconv.Itoa(i)
		err := p.send("wait", impl, key, id)
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
			return 0, fmt.Errorf("pgcmp: %s: waiter %d gave up or has rank %d", Names[impl], i, rank)
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

// HolderDies starts a fifth process that locks a key and keeps its grant,
// queues a call of worker 0 on the key, waits the given delay (below a
// third of the TTL, so that the kill falls anywhere between two of
// pglock's renewals), kills the holder with SIGKILL, and returns the time
// from the kill to the waiter's grant; ok is false if the waiter gave up
// instead (within the bound). The kernel closes a killed process's
// connections, and PostgreSQL ends their sessions and their advisory
// locks with them; pglock's session expires by the server's clock.
func (c *Comparison) HolderDies(ctx context.Context, impl int, delay time.Duration) (d time.Duration, ok bool, err error) {
	key := c.key("dies")
	h, err := startProc(c.argv, c.spec)
	if err != nil {
		return 0, false, err
	}
	defer h.kill()
	if err := h.send("hold", impl, key); err != nil {
		return 0, false, err
	}
	if _, err := h.expect(c.answer(), is("held")); err != nil {
		return 0, false, err
	}
	p := c.procs[0]
	if err := p.send("wait", impl, key, "d"); err != nil {
		return 0, false, err
	}
	if err := c.awaitQueued(ctx, p, impl, key, "d", 2); err != nil {
		return 0, false, err
	}
	time.Sleep(delay)
	killed := time.Now()
	h.kill()
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
	var version string
	if err := c.pool.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return nil, err
	}
	r := newResults(c.cfg, "PostgreSQL "+version)
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
			for _, impl := range order(round) {
				if err := sc.run(impl); err != nil {
					return nil, fmt.Errorf("%s, %s, round %d: %w", sc.name, Names[impl], round+1, err)
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
func order(round int) []int {
	o := make([]int, numImpls)
	for i := range o {
		o[i] = (i + round) % numImpls
	}
	return o
}
