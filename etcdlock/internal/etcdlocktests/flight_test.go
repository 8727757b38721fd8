package etcdlock_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"github.com/fairlock/fairlock/flight"
	"github.com/fairlock/fairlock/keylock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Package flight on etcd: the Locker is etcdlock's, the Store etcd
// itself (etcdStore, below), and the processes are worker processes (the
// test binary re-executed, process_test.go) of 250 concurrent requests
// each.

// etcdStore is a flight.Store on etcd: each entry is a JSON value under
// /cache/KEY, written in a transaction guarded by the grant's IsOwner,
// so that a grant that has ended (its lease expired, its key deleted)
// writes nothing. It keeps no expiry of its own (that would take a lease
// per entry): flight serves an entry only until its Expires.
type etcdStore[V any] struct{ c *clientv3.Client }

func (s etcdStore[V]) Get(ctx context.Context, key string) (e flight.Entry[V], ok bool, err error) {
	resp, err := s.c.Get(ctx, "/cache/"+key)
	if err != nil || len(resp.Kvs) == 0 {
		return e, false, err
	}
	err = json.Unmarshal(resp.Kvs[0].Value, &e)
	return e, err == nil, err
}

func (s etcdStore[V]) Set(ctx context.Context, key string, e flight.Entry[V], _ time.Duration, l keylock.Lease) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	tr, err := s.c.Txn(ctx).If(isOwner(l)).Then(clientv3.OpPut("/cache/"+key, string(b))).Commit()
	if err == nil && !tr.Succeeded {
		err = flight.ErrFenced
	}
	return err
}

func init() { roles["flight"] = flightWorker }

// incr adds 1 to the counter at k in etcd, atomically (a transaction on
// its mod revision, retried), and returns the new value.
func incr(ctx context.Context, c *clientv3.Client, k string) (int, error) {
	for {
		resp, err := c.Get(ctx, k)
		if err != nil {
			return 0, err
		}
		n, rev := 0, int64(0)
		if len(resp.Kvs) > 0 {
			n, _ = strconv.Atoi(string(resp.Kvs[0].Value))
			rev = resp.Kvs[0].ModRevision
		}
		tr, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).
			Then(clientv3.OpPut(k, strconv.Itoa(n+1))).Commit()
		if err != nil {
			return 0, err
		}
		if tr.Succeeded {
			return n + 1, nil
		}
	}
}

// awaitKey returns once k exists in etcd: a Get, then a watch from the
// revision after it, so that a put in between is not missed.
func awaitKey(ctx context.Context, c *clientv3.Client, k string) error {
	resp, err := c.Get(ctx, k)
	if err != nil || len(resp.Kvs) > 0 {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range c.Watch(ctx, k, clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil {
			return err
		}
		if len(wr.Events) > 0 {
			return nil
		}
	}
	return ctx.Err()
}

// flightWorker is a worker's "flight" role: it says "ready", waits for
// the parent's start signal (the key /go/KEY), then runs
// ETCDLOCK_TEST_REQUESTS concurrent Gets of key through a flight.Cache on
// its Locker and etcdStore, and says "got VALUE N" for each value its
// requests returned. Its fill increments /fills/KEY, says "filling N"
// (N: the fill's number over every process), and takes 200 ms, the
// expensive part; with ETCDLOCK_TEST_FLIGHT=kill, the first fill of all
// never returns, so that the parent can kill its process mid-fill.
func flightWorker(ctx context.Context, client *clientv3.Client, l *etcdlock.Locker, key string) error {
	requests, _ := strconv.Atoi(os.Getenv("ETCDLOCK_TEST_REQUESTS"))
	kill := os.Getenv("ETCDLOCK_TEST_FLIGHT") == "kill"
	id := os.Getenv("ETCDLOCK_TEST_ID")
	cache := flight.NewCache[string](l, etcdStore[string]{client}, time.Minute)
	var mu sync.Mutex // serialises stdout
	say := func(a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Println(a...)
	}
	fill := func(ctx context.Context, _ keylock.Lease) (string, error) {
		n, err := incr(ctx, client, "/fills/"+key)
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
	if err := awaitKey(ctx, client, "/go/"+key); err != nil {
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

// startFlight starts n "flight" workers on key (each with the given
// requests and env), writes an expired entry for key, and returns the
// workers and their outputs (see is called with each worker's index and
// each line it says but "ready"); once every worker is ready, it puts
// the start signal, so that they all start at once.
func startFlight(t *testing.T, srv *etcdtest.Server, c *clientv3.Client, n, requests int, key string, see func(int, string), env ...string) ([]*proc, []<-chan workerOutput) {
	t.Helper()
	ctx := context.Background()
	stale, _ := json.Marshal(flight.Entry[string]{Value: "stale", Expires: time.Now().Add(-time.Second)})
	if _, err := c.Put(ctx, "/cache/"+key, string(stale)); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{}, n)
	var ps []*proc
	var outs []<-chan workerOutput
	for i := range n {
		p := startWorker(t, "flight", srv.Endpoints(), append([]string{
			"ETCDLOCK_TEST_PREFIX=/flight", "ETCDLOCK_TEST_KEY=" + key,
			"ETCDLOCK_TEST_ID=" + strconv.Itoa(i), "ETCDLOCK_TEST_REQUESTS=" + strconv.Itoa(requests),
		}, env...)...)
		ps = append(ps, p)
		outs = append(outs, p.collect(func(line string) {
			if line == "ready" {
				ready <- struct{}{}
				return
			}
			see(i, line)
		}))
	}
	for range n {
		select {
		case <-ready:
		case <-time.After(60 * time.Second):
			t.Fatal("the workers did not all say ready within 60 s")
		}
	}
	if _, err := c.Put(ctx, "/go/"+key, "go"); err != nil {
		t.Fatal(err)
	}
	return ps, outs
}

// tally reads a worker's lines: the fills it said it started, and how
// many of its requests got each value.
func tally(t *testing.T, lines []string, fills *[]string, got map[string]int) {
	t.Helper()
	for _, line := range lines {
		f := strings.Fields(line)
		switch {
		case len(f) == 1 && f[0] == "ready": // seen by startFlight
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

// awaitOutput returns a worker's output, failing t if it has not exited
// within d.
func awaitOutput(t *testing.T, out <-chan workerOutput, d time.Duration) workerOutput {
	t.Helper()
	select {
	case o := <-out:
		return o
	case <-time.After(d):
		t.Fatalf("a worker still runs after %v", d)
	}
	return workerOutput{}
}

// fillCount returns the counter the workers' fills increment.
func fillCount(t *testing.T, c *clientv3.Client, key string) int {
	t.Helper()
	resp, err := c.Get(context.Background(), "/fills/"+key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the fill counter: %v %v", resp, err)
	}
	n, _ := strconv.Atoi(string(resp.Kvs[0].Value))
	return n
}

// TestFlightOneFillAcrossProcesses: 4 worker processes × 250 concurrent
// requests for one expired key cause exactly one fill; every request
// gets its value, and etcd holds it.
func TestFlightOneFillAcrossProcesses(t *testing.T) {
	srv := etcdtest.StartServer(t)
	c := srv.Client(t)
	const procs, requests = 4, 250
	_, outs := startFlight(t, srv, c, procs, requests, "hot", func(int, string) {})
	var fills []string
	got := map[string]int{}
	for i, out := range outs {
		o := awaitOutput(t, out, 60*time.Second)
		if o.err != nil {
			t.Fatalf("worker %d: %v; output %q", i, o.err, o.lines)
		}
		tally(t, o.lines, &fills, got)
	}
	if n := fillCount(t, c, "hot"); n != 1 || len(fills) != 1 {
		t.Errorf("%d fills counted in etcd, fills said %q; want exactly 1", n, fills)
	}
	if len(got) != 1 {
		t.Fatalf("values returned: %v, want one", got)
	}
	for v, k := range got {
		if k != procs*requests || !strings.HasPrefix(v, "value-1-") {
			t.Errorf("%d requests got %q, want all %d the first fill's", k, v, procs*requests)
		}
		stored, ok, err := etcdStore[string]{c}.Get(context.Background(), "hot")
		if err != nil || !ok || stored.Value != v {
			t.Errorf("etcd holds %+v (%v), want %q", stored, err, v)
		}
	}
	waitKeys(t, c, "/flight/", 0, 10*time.Second)
}

// TestFlightFillerKilled: the process that fills is killed with SIGKILL
// mid-fill; once its lease expires, exactly one other process fills, and
// every request of the three left gets that value.
func TestFlightFillerKilled(t *testing.T) {
	srv := etcdtest.StartServer(t)
	c := srv.Client(t)
	const procs, requests = 4, 250
	fillers := make(chan int, procs)
	ps, outs := startFlight(t, srv, c, procs, requests, "hot", func(i int, line string) {
		if line == "filling 1" {
			fillers <- i
		}
	}, "ETCDLOCK_TEST_FLIGHT=kill")
	var filler int
	select {
	case filler = <-fillers:
	case <-time.After(30 * time.Second):
		t.Fatal("no worker started a fill within 30 s")
	}
	if err := ps[filler].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var fills []string
	got := map[string]int{}
	for i, out := range outs {
		o := awaitOutput(t, out, 60*time.Second)
		if i == filler {
			continue
		}
		if o.err != nil {
			t.Fatalf("worker %d: %v; output %q", i, o.err, o.lines)
		}
		tally(t, o.lines, &fills, got)
	}
	t.Logf("the requests left were served %v after the filler was killed (TTL %v)", time.Since(killed), testTTL)
	if n := fillCount(t, c, "hot"); n != 2 || len(fills) != 1 || fills[0] != "2" {
		t.Errorf("%d fills counted in etcd, the survivors said %q; want the killed one and exactly one other", n, fills)
	}
	if len(got) != 1 {
		t.Fatalf("values returned: %v, want one", got)
	}
	for v, k := range got {
		if k != (procs-1)*requests || !strings.HasPrefix(v, "value-2-") {
			t.Errorf("%d requests got %q, want all %d the second fill's", k, v, (procs-1)*requests)
		}
	}
	waitKeys(t, c, "/flight/", 0, 10*time.Second)
}
