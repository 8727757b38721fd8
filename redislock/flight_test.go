package redislock_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock/flight"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// Package flight on Redis: the Locker is redislock's, the Store Redis
// itself (redisStore, below), and the processes are worker processes
// (the test binary re-executed, process_test.go) of 250 concurrent
// requests each.

// redisStore is a flight.Store on Redis: each entry is a JSON string
// that expires with the TTL, and a write is fenced by a script that
// keeps the largest token it accepted per key (in a key of its own, in
// the entry's hash slot, so that the script runs on one node of a
// Cluster) and refuses a smaller one.
type redisStore[V any] struct{ rdb redis.UniversalClient }

var fencedSet = redis.NewScript(`
if tonumber(ARGV[1]) < tonumber(redis.call('GET', KEYS[2]) or '0') then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1`)

func (s redisStore[V]) Get(ctx context.Context, key string) (e flight.Entry[V], ok bool, err error) {
	b, err := s.rdb.Get(ctx, "cache:{"+key+"}").Bytes()
	if err == redis.Nil {
		return e, false, nil
	}
	if err == nil {
		err = json.Unmarshal(b, &e)
	}
	return e, err == nil, err
}

func (s redisStore[V]) Set(ctx context.Context, key string, e flight.Entry[V], ttl time.Duration, l keylock.Lease) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	keys := []string{"cache:{" + key + "}", "fence:{" + key + "}"}
	ok, err := fencedSet.Run(ctx, s.rdb, keys, l.Token(), b, max(ttl.Milliseconds(), 1)).Bool()
	if err == nil && !ok {
		err = flight.ErrFenced
	}
	return err
}

func init() { roles["flight"] = flightWorker }

// flightWorker is a worker's "flight" role: it says "ready", waits for
// the parent's start signal (an element of the list go:KEY), then runs
// REDISLOCK_TEST_REQUESTS concurrent Gets of key through a flight.Cache
// on its Locker and redisStore, and says "got VALUE N" for each value
// its requests returned. Its fill INCRs fills:KEY, says "filling N"
// (N: the fill's number over every process), and takes 200 ms, the
// expensive part; with REDISLOCK_TEST_FLIGHT=kill, the first fill of all
// never returns, so that the parent can kill its process mid-fill.
func flightWorker(ctx context.Context, client *redis.Client, l *redislock.Locker, key string) error {
	requests, _ := strconv.Atoi(os.Getenv("REDISLOCK_TEST_REQUESTS"))
	kill := os.Getenv("REDISLOCK_TEST_FLIGHT") == "kill"
	id := os.Getenv("REDISLOCK_TEST_ID")
	cache := flight.NewCache[string](l, redisStore[string]{client}, time.Minute)
	var mu sync.Mutex // serialises stdout
	say := func(a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Println(a...)
	}
	fill := func(ctx context.Context, lease keylock.Lease) (string, error) {
		n, err := client.Incr(ctx, "fills:"+key).Result()
		if err != nil {
			return "", err
		}
		say("filling", n)
		if kill && n == 1 {
			select {} // until the parent kills this process
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return "", context.Cause(ctx)
		}
		return fmt.Sprintf("value-%d-of-worker-%s", n, id), nil
	}
	say("ready")
	if err := client.BLPop(ctx, 0, "go:"+key).Err(); err != nil {
		return err
	}
	got := map[string]int{}
	var errs []error
	var wg sync.WaitGroup
	for range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			v, err := cache.Get(rctx, key, fill)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			got[v]++
		}()
	}
	wg.Wait()
	for v, n := range got {
		say("got", v, n)
	}
	return errors.Join(errs...)
}

// startFlight starts n "flight" workers on key (each with the given
// requests and env), writes an expired entry for key, waits for every
// worker's "ready" and starts them all at once; it returns the workers.
func startFlight(t *testing.T, srv *redistest.Server, c *redis.Client, n, requests int, key string, env ...string) []*proc {
	t.Helper()
	ctx := context.Background()
	stale, _ := json.Marshal(flight.Entry[string]{Value: "stale", Expires: time.Now().Add(-time.Second)})
	if err := c.Set(ctx, "cache:{"+key+"}", stale, 0).Err(); err != nil {
		t.Fatal(err)
	}
	var ps []*proc
	for i := range n {
		ps = append(ps, startWorker(t, "flight", srv.Addr(), "flight", key, append([]string{
			"REDISLOCK_TEST_ID=" + strconv.Itoa(i), "REDISLOCK_TEST_REQUESTS=" + strconv.Itoa(requests),
		}, env...)...))
	}
	for _, p := range ps {
		if line := p.line(t, 30*time.Second); line != "ready" {
			t.Fatalf("worker: %q, want ready", line)
		}
	}
	signals := make([]any, n)
	for i := range signals {
		signals[i] = 1
	}
	if err := c.RPush(ctx, "go:"+key, signals...).Err(); err != nil {
		t.Fatal(err)
	}
	return ps
}

// tally reads the workers' lines: the fills they said they started, and
// how many requests got each value.
func tally(t *testing.T, lines []string, fills *[]string, got map[string]int) {
	t.Helper()
	for _, line := range lines {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "filling":
			*fills = append(*fills, f[1])
		case len(f) == 3 && f[0] == "got":
			n, _ := strconv.Atoi(f[2])
			got[f[1]] += n
		default:
			t.Errorf("worker: %q", line)
		}
	}
}

// workerOutput is every line of a worker and its exit.
type workerOutput struct {
	lines []string
	err   error
}

// collect reads every line of the worker on a goroutine, calling see
// with each as it comes, and delivers them with the worker's exit on the
// channel it returns.
func (p *proc) collect(see func(string)) <-chan workerOutput {
	ch := make(chan workerOutput, 1)
	go func() {
		var o workerOutput
		for line := range p.lines {
			see(line)
			o.lines = append(o.lines, line)
		}
		o.err = <-p.done
		p.done <- o.err // for Cleanup
		ch <- o
	}()
	return ch
}

// TestFlightOneFillAcrossProcesses: 4 worker processes × 250 concurrent
// requests for one expired key cause exactly one fill; every request
// gets its value, and Redis holds it.
func TestFlightOneFillAcrossProcesses(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.NewClient(t)
	const procs, requests = 4, 250
	ps := startFlight(t, srv, c, procs, requests, "hot")
	var fills []string
	got := map[string]int{}
	for _, p := range ps {
		tally(t, p.wait(t, 60*time.Second), &fills, got)
	}
	n, err := c.Get(context.Background(), "fills:hot").Int()
	if err != nil || n != 1 || len(fills) != 1 {
		t.Errorf("%d fills counted in Redis (%v), fills said %q; want exactly 1", n, err, fills)
	}
	if len(got) != 1 {
		t.Fatalf("values returned: %v, want one", got)
	}
	for v, k := range got {
		if k != procs*requests || !strings.HasPrefix(v, "value-1-") {
			t.Errorf("%d requests got %q, want all %d the first fill's", k, v, procs*requests)
		}
		stored, ok, err := redisStore[string]{c}.Get(context.Background(), "hot")
		if err != nil || !ok || stored.Value != v {
			t.Errorf("Redis holds %+v (%v), want %q", stored, err, v)
		}
	}
}

// TestFlightFillerKilled: the process that fills is killed with SIGKILL
// mid-fill; once its session expires, exactly one other process fills,
// and every request of the three left gets that value.
func TestFlightFillerKilled(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.NewClient(t)
	const procs, requests = 4, 250
	ps := startFlight(t, srv, c, procs, requests, "hot", "REDISLOCK_TEST_FLIGHT=kill")
	// Each worker's lines are collected on a goroutine of its own; the
	// one that says "filling 1" is the filler.
	fillers := make(chan int, procs)
	outs := make([]<-chan workerOutput, procs)
	for i, p := range ps {
		outs[i] = p.collect(func(line string) {
			if line == "filling 1" {
				fillers <- i
			}
		})
	}
	filler := recvWithin(t, fillers, 30*time.Second, "no worker started a fill")
	if err := ps[filler].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var fills []string
	got := map[string]int{}
	for i, out := range outs {
		o := recvWithin(t, out, 60*time.Second, "a worker did not finish")
		if i == filler {
			continue
		}
		if o.err != nil {
			t.Fatalf("worker %d: %v; output %q", i, o.err, o.lines)
		}
		tally(t, o.lines, &fills, got)
	}
	t.Logf("the requests left were served %v after the filler was killed (TTL %v)", time.Since(killed), testTTL)
	n, err := c.Get(context.Background(), "fills:hot").Int()
	if err != nil || n != 2 || len(fills) != 1 || fills[0] != "2" {
		t.Errorf("%d fills counted in Redis (%v), the survivors said %q; want the killed one and exactly one other", n, err, fills)
	}
	if len(got) != 1 {
		t.Fatalf("values returned: %v, want one", got)
	}
	for v, k := range got {
		if k != (procs-1)*requests || !strings.HasPrefix(v, "value-2-") {
			t.Errorf("%d requests got %q, want all %d the second fill's", k, v, (procs-1)*requests)
		}
	}
}

// A flight.Cache on Redis: the Locker is redislock's, and the Store a
// dozen lines of go-redis (redisStore above): Get decodes a JSON entry,
// Set writes it with an expiry through a Lua script that refuses a
// token below the largest it accepted for the key. Every process that
// runs this code shares one fill per expired key.
func Example_flight() {
	dir, err := os.MkdirTemp("", "redislock-example-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	srv, err := redistest.NewServer(dir) // a program dials its own server instead
	if err != nil {
		log.Fatal(err)
	}
	defer srv.Stop()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	locks, err := redislock.New(rdb, "locks/pages")
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close(ctx)
	pages := flight.NewCache[string](locks, redisStore[string]{rdb}, time.Minute)

	render := func(ctx context.Context, l keylock.Lease) (string, error) {
		fmt.Println("rendering under a grant:", l.Token() != 0) // Set fences with its token
		return "<h1>home</h1>", nil
	}
	for range 2 {
		page, err := pages.Get(ctx, "/home", render)
		fmt.Println(page, err)
	}
	// Output:
	// rendering under a grant: true
	// <h1>home</h1> <nil>
	// <h1>home</h1> <nil>
}
