// Package flightcmp measures package flight's Cache beside
// golang.org/x/sync/singleflight on a cache stampede across processes:
// one key expires while four processes each have 250 concurrent requests
// for it, on one real redis-server. flight collapses each process's
// requests and lets one process fill while the others Wait for its
// release (redislock) and read Redis; singleflight collapses each
// process's requests and nothing more, so every process fills. Each
// figure is taken in interleaved rounds (every round measures both, in an
// order rotated by the round); cmd/flight-compare prints the table and
// the package's Go benchmark runs the same measurement.
//
// The worker processes are the program re-executed (IsWorker, RunWorker),
// as in package rediscmp.
package flightcmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fairlock/fairlock/benchmarks/internal/proccmp"
	"github.com/fairlock/fairlock/flight"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/redislock"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"
)

// The implementations, in the order of the table's columns; an index
// into Names is an implementation.
const (
	Flight = iota
	Singleflight
	numImpls
)

// Names are the implementations' names, the table's column heads.
var Names = [numImpls]string{"flight", "x/sync/singleflight"}

// Prefix is redislock's prefix in every process of a comparison.
const Prefix = "flightcmp"

// Config sets what a comparison measures. The zero value of a field
// means its default (Defaults).
type Config struct {
	Rounds   int           // interleaved rounds
	Expiries int           // expiries per implementation and round: each a key of its own, expired when the requests start
	Procs    int           // worker processes
	Requests int           // concurrent requests per process and expiry
	Fill     time.Duration // how long a fill runs: the expensive computation a cache saves
	TTL      time.Duration // redislock's session TTL
}

// Defaults is the configuration of a full run of cmd/flight-compare.
var Defaults = Config{
	Rounds:   5,
	Expiries: 10,
	Procs:    4,
	Requests: 250,
	Fill:     50 * time.Millisecond,
	TTL:      5 * time.Second,
}

// Quick is a short run, for a smoke test (cmd/flight-compare -quick, the
// package's tests and benchmark): one round of two expiries each.
var Quick = Config{Rounds: 1, Expiries: 2, Fill: 20 * time.Millisecond}

// withDefaults returns c with its zero fields set from Defaults.
func (c Config) withDefaults() Config {
	d := Defaults
	if c.Rounds == 0 {
		c.Rounds = d.Rounds
	}
	if c.Expiries == 0 {
		c.Expiries = d.Expiries
	}
	if c.Procs == 0 {
		c.Procs = d.Procs
	}
	if c.Requests == 0 {
		c.Requests = d.Requests
	}
	if c.Fill == 0 {
		c.Fill = d.Fill
	}
	if c.TTL == 0 {
		c.TTL = d.TTL
	}
	return c
}

// valueTTL is how long a filled value stays fresh: longer than a run, so
// that each expiry is one fill per process at most.
const valueTTL = time.Hour

// cacheKey and fenceKey are where the store keeps key's entry and the
// largest token it accepted for key, in one hash slot.
func cacheKey(key string) string { return "flightcmp:cache:{" + key + "}" }
func fenceKey(key string) string { return "flightcmp:fence:{" + key + "}" }

// fillsKey counts the fills of key over every process.
func fillsKey(key string) string { return "flightcmp:fills:" + key }

// goKey is the list the parent pushes one element per worker on to
// start an expiry's requests.
func goKey(key string) string { return "flightcmp:go:" + key }

// store is a flight.Store on Redis: JSON entries with an expiry, written
// by a Lua script that refuses a token below the largest it accepted.
type store struct{ rdb redis.UniversalClient }

var fencedSet = redis.NewScript(`
if tonumber(ARGV[1]) < tonumber(redis.call('GET', KEYS[2]) or '0') then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1`)

func (s store) Get(ctx context.Context, key string) (e flight.Entry[string], ok bool, err error) {
	b, err := s.rdb.Get(ctx, cacheKey(key)).Bytes()
	if err == redis.Nil {
		return e, false, nil
	}
	if err == nil {
		err = json.Unmarshal(b, &e)
	}
	return e, err == nil, err
}

func (s store) Set(ctx context.Context, key string, e flight.Entry[string], ttl time.Duration, l keylock.Lease) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	ok, err := fencedSet.Run(ctx, s.rdb, []string{cacheKey(key), fenceKey(key)}, l.Token(), b, max(ttl.Milliseconds(), 1)).Bool()
	if err == nil && !ok {
		err = flight.ErrFenced
	}
	return err
}

// setUnfenced is the write of the singleflight side, which has no grant:
// a plain SET with the expiry.
func (s store) setUnfenced(ctx context.Context, key string, e flight.Entry[string], ttl time.Duration) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return s.rdb.Set(ctx, cacheKey(key), b, ttl).Err()
}

// The workers of a comparison: the program re-executed with workerEnv
// set to the JSON of a workerSpec (proccmp.StartProc). A worker reads one command a line on
// stdin and answers on stdout:
//
//	run IMPL KEY   "armed KEY", then, once the parent has pushed its
//	               start signal (BLPOP of goKey), Requests concurrent
//	               requests for KEY through IMPL, and "lat KEY L1 … LN",
//	               each request's latency in ns (from its call to its
//	               return), in no order
//
// and "error MESSAGE" for a command that failed. It exits when stdin
// closes.
const workerEnv = "FLIGHTCMP_WORKER"

// workerSpec is what a worker is told through workerEnv.
type workerSpec struct {
	Addr   string
	Config Config
}

// IsWorker reports whether this process was started as a worker of a
// comparison; the program's main (or TestMain) then calls RunWorker and
// exits with its result.
func IsWorker() bool { return proccmp.IsWorker(workerEnv) }

// RunWorker runs a worker process (IsWorker) until its stdin closes, and
// returns its exit code.
func RunWorker() int {
	var spec workerSpec
	if err := proccmp.ReadSpec(workerEnv, &spec); err != nil {
		fmt.Fprintln(os.Stderr, "flightcmp worker:", err)
		return 2
	}
	rdb := redis.NewClient(&redis.Options{Addr: spec.Addr})
	defer rdb.Close()
	locker, err := redislock.New(rdb, Prefix, redislock.WithTTL(spec.Config.TTL))
	if err != nil {
		fmt.Fprintln(os.Stderr, "flightcmp worker:", err)
		return 1
	}
	defer locker.Close(context.Background())
	w := &worker{cfg: spec.Config, rdb: rdb, store: store{rdb}}
	w.cache = flight.NewCache[string](locker, w.store, valueTTL)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) != 3 || f[0] != "run" {
			fmt.Println("error bad command", strconv.Quote(in.Text()))
			continue
		}
		impl, _ := strconv.Atoi(f[1])
		if err := w.run(impl, f[2]); err != nil {
			fmt.Println("error", strings.ReplaceAll(err.Error(), "\n", "; "))
		}
	}
	return 0
}

// worker is a worker process's state.
type worker struct {
	cfg   Config
	rdb   *redis.Client
	store store
	cache *flight.Cache[string]
	sf    singleflight.Group
}

// fill is the expensive computation: it counts itself in Redis and takes
// cfg.Fill.
func (w *worker) fill(ctx context.Context, key string) (string, error) {
	if err := w.rdb.Incr(ctx, fillsKey(key)).Err(); err != nil {
		return "", err
	}
	select {
	case <-time.After(w.cfg.Fill):
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return "value of " + key, nil
}

// get is one request for key through impl.
func (w *worker) get(ctx context.Context, impl int, key string) (string, error) {
	if impl == Flight {
		return w.cache.Get(ctx, key, func(ctx context.Context, _ keylock.Lease) (string, error) {
			return w.fill(ctx, key)
		})
	}
	// singleflight: read Redis; if the value is missing or expired, fill
	// and write it. Collapsed in this process only.
	v, err, _ := w.sf.Do(key, func() (any, error) {
		e, ok, err := w.store.Get(ctx, key)
		if err != nil {
			return "", err
		}
		if ok && time.Now().Before(e.Expires) {
			return e.Value, nil
		}
		start := time.Now()
		v, err := w.fill(ctx, key)
		if err != nil {
			return "", err
		}
		end := time.Now()
		e = flight.Entry[string]{Value: v, Expires: end.Round(0).Add(valueTTL), Delta: end.Sub(start)}
		return v, w.store.setUnfenced(ctx, key, e, valueTTL)
	})
	s, _ := v.(string)
	return s, err
}

// run answers "run IMPL KEY".
func (w *worker) run(impl int, key string) error {
	if impl < 0 || impl >= numImpls {
		return fmt.Errorf("no implementation %d", impl)
	}
	ctx := context.Background()
	fmt.Println("armed", key)
	if err := w.rdb.BLPop(ctx, 0, goKey(key)).Err(); err != nil {
		return err
	}
	lat := make([]time.Duration, w.cfg.Requests)
	errs := make([]error, w.cfg.Requests)
	var wg sync.WaitGroup
	for i := range lat {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			start := time.Now()
			v, err := w.get(rctx, impl, key)
			lat[i] = time.Since(start)
			if err == nil && v != "value of "+key {
				err = fmt.Errorf("request for %s got %q", key, v)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	var b strings.Builder
	b.WriteString("lat " + key)
	for _, d := range lat {
		b.WriteString(" " + strconv.FormatInt(int64(d), 10))
	}
	fmt.Println(b.String())
	return nil
}
