// Command hotkey is fairlock's main demo: an HTTP order service whose
// clients give up after a deadline, driven through a burst on one hot
// order, once with a fairlock Locker and once with the map of sync.Mutex
// a service would write by hand.
//
// Each POST /orders/{id} takes the order's lock and updates the order,
// which holds the lock for a few milliseconds (a write to the order's
// store). The update runs to its end once begun, as a write should: an
// order is never left half-updated because a client left. Clients give
// up after a deadline (-deadline), which closes their connection and
// ends the request's context. The load is open-loop, as a service's is:
// requests keep arriving at their rate whatever the service's latency,
// and during the burst the hot order gets more than it can serve.
//
// fairlock's Lock takes the request's context, so a request whose client
// has given up leaves the order's queue at once and never updates the
// order. sync.Mutex has no way to stop waiting: the request waits its
// turn, then does the update nobody will read, while the requests behind
// it wait for that too. A map handler that checks r.Context() after
// mu.Lock() skips such updates (it still cannot leave the queue, so it
// waits for its turn and hands the lock on): -check-ctx runs the map
// with that handler instead.
//
// Both get the same requests at the same instants, in a few rounds that
// alternate which goes first. The demo prints each figure as the median
// over the rounds with the smallest and largest, fairlock's ratio to the
// map, and a verdict that names a gain or a cost only where every round
// agrees: a figure whose rounds fall on both sides of 1× is reported as
// the same within the run's spread, so the verdict does not flip from
// run to run. With -serve the fairlock server stays up afterwards and
// serves the debug handler at /debug/fairlock/.
//
//	go run ./examples/hotkey
//	go run ./examples/hotkey -rounds 5 -duration 2s
//	go run ./examples/hotkey -serve
package main

import (
	"context"
	"errors"
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
	duration time.Duration // of each round's load, per implementation
	rounds   int
	deadline time.Duration // a client gives up this long after sending
	work     time.Duration // how long an update holds its order's lock
	rate     float64       // requests per second on the hot order, outside the burst
	burst    float64       // the hot order's rate during the burst, × rate
	cold     float64       // requests per second over the other orders
	keys     int           // orders, the hot one included
	checkCtx bool          // the map's handler checks the context after mu.Lock
	serve    bool
}

func main() {
	var cfg config
	flag.DurationVar(&cfg.duration, "duration", 1200*time.Millisecond, "how long the load runs against each implementation in each round")
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds; each figure is the median over them, with the smallest and largest")
	flag.DurationVar(&cfg.deadline, "deadline", 100*time.Millisecond, "client timeout: a client gives up on its request this long after sending it")
	flag.DurationVar(&cfg.work, "work", 4*time.Millisecond, "how long an update holds its order's lock")
	flag.Float64Var(&cfg.rate, "rate", 125, "requests per second on the hot order outside the burst")
	flag.Float64Var(&cfg.burst, "burst", 4, "the hot order's rate during the burst (the second quarter of each round), × -rate")
	flag.Float64Var(&cfg.cold, "cold", 250, "requests per second spread over the other orders")
	flag.IntVar(&cfg.keys, "keys", 1000, "order ids, the hot one included")
	flag.BoolVar(&cfg.checkCtx, "check-ctx", false, "the sync.Mutex map's handler checks r.Context() after mu.Lock() and skips the update if the client has gone")
	flag.BoolVar(&cfg.serve, "serve", false, "keep the fairlock server (and /debug/fairlock/) up after the report, until interrupted")
	flag.Parse()
	if err := cfg.check(); err != nil {
		fmt.Fprintln(os.Stderr, "hotkey:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func (cfg config) check() error {
	if cfg.duration <= 0 || cfg.rounds < 1 || cfg.deadline <= 0 || cfg.work <= 0 ||
		cfg.rate <= 0 || cfg.burst < 1 || cfg.cold < 0 || cfg.keys < 2 {
		return errors.New("need -duration, -deadline, -work and -rate > 0, -rounds >= 1, -burst >= 1, -cold >= 0, -keys >= 2")
	}
	return nil
}

// keyedLock is what the order service needs from a keyed lock.
type keyedLock interface {
	lock(ctx context.Context, key string) (unlock func(), err error)
}

type fairKeyed struct{ l *fairlock.Locker[string] }

// lock waits for key in FIFO order until ctx ends.
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

// lock waits for key until it is granted: sync.Mutex cannot stop waiting,
// so ctx is not read.
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

// hotOrder is the order id that gets the burst.
const hotOrder = "order-0"

// service is one order service: POST /orders/{id} takes the order's lock
// and updates the order. It records every lock call's wait, the updates
// it made and those made for a client that had already gone, and when
// each lock call on hotOrder began, in the order the calls were granted.
// It counts the requests it is handling, so that a round can wait for
// the last one before reading the record.
type service struct {
	kl       keyedLock
	work     time.Duration
	checkCtx bool // after lock, skip the update if the client has gone

	mu      sync.Mutex // guards the fields below
	idle    sync.Cond  // signalled when active drops to 0; L is &mu
	active  int        // requests being handled
	since   time.Time  // the round's start: calls that began before it are not recorded
	waits   []time.Duration
	updates int // updates made
	wasted  int // of which for a client that had gone before the update ended
	starts  []time.Time
}

func newService(kl keyedLock, work time.Duration, checkCtx bool) *service {
	s := &service{kl: kl, work: work, checkCtx: checkCtx}
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
	// r.Context() ends when the client gives up and closes its connection.
	ctx, id := r.Context(), r.PathValue("id")
	start := time.Now()
	unlock, err := s.kl.lock(ctx, id)
	c := call{start: start, waited: time.Since(start), hot: id == hotOrder, granted: err == nil}
	if err != nil {
		s.record(c)
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer unlock()
	if s.checkCtx && ctx.Err() != nil {
		s.record(c)
		http.Error(w, "client gone", http.StatusServiceUnavailable)
		return
	}
	update(s.work)
	c.updated, c.wasted = true, ctx.Err() != nil
	s.record(c) // still holding the lock: hot calls are recorded in grant order
	w.WriteHeader(http.StatusNoContent)
}

// update is the work under the order's lock: a write to the order's
// store, which waits for the store for d. It runs to its end once begun,
// whatever the client does, so that no order is left half-updated.
func update(d time.Duration) { time.Sleep(d) }

// call is one lock call as the service saw it.
type call struct {
	start   time.Time
	waited  time.Duration // from the call until it was granted or gave up
	hot     bool          // on hotOrder
	granted bool
	updated bool // the update ran
	wasted  bool // … and the client had gone by the time it ended
}

// record adds c to the round's record. A granted call on hotOrder is
// recorded while it holds the lock, so those calls are recorded in the
// order they were granted.
func (s *service) record(c call) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.start.Before(s.since) {
		return
	}
	s.waits = append(s.waits, c.waited)
	if c.granted && c.hot {
		s.starts = append(s.starts, c.start)
	}
	if c.updated {
		s.updates++
	}
	if c.wasted {
		s.wasted++
	}
}

// startRound clears the record and starts a new one.
func (s *service) startRound() {
	s.mu.Lock()
	s.since, s.waits, s.starts, s.updates, s.wasted = time.Now(), nil, nil, 0, 0
	s.mu.Unlock()
}

// roundRecord is what the service recorded over one round.
type roundRecord struct {
	waits           []time.Duration // every lock call's, sorted
	updates, wasted int
	starts          []time.Time // hotOrder's granted calls, in grant order
}

// endRound waits until no request is being handled and returns the
// round's record.
func (s *service) endRound() roundRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.active > 0 {
		s.idle.Wait()
	}
	slices.Sort(s.waits)
	return roundRecord{s.waits, s.updates, s.wasted, s.starts}
}

// arrival is one request of a round's schedule.
type arrival struct {
	at  time.Duration // after the round's start
	key string
}

// schedule returns a round's requests: Poisson arrivals on hotOrder at
// cfg.rate, cfg.rate×cfg.burst during the round's second quarter, and
// on the other orders, drawn uniformly, at cfg.cold. The same seed gives
// the same schedule, so that both implementations get the same requests
// at the same instants.
func schedule(cfg config, seed int64) []arrival {
	rng := rand.New(rand.NewSource(seed))
	var as []arrival
	from, to := cfg.duration/4, cfg.duration/2
	for t := time.Duration(0); ; {
		rate := cfg.rate
		if t >= from && t < to {
			rate *= cfg.burst
		}
		t += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		if t >= cfg.duration {
			break
		}
		as = append(as, arrival{t, hotOrder})
	}
	if cfg.cold > 0 {
		for t := time.Duration(0); ; {
			t += time.Duration(rng.ExpFloat64() / cfg.cold * float64(time.Second))
			if t >= cfg.duration {
				break
			}
			as = append(as, arrival{t, "order-" + strconv.Itoa(1+rng.Intn(cfg.keys-1))})
		}
	}
	slices.SortFunc(as, func(a, b arrival) int { return int(a.at - b.at) })
	return as
}

// stats is what one implementation's round measured.
type stats struct {
	sent, answered       int
	hotSent, hotAnswered int             // of which on hotOrder
	latencies            []time.Duration // of the requests answered within the deadline, sorted
	roundRecord
	// overtaken counts the granted lock calls on hotOrder granted after a
	// call that began later, and most is the largest number of such later
	// calls granted ahead of one call.
	overtaken, most int
}

func run(ctx context.Context, cfg config, out io.Writer) error {
	locker := fairlock.New[string](fairlock.WithName("orders"), fairlock.WithDebug(), fairlock.WithLongHeld(250*time.Millisecond))
	fairSvc := newService(fairKeyed{locker}, cfg.work, false)
	naiveSvc := newService(&naiveKeyed{m: make(map[string]*sync.Mutex)}, cfg.work, cfg.checkCtx)
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

	handler := "updates the order whatever the client did meanwhile"
	if cfg.checkCtx {
		handler = "checks r.Context() after mu.Lock() and skips the update if the client has gone"
	}
	fmt.Fprintf(out, "fairlock hotkey demo: an order service; each request takes its order's lock and updates the order (%v under the lock).\n", cfg.work)
	fmt.Fprintf(out, "Clients give up after %v. %q gets %.0f requests/s, %.0f/s during a burst (the second quarter of each round): %.1f× what it can serve; %.0f requests/s go to %d other orders.\n",
		cfg.deadline, hotOrder, cfg.rate, cfg.rate*cfg.burst, cfg.rate*cfg.burst*cfg.work.Seconds(), cfg.cold, cfg.keys-1)
	fmt.Fprintf(out, "fairlock's Lock takes the request's context and leaves the queue when the client gives up; the sync.Mutex map's handler waits its turn, then %s.\n", handler)
	fmt.Fprintf(out, "%d rounds of %v per implementation, the same requests at the same instants, alternating which goes first; fairlock on %s, sync.Mutex map on %s\n\n",
		cfg.rounds, cfg.duration, fairURL, naiveURL)

	var dump strings.Builder
	var fair, naive []stats
	for r := 0; r < cfg.rounds && ctx.Err() == nil; r++ {
		as := schedule(cfg, int64(r)+1)
		var midway func()
		if r == 0 {
			midway = func() { _ = debug.Dump(&dump) }
		}
		driveFair := func() { fair = append(fair, drive(ctx, cfg, as, fairURL, fairSvc, midway)) }
		driveNaive := func() { naive = append(naive, drive(ctx, cfg, as, naiveURL, naiveSvc, nil)) }
		if r%2 == 0 {
			driveFair()
			driveNaive()
		} else {
			driveNaive()
			driveFair()
		}
	}
	stopNaive()
	report(out, cfg, fair, naive)
	fmt.Fprintf(out, "\nfairlock keys held after the run: %d (entries exist only while held or awaited)\n", locker.Len())
	fmt.Fprintf(out, "\ndebug.Dump taken during the first burst (first 12 lines):\n")
	lines := strings.Split(strings.TrimRight(dump.String(), "\n"), "\n")
	for i, line := range lines {
		if i == 12 {
			fmt.Fprintf(out, "  … %d more lines\n", len(lines)-12)
			break
		}
		fmt.Fprintf(out, "  %s\n", line)
	}
	if cfg.serve && ctx.Err() == nil {
		loadDone := make(chan struct{})
		go func() { // a little steady load, so the debug page has something to show
			defer close(loadDone)
			light := cfg
			light.duration, light.burst = time.Second, 1
			for r := int64(0); ctx.Err() == nil; r++ {
				drive(ctx, light, schedule(light, r), fairURL, fairSvc, nil)
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

// drive sends the requests of as to base, served by svc, each at its
// instant and each given up cfg.deadline after it was sent, then waits
// for svc to finish every request. midway, if not nil, runs once during
// the burst.
func drive(ctx context.Context, cfg config, as []arrival, base string, svc *service, midway func()) stats {
	svc.startRound()
	tr := &http.Transport{MaxIdleConnsPerHost: 1000}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	var mu sync.Mutex // guards st
	st := stats{}
	var wg sync.WaitGroup
	start := time.Now()
	midAt := cfg.duration * 3 / 8
	for _, a := range as {
		if d := time.Until(start.Add(a.at)); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		if midway != nil && a.at >= midAt {
			wg.Add(1)
			go func(f func()) { defer wg.Done(); f() }(midway)
			midway = nil
		}
		st.sent++
		hot := a.key == hotOrder
		if hot {
			st.hotSent++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, cfg.deadline)
			defer cancel()
			sent := time.Now()
			req, _ := http.NewRequestWithContext(rctx, http.MethodPost, base+"/orders/"+a.key, nil)
			resp, err := client.Do(req)
			if err != nil {
				return // given up
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			took := time.Since(sent)
			if resp.StatusCode == http.StatusNoContent && took <= cfg.deadline {
				mu.Lock()
				st.answered++
				if hot {
					st.hotAnswered++
				}
				st.latencies = append(st.latencies, took)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	st.roundRecord = svc.endRound()
	slices.Sort(st.latencies)
	st.overtaken, st.most = overtakes(st.starts)
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
	// higherIsBetter: a larger figure is a gain (requests answered);
	// otherwise a smaller one is.
	higherIsBetter bool
	// noun, for a share, names what it is a share of in the verdict
	// ("22.0% of NOUN, against 3.0%"); phrase, for any other figure,
	// names it after its ratio ("0.50× PHRASE"). A figure with neither is
	// printed in the table only.
	noun, phrase string
	ratio        bool // the table shows fairlock's ratio to the map
}

var (
	answered = figure{name: "requests answered within the deadline", of: func(s stats) float64 {
		return float64(s.answered) / math.Max(float64(s.sent), 1)
	}, format: fmtShare, higherIsBetter: true, noun: "requests answered within their deadline", ratio: true}
	hotAnswered = figure{name: hotOrder + " requests answered within the deadline", of: func(s stats) float64 {
		return float64(s.hotAnswered) / math.Max(float64(s.hotSent), 1)
	}, format: fmtShare, higherIsBetter: true, noun: hotOrder + " requests answered within their deadline", ratio: true}
	p50 = figure{name: "time to answer them, p50", of: latencyOf(0.5), format: fmtDur, phrase: "the median time to answer", ratio: true}
	p99 = figure{name: "p99", of: latencyOf(0.99), format: fmtDur, phrase: "the p99 time to answer", ratio: true}
	// longest is the server's: a call that cannot stop waiting waits past
	// its client's deadline.
	longest = figure{name: "longest lock wait of any request", of: func(s stats) float64 { return float64(quantile(s.waits, 1)) },
		format: fmtDur, phrase: "the longest lock wait of any request", ratio: true}
	wasted = figure{name: "updates made for a client that had gone", of: func(s stats) float64 {
		return float64(s.wasted) / math.Max(float64(s.updates), 1)
	}, format: fmtShare, noun: "updates made for a client that had gone"}
	overtaken = figure{name: fmt.Sprintf("%s lock grants overtaken by a later call", hotOrder), of: func(s stats) float64 {
		return float64(s.overtaken) / math.Max(float64(len(s.starts)), 1)
	}, format: fmtShare, noun: hotOrder + " lock grants overtaken by a later call"}
	mostAhead = figure{name: "most later calls granted ahead of one call", of: func(s stats) float64 { return float64(s.most) }, format: fmtRate}
	figures   = []figure{answered, hotAnswered, p50, p99, longest, wasted, overtaken, mostAhead}
	// judged are the figures the verdict weighs, in this order.
	judged = []figure{hotAnswered, answered, wasted, longest, p50, p99, overtaken}
)

func latencyOf(q float64) func(stats) float64 {
	return func(s stats) float64 { return float64(quantile(s.latencies, q)) }
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

// over is fig over the rounds.
func (fig figure) over(ss []stats) spread {
	xs := make([]float64, len(ss))
	for i, s := range ss {
		xs[i] = fig.of(s)
	}
	return spreadOf(xs)
}

// ratios is fairlock's fig ÷ the map's, round by round, over the rounds;
// ok is false if the map's figure was 0 in a round.
func (fig figure) ratios(fair, naive []stats) (spread, bool) {
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

// margin is how far apart fairlock's figure and the map's must be, as a
// fraction of the map's, for a round to count as a gain or a cost.
const margin = 0.02

// judge reports whether fig was better for fairlock than for the map in
// every round (gain), worse in every round (cost), or neither.
func (fig figure) judge(fair, naive []stats) (gain, cost bool) {
	gain, cost = true, true
	for i := range fair {
		f, m := fig.of(fair[i]), fig.of(naive[i])
		if fig.higherIsBetter {
			f, m = -f, -m
		}
		// f < m is better, by more than the margin of |m|.
		gain = gain && f < m-margin*math.Abs(m)
		cost = cost && f > m+margin*math.Abs(m)
	}
	return gain, cost
}

// text is how the verdict names fig: its ratio and what it is of, and for
// a share the two medians ("1.94× the requests answered within their
// deadline (61.6% against 31.7%)"), or for a share without a ratio the
// two shares ("0.0% of NOUN, against 3.0%").
func (fig figure) text(fair, naive []stats) string {
	f, m := fig.over(fair), fig.over(naive)
	sp, ok := fig.ratios(fair, naive)
	switch {
	case fig.noun == "":
		return sp.format(fmtRatio) + " " + fig.phrase
	case ok && fig.ratio:
		return fmt.Sprintf("%s the %s (%s against %s)", sp.format(fmtRatio), fig.noun, fig.format(f.med), fig.format(m.med))
	}
	return fmt.Sprintf("%s of %s, against %s", f.format(fig.format), fig.noun, m.format(fig.format))
}

func report(out io.Writer, cfg config, fair, naive []stats) {
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
	row("requests sent", total(fair, func(s stats) int { return s.sent }), total(naive, func(s stats) int { return s.sent }), "")
	row(hotOrder+" requests sent", total(fair, func(s stats) int { return s.hotSent }), total(naive, func(s stats) int { return s.hotSent }), "")
	for _, fig := range figures {
		r := ""
		if sp, ok := fig.ratios(fair, naive); ok && fig.ratio {
			r = sp.format(fmtRatio)
		}
		row(fig.name, fig.over(fair).format(fig.format), fig.over(naive).format(fig.format), r)
	}
	tw.Flush()
	fmt.Fprintf(out, "\n%s\n", verdict(fair, naive))
	fmt.Fprintf(out, "Why: once the burst outran the hot order, every request that waited longer than %v was already lost. fairlock's waiter left the queue then; a sync.Mutex waiter stays queued, ", cfg.deadline)
	if cfg.checkCtx {
		fmt.Fprintf(out, "and when its turn comes the handler sees its client gone and unlocks: the requests behind it wait for that hand-off, not for an update.\n")
	} else {
		fmt.Fprintf(out, "and when its turn comes it makes the update its client no longer waits for, so the requests behind it wait for that update too and time out in their turn. A map handler that checks r.Context() after mu.Lock() skips such updates: -check-ctx runs the map with it.\n")
	}
	fmt.Fprintf(out, "A call is overtaken when one that began after it is granted first; under fairlock only a call held up between reading the clock and joining the queue can be.\n")
	fmt.Fprintf(out, "Each figure is the median of %d rounds, the smallest and largest beside it, and each ratio the median of the rounds' ratios: one round alone is noisy, its tail most of all. The verdict names a gain or a cost only where every round agrees.\n", n)
}

// verdict names what fairlock bought and what it cost in this run, judged
// round by round, so that it does not flip between runs of the same
// program: a figure is a gain only if fairlock's was better than the
// map's by more than 2% in every round, a cost only if it was worse by
// more than 2% in every round, and otherwise the same within this run's
// spread (its rounds fall on both sides, or within 2%).
// docs/performance.md reads its own tables by the same rule: ranges that
// overlap do not tell the locks apart.
func verdict(fair, naive []stats) string {
	var costs, gains, same []string
	for _, fig := range judged {
		if _, ok := fig.ratios(fair, naive); !ok && fig.noun == "" {
			continue // no ratio to name it by
		}
		text := fig.text(fair, naive)
		switch gain, cost := fig.judge(fair, naive); {
		case gain:
			gains = append(gains, text)
		case cost:
			costs = append(costs, text)
		default:
			same = append(same, text)
		}
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
