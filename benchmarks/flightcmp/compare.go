package flightcmp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/fairlock/fairlock/benchmarks/internal/proccmp"
	"github.com/fairlock/fairlock/flight"
	"github.com/redis/go-redis/v9"
)

// Comparison is a running comparison: a client of the server and the
// worker processes.
type Comparison struct {
	cfg   Config
	rdb   *redis.Client
	procs []*proccmp.Proc
	seq   int
}

// Start starts a comparison on the Redis server at addr with cfg (zero
// fields take Defaults): it starts cfg.Procs workers by running argv (the
// program itself; see IsWorker). Close stops them.
func Start(addr string, argv []string, cfg Config) (*Comparison, error) {
	cfg = cfg.withDefaults()
	c := &Comparison{cfg: cfg, rdb: redis.NewClient(&redis.Options{Addr: addr})}
	for range cfg.Procs {
		p, err := proccmp.StartProc("flightcmp", argv, workerEnv, workerSpec{Addr: addr, Config: cfg})
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
		p.Stop()
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
		if err := p.Send("run", impl, key); err != nil {
			return 0, nil, err
		}
	}
	for _, p := range c.procs {
		if _, err := expect(p, "armed", key); err != nil {
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
		f, err := expect(p, "lat", key)
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

// expect returns the fields after "what key" of the worker's next such
// line; an "error" line or the worker's exit is an error, and so is
// nothing within answer.
func expect(p *proccmp.Proc, what, key string) ([]string, error) {
	f, err := p.Expect(answer, proccmp.Is(what, key))
	if err != nil {
		return nil, err
	}
	return f[2:], nil
}
