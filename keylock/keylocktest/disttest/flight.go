package disttest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/flight"
	"github.com/fairlock/fairlock/keylock"
)

// Package flight across processes: the Locker is the backend's, the
// Store the backend's engine itself (Backend.Cache), and the processes
// are workers of 250 concurrent requests each.

// flightRole is the role "flight": it says "ready", waits for the test's
// cue (Proc.Send), then runs Args["requests"] concurrent Gets of the key
// through a flight.Cache on its Locker and Tools.Cache, and says "got
// VALUE N" for each value its requests returned. Its fill adds 1 to the
// counter "fills:KEY" of the fenced store, says "filling N" (N: the
// fill's number over every process), and takes 200 ms, the expensive
// part; with Args["kill"] set, the first fill of all never returns, so
// that the test can kill its process mid-fill.
func (w Worker) flightRole(ctx context.Context, tools Tools) error {
	requests, _ := strconv.Atoi(w.Args["requests"])
	kill := w.Args["kill"] != ""
	cache := flight.NewCache[string](tools.Locker, tools.Cache, time.Minute)
	fill := func(ctx context.Context, _ keylock.Lease) (string, error) {
		n, err := tools.Store.Add(ctx, "fills:"+w.Key, 1)
		if err != nil {
			return "", err
		}
		w.Say("filling", n)
		if kill && n == 1 {
			select {} // until the test kills this process
		}
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return "", context.Cause(ctx)
		}
		return fmt.Sprintf("value-%d-of-worker-%s", n, w.Args["id"]), nil
	}
	w.Say("ready")
	if _, err := w.Cue(); err != nil {
		return err
	}
	var mu sync.Mutex // protects got and errs
	got := map[string]int{}
	var errs []error
	var wg sync.WaitGroup
	for range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			v, err := cache.Get(rctx, w.Key, fill)
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
		w.Say("got", v, n)
	}
	return errors.Join(errs...)
}

// flightPrefix is the prefix of the flight checks' Lockers.
const flightPrefix = "flight"

// startFlight writes an expired entry for key through b.Cache (under a
// grant of key, as a fill would), starts n "flight" workers on key (each
// with requests requests, kill set if it is not empty), and returns them
// and their outputs (see is called with each worker's index and each
// line it says but "ready"); once every worker is ready, it cues them
// all, so that they start at once.
func startFlight(t *testing.T, b Backend, n, requests int, key, kill string, see func(int, string)) ([]*Proc, []<-chan Output) {
	t.Helper()
	ctx := context.Background()
	g, err := b.New(t, flightPrefix).Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	stale := flight.Entry[string]{Value: "stale", Expires: time.Now().Add(-time.Second)}
	if err := b.Cache(t).Set(ctx, key, stale, time.Minute, g); err != nil {
		t.Fatal(err)
	}
	mustUnlock(t, g)
	ready := make(chan struct{}, n)
	var ps []*Proc
	var outs []<-chan Output
	for i := range n {
		p := b.start(t, "flight", flightPrefix, key, map[string]string{
			"id": strconv.Itoa(i), "requests": strconv.Itoa(requests), "kill": kill,
		})
		ps = append(ps, p)
		outs = append(outs, p.Collect(func(line string) {
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
	for _, p := range ps {
		p.Send(t, "go")
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
func awaitOutput(t *testing.T, out <-chan Output, d time.Duration) Output {
	t.Helper()
	select {
	case o := <-out:
		return o
	case <-time.After(d):
		t.Fatalf("a worker still runs after %v", d)
	}
	return Output{}
}

// fillCount returns the counter the workers' fills of key add to.
func fillCount(t *testing.T, s Store, key string) int64 {
	t.Helper()
	n, err := s.Add(context.Background(), "fills:"+key, 0)
	if err != nil {
		t.Fatalf("the fill counter: %v", err)
	}
	return n
}

// flightOneFill: 4 worker processes × 250 concurrent requests through
// flight.Cache for one expired key cause exactly one fill; every request
// gets its value, the store holds it, and no call is left on the key.
// It uses Backend.Cache.
func flightOneFill(t *testing.T, b Backend) {
	const procs, requests, key = 4, 250, "hot"
	_, outs := startFlight(t, b, procs, requests, key, "", func(int, string) {})
	var fills []string
	got := map[string]int{}
	for i, out := range outs {
		o := awaitOutput(t, out, 60*time.Second)
		if o.Err != nil {
			t.Fatalf("worker %d: %v; output %q", i, o.Err, o.Lines)
		}
		tally(t, o.Lines, &fills, got)
	}
	if n := fillCount(t, b.Store(t, flightPrefix), key); n != 1 || len(fills) != 1 {
		t.Errorf("%d fills counted in the store, fills said %q; want exactly 1", n, fills)
	}
	if len(got) != 1 {
		t.Fatalf("values returned: %v, want one", got)
	}
	for v, k := range got {
		if k != procs*requests || !strings.HasPrefix(v, "value-1-") {
			t.Errorf("%d requests got %q, want all %d the first fill's", k, v, procs*requests)
		}
		stored, ok, err := b.Cache(t).Get(context.Background(), key)
		if err != nil || !ok || stored.Value != v {
			t.Errorf("the store holds %+v (%v), want %q", stored, err, v)
		}
	}
	b.AwaitCalls(t, flightPrefix, key, 0, 10*time.Second)
}

// flightFillerKilled: the process that fills is killed with SIGKILL
// mid-fill; once its grant has ended, exactly one other process fills,
// and every request of the three left gets that value. It uses
// Backend.Cache.
func flightFillerKilled(t *testing.T, b Backend) {
	const procs, requests, key = 4, 250, "hot"
	fillers := make(chan int, procs)
	ps, outs := startFlight(t, b, procs, requests, key, "kill", func(i int, line string) {
		if line == "filling 1" {
			fillers <- i
		}
	})
	var filler int
	select {
	case filler = <-fillers:
	case <-time.After(30 * time.Second):
		t.Fatal("no worker started a fill within 30 s")
	}
	ps[filler].Kill(t)
	killed := time.Now()
	var fills []string
	got := map[string]int{}
	for i, out := range outs {
		o := awaitOutput(t, out, 60*time.Second)
		if i == filler {
			continue
		}
		if o.Err != nil {
			t.Fatalf("worker %d: %v; output %q", i, o.Err, o.Lines)
		}
		tally(t, o.Lines, &fills, got)
	}
	t.Logf("the requests left were served %v after the filler was killed (TTL %v)", time.Since(killed), b.TTL)
	if n := fillCount(t, b.Store(t, flightPrefix), key); n != 2 || len(fills) != 1 || fills[0] != "2" {
		t.Errorf("%d fills counted in the store, the survivors said %q; want the killed one and exactly one other", n, fills)
	}
	if len(got) != 1 {
		t.Fatalf("values returned: %v, want one", got)
	}
	for v, k := range got {
		if k != (procs-1)*requests || !strings.HasPrefix(v, "value-2-") {
			t.Errorf("%d requests got %q, want all %d the second fill's", k, v, (procs-1)*requests)
		}
	}
	b.AwaitCalls(t, flightPrefix, key, 0, 10*time.Second)
}
