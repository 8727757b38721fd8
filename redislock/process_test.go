package redislock_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/flight"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// Tests across processes re-execute the test binary as workers
// (package disttest): TestMain sees a worker's environment and calls
// runWorker, which connects to the parent's redis-server
// (Worker.Server), makes a Locker on Worker.Prefix, does its role,
// reports on stdout one line per event, and exits. The tests every
// backend repeats are disttest's, run here on a Redis adapter
// (newBackend, TestDistributed).

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

// fencedStore is disttest's fenced store on Redis: key's log is the list
// log:KEY, appended to by fenceScript, which keeps the largest token it
// accepted in fence:KEY; counters are plain keys (INCRBY).
type fencedStore struct{ c redis.UniversalClient }

func (s fencedStore) Append(ctx context.Context, key string, token uint64, entry string) (bool, error) {
	n, err := fenceScript.Run(ctx, s.c, []string{"fence:" + key, "log:" + key}, strconv.FormatUint(token, 10), entry).Int()
	return n == 1, err
}

func (s fencedStore) Log(ctx context.Context, key string) ([]string, error) {
	return s.c.LRange(ctx, "log:"+key, 0, -1).Result()
}

func (s fencedStore) Add(ctx context.Context, name string, n int64) (int64, error) {
	return s.c.IncrBy(ctx, name, n).Result()
}

// runWorker runs a worker process's role and returns its exit code: the
// roles of package disttest, or those of roles.
func runWorker(w disttest.Worker) int {
	client := redis.NewClient(&redis.Options{Addr: w.Server})
	defer client.Close()
	l, err := redislock.New(client, w.Prefix, redislock.WithTTL(w.TTL))
	if err != nil {
		return w.Fail(err)
	}
	defer l.Close(context.Background())
	tools := disttest.Tools{Locker: l, Store: fencedStore{client}, Cache: redisStore[string]{client}}
	return w.Run(tools, func(ctx context.Context) error {
		run, ok := roles[w.Role]
		if !ok {
			return fmt.Errorf("unknown role %q", w.Role)
		}
		return run(ctx, client, l, w.Key)
	})
}

// roles are the worker roles that other test files add (in an init
// func), by name: each runs in a worker process with the worker's
// client, its Locker on the worker's prefix and key, and fails the
// worker with its error.
var roles = map[string]func(ctx context.Context, client *redis.Client, l *redislock.Locker, key string) error{}

// newBackend is the disttest adapter of srv: every Locker, store and
// cache on a client of its own; a key's calls are the entries of its
// queue; a process that stops is replaced within its TTL, one re-read
// period (TTL/3) and a margin for a loaded machine.
func newBackend(t testing.TB, srv *redistest.Server) disttest.Backend {
	admin := srv.NewClient(t)
	return disttest.Backend{
		Server: srv.Addr(),
		TTL:    testTTL,
		Expiry: testTTL + testTTL/3 + 2*time.Second,
		New: func(t testing.TB, prefix string) keylock.Locker {
			return newLocker(t, srv.NewClient(t), prefix)
		},
		Calls: func(t testing.TB, prefix, key string) int { return queueLen(t, admin, prefix, key) },
		Store: func(t testing.TB, _ string) disttest.Store { return fencedStore{srv.NewClient(t)} },
		Cache: func(t testing.TB) flight.Store[string] { return redisStore[string]{srv.NewClient(t)} },
		Observed: func(t testing.TB, prefix, name string, o fairlock.Observer) keylock.Locker {
			return newLocker(t, srv.NewClient(t), prefix, redislock.WithDebug(), redislock.WithName(name), redislock.WithObserver(o))
		},
		Named: func(t testing.TB, prefix, name string, debug bool) keylock.Locker {
			opts := []redislock.Option{redislock.WithName(name)}
			if debug {
				opts = append(opts, redislock.WithDebug())
			}
			return newLocker(t, srv.NewClient(t), prefix, opts...)
		},
		WorkerName: "redislock-1",
		Kind:       "redislock.Locker",
	}
}

// TestDistributed runs package disttest's checks, each on a server of
// its own: worker processes granted in FIFO order; a holder process
// killed, or stopped past its TTL (keylock.Valid false at once when it
// resumes, before its Lost closes); dead waiters that do not add up; one
// fill of a flight.Cache across processes, also with the filler killed;
// the debug views and the Observer.
func TestDistributed(t *testing.T) {
	disttest.Run(t, func(t *testing.T) disttest.Backend { return newBackend(t, redistest.StartServer(t)) })
}
