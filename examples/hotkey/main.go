// Command hotkey is fairlock's main demo: an HTTP service on 127.0.0.1 that
// serialises work per order id, driven by an in-process load generator
// whose keys are Zipf-skewed so that a few orders are hot.
//
// Each request takes its order's lock several times in a row, one short
// step each (validate, reserve, charge, …). The demo drives the same
// workload against a fairlock Locker and against the map of sync.Mutex a
// service would write by hand, in a few short rounds that alternate which
// goes first. It prints each figure as the median over the rounds with the
// smallest and largest, fairlock's ratio to the map, and a verdict that
// names what fairlock bought and what it cost in every round: throughput,
// the hot order's lock waits, and how often a lock call on the hot order
// was overtaken by one that began after it. A figure whose rounds fall on
// both sides of 1× is reported as the same within the run's spread, so
// the verdict does not flip from run to run. With -serve the fairlock server stays up
// afterwards and serves the debug handler at /debug/fairlock/.
//
//	go run ./examples/hotkey
//	go run ./examples/hotkey -rounds 5 -duration 2s
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
	duration time.Duration // per implementation and round
	rounds   int
	clients  int
	keys     int
	skew     float64
	steps    int
	hold     time.Duration
	serve    bool
}

func main() {
	var cfg config
	flag.DurationVar(&cfg.duration, "duration", 700*time.Millisecond, "how long to drive each implementation in each round")
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds; each figure is the median over them, with the smallest and largest")
	flag.IntVar(&cfg.clients, "clients", 64, "concurrent clients")
	flag.IntVar(&cfg.keys, "keys", 1000, "distinct order ids")
	flag.Float64Var(&cfg.skew, "skew", 2.0, "Zipf exponent s (> 1); larger makes the hot keys hotter")
	flag.IntVar(&cfg.steps, "steps", 8, "locked steps per request")
	flag.DurationVar(&cfg.hold, "hold", 50*time.Microsecond, "CPU work per locked step")
	flag.BoolVar(&cfg.serve, "serve", false, "keep the fairlock server (and /debug/fairlock/) up after the report, until interrupted")
	flag.Parse()
	if cfg.skew <= 1 || cfg.clients < 1 || cfg.keys < 1 || cfg.steps < 1 || cfg.rounds < 1 || cfg.duration <= 0 {
		fmt.Fprintln(os.Stderr, "hotkey: need -skew > 1, -clients, -keys, -steps and -rounds >= 1, -duration > 0")
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

// hotOrder is the order id the clients draw most often: rank 0 of the
// Zipf distribution.
const hotOrder = "order-0"

// service is one order service: POST /orders/{id} runs steps locked
// steps on the order, each holding its lock for hold. It records when each
// lock call on hotOrder began, in the order the calls were granted, and
// counts the requests it is handling, so that a round can wait for the
// last one before reading the record.
type service struct {
	kl    keyedLock
	steps int
	hold  time.Duration

	mu     sync.Mutex // guards the fields below
	idle   sync.Cond  // signalled when active drops to 0; L is &mu
	active int        // requests being handled
	since  time.Time  // the round's start: calls that began before it are not recorded
	starts []time.Time
}

func newService(kl keyedLock, steps int, hold time.Duration) *service {
	s := &service{kl: kl, steps: steps, hold: hold}
	s.idle.L = &s.mu
	return s
}

func (s *service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.active++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.active--; s.active == 0 {
			s.idle.Broadcast()
		}
		s.mu.Unlock()
	}()
	id := r.PathValue("id")
	// Each step unlocks and locks again at once. sync.Mutex lets the
	// request that just unlocked, still running, take the lock straight
	// back ahead of the requests parked on it, until one of those has
	// waited 1ms and switches it to handing the lock over in order (its
	// starvation mode, sync/mutex.go). fairlock queues the step behind
	// every call already waiting.
	var total time.Duration
	for range s.steps {
		start := time.Now()
		unlock, err := s.kl.lock(r.Context(), id)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		total += time.Since(start)
		if id == hotOrder {
			s.granted(start)
		}
		spin(s.hold)
		unlock()
		if r.Context().Err() != nil {
			return // the client has gone: stop, as a real handler would
		}
	}
	w.Header().Set("X-Lock-Wait", strconv.FormatInt(int64(total), 10))
	w.WriteHeader(http.StatusNoContent)
}

// granted records a call on hotOrder that began at start and now holds
// the order's lock. The caller holds that lock, so the calls are recorded
// in the order they were granted.
func (s *service) granted(start time.Time) {
	s.mu.Lock()
	if !start.Before(s.since) {
		s.starts = append(s.starts, start)
	}
	s.mu.Unlock()
}

// startRound clears the record and starts a new one.
func (s *service) startRound() {
	s.mu.Lock()
	s.since, s.starts = time.Now(), nil
	s.mu.Unlock()
}

// endRound waits until no request is being handled and returns when each
// recorded call began, in the order they were granted.
func (s *service) endRound() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.active > 0 {
		s.idle.Wait()
	}
	return s.starts
}

// spin busy-works for d: a critical section that uses the CPU, as real
// order processing would, rather than parking the goroutine.
func spin(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

// stats is what one implementation's round measured.
type stats struct {
	served  int
	failed  int
	elapsed time.Duration
	waits   []time.Duration // each served hotOrder request's lock wait, all steps, sorted
	// calls is the number of lock calls on hotOrder; overtaken counts
	// those granted after a call that began later, and most is the
	// largest number of such later calls granted ahead of one call.
	calls, overtaken, most int
}

func (s stats) throughput() float64 { return float64(s.served) / s.elapsed.Seconds() }

func run(ctx context.Context, cfg config, out io.Writer) error {
	locker := fairlock.New[string](fairlock.WithName("orders"), fairlock.WithDebug(), fairlock.WithLongHeld(250*time.Millisecond))
	fairSvc := newService(fairKeyed{locker}, cfg.steps, cfg.hold)
	naiveSvc := newService(&naiveKeyed{m: make(map[string]*sync.Mutex)}, cfg.steps, cfg.hold)
	fairURL, stopFair, err := startServer(fairSvc)
	if err != nil {
		return err
	}
	defer stopFair()
	naiveURL, stopNaive, err := startServer(naiveSvc)
	if err != nil {
		return err
	}
	defer stopNaive()

	fmt.Fprintf(out, "fairlock hotkey demo: %d clients, %d order ids (Zipf s=%.2f, %q the hottest), %d locked steps of %v per request\n",
		cfg.clients, cfg.keys, cfg.skew, hotOrder, cfg.steps, cfg.hold)
	fmt.Fprintf(out, "%d rounds of %v per implementation, alternating which goes first; fairlock on %s, sync.Mutex map on %s\n\n",
		cfg.rounds, cfg.duration, fairURL, naiveURL)

	var dump strings.Builder
	var fair, naive []stats
	for r := 0; r < cfg.rounds && ctx.Err() == nil; r++ {
		var midway func()
		if r == 0 {
			midway = func() { _ = debug.Dump(&dump) }
		}
		driveFair := func() { fair = append(fair, drive(ctx, cfg, fairURL, fairSvc, midway)) }
		driveNaive := func() { naive = append(naive, drive(ctx, cfg, naiveURL, naiveSvc, nil)) }
		if r%2 == 0 {
			driveFair()
			driveNaive()
		} else {
			driveNaive()
			driveFair()
		}
	}
	stopNaive()
	report(out, fair, naive)
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
				drive(ctx, config{duration: time.Second, clients: 8, keys: cfg.keys, skew: cfg.skew}, fairURL, fairSvc, nil)
			}
		}()
		fmt.Fprintf(out, "\nserving POST %s/orders/{id} and %s/debug/fairlock/ until interrupted\n", fairURL, fairURL)
		<-ctx.Done()
		<-loadDone
	}
	return locker.Close(context.Background())
}

// startServer serves svc at /orders/{id} (and the fairlock debug handler)
// on a random loopback port.
func startServer(svc *service) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}", svc)
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

// drive runs cfg.clients closed-loop clients against base, served by svc,
// for cfg.duration. midway, if not nil, runs once halfway through.
func drive(ctx context.Context, cfg config, base string, svc *service, midway func()) stats {
	svc.startRound()
	ctx, cancel := context.WithTimeout(ctx, cfg.duration)
	defer cancel()
	tr := &http.Transport{MaxIdleConnsPerHost: cfg.clients, MaxConnsPerHost: cfg.clients}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	type clientStats struct {
		served, failed int
		waits          []time.Duration
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
				cs.served++
				if key == hotOrder {
					ns, _ := strconv.ParseInt(resp.Header.Get("X-Lock-Wait"), 10, 64)
					cs.waits = append(cs.waits, time.Duration(ns))
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
	st := stats{elapsed: time.Since(start)}
	for _, cs := range per {
		st.served += cs.served
		st.failed += cs.failed
		st.waits = append(st.waits, cs.waits...)
	}
	slices.Sort(st.waits)
	starts := svc.endRound()
	st.calls = len(starts)
	st.overtaken, st.most = overtakes(starts)
	return st
}

// overtakes reads the start times of lock calls listed in the order they
// were granted. It returns how many calls were granted after some call
// that began later, and the largest number of later-begun calls granted
// ahead of a single call. It ranks the start times and counts, for each
// call, the calls granted before it that began no later, in a Fenwick
// tree: O(n log n).
func overtakes(starts []time.Time) (overtaken, most int) {
	n := len(starts)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return starts[a].Compare(starts[b]) })
	rank := make([]int, n) // 1-based; equal start times share the highest rank of their run
	for i := n - 1; i >= 0; i-- {
		if i < n-1 && starts[order[i]].Equal(starts[order[i+1]]) {
			rank[order[i]] = rank[order[i+1]]
		} else {
			rank[order[i]] = i + 1
		}
	}
	tree := make([]int, n+1)
	for i := range n {
		notLater := 0
		for j := rank[i]; j > 0; j -= j & -j {
			notLater += tree[j]
		}
		if later := i - notLater; later > 0 {
			overtaken++
			most = max(most, later)
		}
		for j := rank[i]; j <= n; j += j & -j {
			tree[j]++
		}
	}
	return overtaken, most
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// figure is one row of the report.
type figure struct {
	name   string
	of     func(stats) float64
	format func(float64) string
	// higherIsBetter: a larger figure is a gain (throughput); otherwise a
	// smaller one is.
	higherIsBetter bool
	// phrase names the figure in the verdict, after its ratio; a figure
	// without one is a count, printed without a ratio.
	phrase string
}

var (
	throughput = figure{"throughput (req/s)", stats.throughput, fmtRate, true, "the throughput"}
	p50        = figure{fmt.Sprintf("%s lock wait per request, p50", hotOrder), durOf(0.5), fmtDur, false, "the median " + hotOrder + " wait"}
	p99        = figure{"p99", durOf(0.99), fmtDur, false, "the p99 wait"}
	pMax       = figure{"max", durOf(1), fmtDur, false, "the longest wait"}
	overtaken  = figure{fmt.Sprintf("%s lock calls overtaken by a later call", hotOrder), func(s stats) float64 {
		return float64(s.overtaken) / math.Max(float64(s.calls), 1)
	}, fmtShare, false, ""}
	mostAhead = figure{"most later calls granted ahead of one call", func(s stats) float64 { return float64(s.most) }, fmtRate, false, ""}
	figures   = []figure{throughput, p50, p99, pMax, overtaken, mostAhead}
)

func durOf(q float64) func(stats) float64 {
	return func(s stats) float64 { return float64(quantile(s.waits, q)) }
}

// spread is a figure over the rounds: median, smallest, largest.
type spread struct{ med, lo, hi float64 }

func spreadOf(xs []float64) spread {
	xs = slices.Clone(xs)
	slices.Sort(xs)
	n := len(xs)
	med := xs[n/2]
	if n%2 == 0 {
		med = (xs[n/2-1] + xs[n/2]) / 2
	}
	return spread{med, xs[0], xs[n-1]}
}

func (s spread) format(f func(float64) string) string {
	if f(s.lo) == f(s.hi) {
		return f(s.med)
	}
	return fmt.Sprintf("%s (%s–%s)", f(s.med), f(s.lo), f(s.hi))
}

// of is fig over the rounds.
func (fig figure) over(ss []stats) spread {
	xs := make([]float64, len(ss))
	for i, s := range ss {
		xs[i] = fig.of(s)
	}
	return spreadOf(xs)
}

// ratio is fairlock's fig ÷ the map's, round by round, over the rounds; ok
// is false if the map's figure was 0 in a round.
func (fig figure) ratio(fair, naive []stats) (spread, bool) {
	xs := make([]float64, len(fair))
	for i := range fair {
		d := fig.of(naive[i])
		if d == 0 {
			return spread{}, false
		}
		xs[i] = fig.of(fair[i]) / d
	}
	return spreadOf(xs), true
}

func report(out io.Writer, fair, naive []stats) {
	n := min(len(fair), len(naive))
	fair, naive = fair[:n], naive[:n]
	if n == 0 {
		fmt.Fprintln(out, "interrupted before a round ended: nothing to report")
		return
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t") }
	total := func(ss []stats, f func(stats) int) string {
		t := 0
		for _, s := range ss {
			t += f(s)
		}
		return strconv.Itoa(t)
	}
	row("", "fairlock", "sync.Mutex map", "fairlock ÷ map")
	row("requests served", total(fair, func(s stats) int { return s.served }), total(naive, func(s stats) int { return s.served }), "")
	row("requests failed", total(fair, func(s stats) int { return s.failed }), total(naive, func(s stats) int { return s.failed }), "")
	for _, fig := range figures {
		r := ""
		if sp, ok := fig.ratio(fair, naive); ok && fig.phrase != "" {
			r = sp.format(fmtRatio)
		}
		row(fig.name, fig.over(fair).format(fig.format), fig.over(naive).format(fig.format), r)
	}
	tw.Flush()
	fmt.Fprintf(out, "\n%s\n", verdict(fair, naive))
	fmt.Fprintf(out, "Why: fairlock queues each step behind every call already waiting; sync.Mutex lets the request that holds the lock take it straight back, which is faster for that request and slower for the ones it overtakes.\n")
	fmt.Fprintf(out, "A call is overtaken when one that began after it is granted first; under fairlock only a call held up between reading the clock and joining the queue can be.\n")
	fmt.Fprintf(out, "Each figure is the median of %d rounds, the smallest and largest beside it, and each ratio the median of the rounds' ratios: one round alone is noisy, its tail most of all. The verdict names a gain or a cost only where every round agrees.\n", n)
}

// verdict names what fairlock bought and what it cost in this run, judged
// round by round, so that it does not flip between runs of the same
// program: a figure is a gain only if fairlock's was better than the
// map's by more than 2% in every round, a cost only if it was worse by
// more than 2% in every round, and otherwise the same within this run's
// spread (its round-by-round ratios straddle 1×, or stay within 2% of
// it). docs/performance.md reads its own tables by the same rule: ranges
// that overlap do not tell the locks apart. Overtaken calls are compared
// the same way, round by round. What holds in every round (no call
// overtaken, the tail) comes first.
func verdict(fair, naive []stats) string {
	var costs, gains, same []string
	for _, fig := range []figure{throughput, p50, p99, pMax} {
		sp, ok := fig.ratio(fair, naive)
		if !ok {
			continue
		}
		text := sp.format(fmtRatio) + " " + fig.phrase
		better, worse := sp.hi < 0.98, sp.lo > 1.02 // every round, as for a wait
		if fig.higherIsBetter {
			better, worse = sp.lo > 1.02, sp.hi < 0.98
		}
		switch {
		case better:
			gains = append(gains, text)
		case worse:
			costs = append(costs, text)
		default:
			same = append(same, text)
		}
	}
	fewer, more := true, true // fairlock's share overtaken below (above) the map's in every round
	for i := range fair {
		f, m := overtaken.of(fair[i]), overtaken.of(naive[i])
		fewer = fewer && f < m
		more = more && f > m
	}
	order := fmt.Sprintf("%s of %s lock calls overtaken by a later call, against %s",
		overtaken.over(fair).format(fmtShare), hotOrder, overtaken.over(naive).format(fmtShare))
	switch {
	case fewer:
		gains = append([]string{order}, gains...)
	case more:
		costs = append([]string{order}, costs...)
	default:
		same = append([]string{order}, same...)
	}
	v := "verdict: in every round, fairlock bought " + list(gains, "nothing") + "; in every round, it cost " + list(costs, "nothing")
	if len(same) > 0 {
		v += "; the same within this run's spread (its rounds fall on both sides, or within 2%): " + list(same, "")
	}
	return v + "."
}

// list joins items as English does: "a", "a and b", "a, b and c".
func list(items []string, none string) string {
	switch len(items) {
	case 0:
		return none
	case 1:
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

func fmtRatio(x float64) string {
	switch {
	case x == 0:
		return "0×"
	case x < 0.01:
		return "<0.01×"
	case x >= 100:
		return fmt.Sprintf("%.0f×", x)
	case x >= 10:
		return fmt.Sprintf("%.1f×", x)
	}
	return fmt.Sprintf("%.2f×", x)
}

func fmtRate(x float64) string { return fmt.Sprintf("%.0f", x) }

func fmtShare(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }

func fmtDur(ns float64) string {
	d := time.Duration(ns)
	switch {
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	case d >= time.Microsecond:
		return d.Round(100 * time.Nanosecond).String()
	}
	return d.String()
}
