// Command hotkey is fairlock's main demo: an HTTP service on 127.0.0.1 that
// serialises work per order id, driven by an in-process load generator
// whose keys are Zipf-skewed so that a few orders are hot.
//
// It runs the same workload twice, once with a fairlock Locker and once
// with a naive map of sync.Mutex, and prints a side-by-side report: requests
// served, how evenly the hottest key was shared between clients (Jain's
// fairness index: 1 is perfectly even, 1/n is one client taking all), and
// the wait to get the lock (p50, p99, max). The default run is finite (a few
// seconds) and exits 0. With -serve the fairlock server stays up afterwards
// and serves the debug handler at /debug/fairlock/.
//
//	go run ./examples/hotkey
//	go run ./examples/hotkey -clients 128 -skew 1.5 -duration 5s
//	go run ./examples/hotkey -serve
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/fairlock/fairlock/debug"
	"github.com/fairlock/fairlock/fairlock"
)

type config struct {
	duration time.Duration // per implementation
	clients  int
	keys     int
	skew     float64
	steps    int
	hold     time.Duration
	serve    bool
}

func main() {
	var cfg config
	flag.DurationVar(&cfg.duration, "duration", 2*time.Second, "how long to drive each implementation")
	flag.IntVar(&cfg.clients, "clients", 64, "concurrent clients")
	flag.IntVar(&cfg.keys, "keys", 1000, "distinct order ids")
	flag.Float64Var(&cfg.skew, "skew", 2.0, "Zipf exponent s (> 1); larger makes the hot keys hotter")
	flag.IntVar(&cfg.steps, "steps", 8, "locked steps per request")
	flag.DurationVar(&cfg.hold, "hold", 50*time.Microsecond, "CPU work per locked step")
	flag.BoolVar(&cfg.serve, "serve", false, "keep the fairlock server (and /debug/fairlock/) up after the report, until interrupted")
	flag.Parse()
	if cfg.skew <= 1 || cfg.clients < 1 || cfg.keys < 1 || cfg.duration <= 0 {
		fmt.Fprintln(os.Stderr, "hotkey: need -skew > 1, -clients >= 1, -keys >= 1, -duration > 0")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

// keyedLock is what the order service needs from a keyed lock.
type keyedLock interface {
	lock(ctx context.Context, key string) (unlock func(), err error)
}

type fairKeyed struct{ l *fairlock.Locker[string] }

func (f fairKeyed) lock(ctx context.Context, key string) (func(), error) {
	g, err := f.l.Lock(ctx, key)
	return g.Unlock, err
}

// naiveKeyed is the hand-rolled design fairlock replaces: a map of
// sync.Mutex behind a global mutex. (It also never deletes its entries.)
type naiveKeyed struct {
	mu sync.Mutex
	m  map[string]*sync.Mutex
}

func (n *naiveKeyed) lock(_ context.Context, key string) (func(), error) {
	n.mu.Lock()
	m, ok := n.m[key]
	if !ok {
		m = new(sync.Mutex)
		n.m[key] = m
	}
	n.mu.Unlock()
	m.Lock()
	return m.Unlock, nil
}

// orderService handles POST /orders/{id}: steps times it locks the order,
// works for hold and unlocks; it reports the longest of those lock waits in
// the X-Lock-Wait header and their sum in X-Lock-Wait-Total (nanoseconds).
func orderService(kl keyedLock, steps int, hold time.Duration) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		// A request is several short steps on its order (validate, reserve,
		// charge, …), each under the order's lock: the pattern where a
		// barging mutex lets the running request take the lock back again
		// and again while parked requests wait.
		var total, longest time.Duration
		for range steps {
			start := time.Now()
			unlock, err := kl.lock(r.Context(), r.PathValue("id"))
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			wait := time.Since(start)
			total += wait
			longest = max(longest, wait)
			spin(hold)
			unlock()
		}
		w.Header().Set("X-Lock-Wait", strconv.FormatInt(int64(longest), 10))
		w.Header().Set("X-Lock-Wait-Total", strconv.FormatInt(int64(total), 10))
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// spin busy-works for d: a critical section that uses the CPU, as real
// order processing would, rather than parking the goroutine.
func spin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

// stats is what one implementation's run measured.
type stats struct {
	served  int
	failed  int
	waits   []time.Duration
	hotJain float64 // Jain's index of per-client grants on the hottest key
	hotReqs int
	elapsed time.Duration
}

func run(ctx context.Context, cfg config, out io.Writer) error {
	locker := fairlock.New[string](fairlock.WithName("orders"), fairlock.WithDebug(), fairlock.WithLongHeld(250*time.Millisecond))
	fairURL, stopFair, err := startServer(fairKeyed{locker}, cfg.steps, cfg.hold)
	if err != nil {
		return err
	}
	defer stopFair()
	naiveURL, stopNaive, err := startServer(&naiveKeyed{m: make(map[string]*sync.Mutex)}, cfg.steps, cfg.hold)
	if err != nil {
		return err
	}

	fmt.Fprintf(out, "fairlock hotkey demo: %d clients, %d order ids (Zipf s=%.2f), %d locked steps of %v per request, %v per implementation\n",
		cfg.clients, cfg.keys, cfg.skew, cfg.steps, cfg.hold, cfg.duration)
	fmt.Fprintf(out, "fairlock server on %s, naive server on %s\n\n", fairURL, naiveURL)

	var dump strings.Builder
	fs := drive(ctx, cfg, fairURL, func() { _ = debug.Dump(&dump) })
	ns := drive(ctx, cfg, naiveURL, nil)
	stopNaive()
	report(out, cfg, fs, ns)
	fmt.Fprintf(out, "\nfairlock keys held after the run: %d (entries exist only while held or awaited)\n", locker.Len())
	fmt.Fprintf(out, "\ndebug.Dump taken mid-run under load (first 25 lines):\n")
	lines := strings.Split(strings.TrimRight(dump.String(), "\n"), "\n")
	for i, line := range lines {
		if i == 25 {
			fmt.Fprintf(out, "  … %d more lines\n", len(lines)-25)
			break
		}
		fmt.Fprintf(out, "  %s\n", line)
	}
	if cfg.serve && ctx.Err() == nil {
		loadDone := make(chan struct{})
		go func() { // a little steady load, so the debug page has something to show
			defer close(loadDone)
			for ctx.Err() == nil {
				drive(ctx, config{duration: time.Second, clients: 8, keys: cfg.keys, skew: cfg.skew}, fairURL, nil)
			}
		}()
		fmt.Fprintf(out, "\nserving POST %s/orders/{id} and %s/debug/fairlock/ until interrupted\n", fairURL, fairURL)
		<-ctx.Done()
		<-loadDone
	}
	return locker.Close(context.Background())
}

// startServer serves kl's order service (and the fairlock debug handler)
// on a random loopback port.
func startServer(kl keyedLock, steps int, hold time.Duration) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/orders/", orderService(kl, steps, hold))
	mux.Handle("/debug/fairlock/", debug.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
			<-done
		})
	}
	return "http://" + ln.Addr().String(), stop, nil
}

// drive runs cfg.clients closed-loop clients against base for
// cfg.duration. midway, if not nil, runs once halfway through.
func drive(ctx context.Context, cfg config, base string, midway func()) stats {
	ctx, cancel := context.WithTimeout(ctx, cfg.duration)
	defer cancel()
	tr := &http.Transport{MaxIdleConnsPerHost: cfg.clients, MaxConnsPerHost: cfg.clients}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	hot := "order-0" // rank 0 is the most frequent under Zipf

	type clientStats struct {
		served, failed, hot int
		waits               []time.Duration
	}
	per := make([]clientStats, cfg.clients)
	var wg sync.WaitGroup
	start := time.Now()
	for c := range cfg.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(c) + 1))
			zipf := rand.NewZipf(rng, cfg.skew, 1, uint64(cfg.keys-1))
			cs := &per[c]
			for ctx.Err() == nil {
				key := "order-" + strconv.FormatUint(zipf.Uint64(), 10)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/orders/"+key, nil)
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						cs.failed++
					}
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusNoContent {
					cs.failed++
					continue
				}
				ns, _ := strconv.ParseInt(resp.Header.Get("X-Lock-Wait"), 10, 64)
				cs.served++
				cs.waits = append(cs.waits, time.Duration(ns))
				if key == hot {
					cs.hot++
				}
			}
		}()
	}
	if midway != nil {
		select {
		case <-time.After(cfg.duration / 2):
			midway()
		case <-ctx.Done():
		}
	}
	wg.Wait()
	var st stats
	st.elapsed = time.Since(start)
	hotCounts := make([]float64, cfg.clients)
	for i, cs := range per {
		st.served += cs.served
		st.failed += cs.failed
		st.waits = append(st.waits, cs.waits...)
		st.hotReqs += cs.hot
		hotCounts[i] = float64(cs.hot)
	}
	st.hotJain = jain(hotCounts)
	slices.Sort(st.waits)
	return st
}

// jain is Jain's fairness index (Σx)² / (n·Σx²): 1 when every client got
// the same share, 1/n when one got everything.
func jain(xs []float64) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return math.NaN()
	}
	return sum * sum / (float64(len(xs)) * sq)
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

func report(out io.Writer, cfg config, f, n stats) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, a, b any) { fmt.Fprintf(tw, "%s\t%v\t%v\t\n", name, a, b) }
	row("", "fairlock", "sync.Mutex map")
	row("requests served", f.served, n.served)
	row("requests failed", f.failed, n.failed)
	row("throughput (req/s)", rate(f), rate(n))
	row(`hot key "order-0" requests`, f.hotReqs, n.hotReqs)
	row("hot key share, Jain index (1 = even)", fmt.Sprintf("%.3f", f.hotJain), fmt.Sprintf("%.3f", n.hotJain))
	row("longest lock wait per request, p50", round(quantile(f.waits, 0.50)), round(quantile(n.waits, 0.50)))
	row("p99", round(quantile(f.waits, 0.99)), round(quantile(n.waits, 0.99)))
	row("max", round(quantile(f.waits, 1)), round(quantile(n.waits, 1)))
	tw.Flush()
	fp99, np99 := quantile(f.waits, 0.99), quantile(n.waits, 0.99)
	fmax, nmax := quantile(f.waits, 1), quantile(n.waits, 1)
	if fp99 > 0 && fmax > 0 {
		fmt.Fprintf(out, "\nfairlock's waits vs the sync.Mutex map's: p99 %.2f×, max %.2f× (below 1: a shorter tail). "+
			"Strict FIFO makes every request wait its turn, which can raise the median, and keeps any request from waiting behind repeated barging.\n",
			float64(fp99)/float64(max(np99, 1)), float64(fmax)/float64(max(nmax, 1)))
	}
}

func rate(s stats) string {
	return fmt.Sprintf("%.0f", float64(s.served)/s.elapsed.Seconds())
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d >= time.Microsecond:
		return d.Round(100 * time.Nanosecond)
	}
	return d
}
