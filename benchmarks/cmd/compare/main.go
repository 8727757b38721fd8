// Command compare runs every benchmark scenario against fairlock and its
// peers in one process and prints, for each scenario and implementation,
// the median figure over interleaved rounds with its range, and fairlock's
// ratio to each peer. Scenarios 1 to 7 compare fairlock's exclusive Lock
// with the keyed locks of benchmarks.Impls; 8 to 11 compare its RLock and
// its Semaphore with the peers of benchmarks.ModePeers. It writes two PNG
// plots: the hot-key wait distribution as a CCDF and throughput against
// goroutines.
//
//	cd benchmarks && go run ./cmd/compare              # 5 rounds of 500ms runs
//	cd benchmarks && go run ./cmd/compare -quick       # 2 rounds of 100ms runs (CI)
//	cd benchmarks && go run ./cmd/compare -markdown    # the tables of docs/performance.md
//
// Rounds. Each round measures every scenario once for every
// implementation that takes part in it; in round r a scenario takes them
// in their order rotated by r (runOrder), so that none always runs first
// after the previous scenario or last after the others. A figure is the
// median of its rounds, printed with the smallest and largest: where two
// implementations' ranges overlap, this run does not tell them apart.
//
// Ratios are fairlock's median ÷ the peer's median: below 1 means fairlock
// is faster for times and slower for throughput. CPU is the process CPU
// time (user and system, getrusage(2)) over each timed run, per 10⁶
// grants. Figures from one machine do not carry over to another; the
// ratios within one run are what to compare.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/fairlock/fairlock/benchmarks"
)

type settings struct {
	quick     bool
	rounds    int
	run       time.Duration // per timed run: one scenario, one implementation, one round
	churn     int           // keys in the churn scenario
	benchtime string        // testing.Benchmark's time per round of scenarios 1 and 2
	out       string        // plot directory
	noPlots   bool
	markdown  bool
}

func main() {
	var s settings
	flag.BoolVar(&s.quick, "quick", false, "short runs (for CI): 2 rounds, 100ms per timed run, 100k churn keys")
	flag.IntVar(&s.rounds, "rounds", 5, "interleaved rounds; each figure is the median over them")
	flag.DurationVar(&s.run, "duration", 500*time.Millisecond, "length of each timed run")
	flag.StringVar(&s.out, "out", "results", "directory for the PNG plots")
	flag.BoolVar(&s.noPlots, "noplots", false, "skip the plots")
	flag.BoolVar(&s.markdown, "markdown", false, "print the tables of docs/performance.md as markdown instead of text")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	s.churn, s.benchtime = 1_000_000, "200ms"
	if s.quick {
		s.churn, s.benchtime = 100_000, "50ms"
		if !set["rounds"] {
			s.rounds = 2
		}
		if !set["duration"] {
			s.run = 100 * time.Millisecond
		}
	}
	if s.rounds < 1 || s.run <= 0 {
		log.Fatalf("compare: need -rounds >= 1 and -duration > 0")
	}
	testing.Init()
	_ = flag.Set("test.benchtime", s.benchtime)

	pd := newPlotData(!s.noPlots)
	m := measure(s, append(benchmarks.Impls(), benchmarks.ModePeers()...), scenarios(s, pd), os.Stderr)
	if s.markdown {
		writeMarkdown(os.Stdout, m)
	} else {
		writeText(os.Stdout, m)
	}
	if !s.noPlots {
		paths, err := pd.plot(s.out, benchmarks.Impls())
		if err != nil {
			log.Fatal(err)
		}
		fmt.Fprintf(os.Stderr, "plots: %s\n", strings.Join(paths, ", "))
	}
}

// metric is one figure a scenario measures for each implementation.
type metric struct {
	name   string
	format func(float64) (num, unit string)
	ratio  bool // print fairlock ÷ peer
}

// The markdown tables, in the order printed.
const (
	headlineTable = iota // scenarios 1 to 4
	otherTable           // scenarios 5 to 7
	modesTable           // scenarios 8 to 11: shared holds and Semaphore
	tables               // how many there are
)

// scenario is a group of rows in the tables.
type scenario struct {
	title   string // heading of its text table
	label   string // prefix of its rows in the markdown table
	table   int    // the markdown table it is in (headlineTable, ...)
	metrics []metric
	takes   func(benchmarks.Impl) bool
	// measure makes one round's run of impl and returns a value for each
	// metric, in order.
	measure func(benchmarks.Impl) []float64
	once    bool   // measured in the first round only: its figures do not vary with time
	note    string // printed under its text table
}

var (
	timeOp       = metric{"time/op", fmtDuration, true}
	allocsOp     = metric{"allocs/op", fmtCount, false}
	opsPerSec    = metric{"ops/s", fmtRate, true}
	grantsPerSec = metric{"grants/s", fmtRate, true}
	cpuPerM      = metric{"CPU s/10⁶ grants", fmtCPU, true}
	allocsGrant  = metric{"allocs/grant", fmtPerGrant, false}
	p50          = metric{"wait p50", fmtDuration, true}
	p99          = metric{"wait p99", fmtDuration, true}
	p999         = metric{"wait p99.9", fmtDuration, true}
	pMax         = metric{"wait max", fmtDuration, true}
	jain         = metric{"Jain", fmtJain, false}
)

// hotKeyHold is the hot-key critical section: a busy spin.
const hotKeyHold = 2 * time.Microsecond

// blockingHold is the blocking holder's critical section: a sleep.
const blockingHold = time.Millisecond

// hotKeyGs are the goroutine counts of the hot-key scenario.
var hotKeyGs = []int{8, 32, 128}

// modeGs are the goroutine counts of the read-mostly and semaphore
// scenarios.
var modeGs = []int{8, 32}

// semUnits is the units per key of the semaphore scenarios.
const semUnits = 4

// mixedG is the goroutine count of the semaphore scenario with mixed
// weights, and mixedMaxW its largest weight.
const (
	mixedG    = 32
	mixedMaxW = 3
)

// contended returns the values of ms for c.
func contended(c benchmarks.Contended, ms []metric) []float64 {
	vs := make([]float64, len(ms))
	for i, m := range ms {
		switch m.name {
		case opsPerSec.name, grantsPerSec.name:
			vs[i] = c.Throughput()
		case cpuPerM.name:
			vs[i] = c.CPUPerMillion()
		case allocsGrant.name:
			vs[i] = c.AllocsPerOp()
		case p50.name:
			vs[i] = float64(c.Quantile(0.5))
		case p99.name:
			vs[i] = float64(c.Quantile(0.99))
		case p999.name:
			vs[i] = float64(c.Quantile(0.999))
		case pMax.name:
			vs[i] = float64(c.Quantile(1))
		case jain.name:
			vs[i] = c.Jain()
		default:
			panic("compare: no metric " + m.name + " in a contended run")
		}
	}
	return vs
}

// scenarios lists what compare measures, in the order of the tables; the
// hot-key runs also leave their waits and throughput in pd.
func scenarios(s settings, pd *plotData) []scenario {
	// Scenarios 1 to 7 take the exclusive locks; the peers of the other
	// modes have none (New is nil).
	all := func(i benchmarks.Impl) bool { return i.New != nil }
	keyed := func(i benchmarks.Impl) bool { return i.New != nil && !i.SingleKey }
	ops := func(r benchmarks.OpResult) []float64 { return []float64{r.NsPerOp, float64(r.AllocsPerOp)} }
	scs := []scenario{
		{
			title: "1. Uncontended Lock+Unlock over 4096 keys, one goroutine", label: "uncontended", table: headlineTable,
			metrics: []metric{timeOp, allocsOp}, takes: all,
			measure: func(i benchmarks.Impl) []float64 { return ops(benchmarks.Uncontended(i)) },
		},
		{
			title: fmt.Sprintf("2. Parallel, each goroutine on its own keys (RunParallel, GOMAXPROCS=%d)", runtime.GOMAXPROCS(0)),
			label: "parallel, distinct keys", table: headlineTable,
			metrics: []metric{timeOp, allocsOp}, takes: keyed,
			measure: func(i benchmarks.Impl) []float64 { return ops(benchmarks.ParallelDistinct(i)) },
		},
	}
	hot := []metric{opsPerSec, cpuPerM, allocsGrant, p50, p99, p999, pMax, jain}
	for _, g := range hotKeyGs {
		scs = append(scs, scenario{
			title: fmt.Sprintf("3. Hot key, G=%d goroutines, %v busy critical section", g, hotKeyHold),
			label: fmt.Sprintf("hot key G=%d", g), table: headlineTable,
			metrics: hot, takes: all,
			measure: func(i benchmarks.Impl) []float64 {
				c := benchmarks.HotKey(i, g, hotKeyHold, s.run)
				pd.add(g, i.Name, c)
				return contended(c, hot)
			},
		})
	}
	blocking := []metric{opsPerSec, cpuPerM}
	scs = append(scs, scenario{
		title: fmt.Sprintf("4. Blocking holder: G=8 goroutines on one key, the holder sleeps %v", blockingHold),
		label: "blocking holder G=8", table: headlineTable,
		metrics: blocking, takes: all,
		measure: func(i benchmarks.Impl) []float64 {
			return contended(benchmarks.BlockingHolder(i, 8, blockingHold, s.run), blocking)
		},
	})
	zipf := []metric{opsPerSec, cpuPerM, p99, pMax}
	scs = append(scs, scenario{
		title: "5. Zipf(s=1.1) keys over 100k keys, 64 goroutines, 1µs busy critical section", label: "Zipf keys, G=64", table: otherTable,
		metrics: zipf, takes: keyed,
		measure: func(i benchmarks.Impl) []float64 {
			return contended(benchmarks.Zipf(i, 64, 100_000, 1.1, time.Microsecond, s.run), zipf)
		},
	})
	scs = append(scs, scenario{
		title: fmt.Sprintf("6. Churn: %d distinct keys held at once by one goroutine, then all released", s.churn),
		label: "churn", table: otherTable, once: true,
		metrics: []metric{
			{"bytes allocated per key", fmtBytes, true},
			{"heap at peak", fmtMiB, true},
			{"heap retained after", fmtMiB, true},
			{"entries after", fmtCount, false},
		},
		takes: func(i benchmarks.Impl) bool { return i.New != nil && i.Unbounded },
		measure: func(i benchmarks.Impl) []float64 {
			c := benchmarks.Churn(i, s.churn)
			return []float64{c.BytesPerKey, float64(c.PeakHeap), float64(c.Retained), float64(c.Entries)}
		},
		note: "k8s/keymutex keeps a fixed array of mutexes (a goroutine holding two keys that share one deadlocks); sync.Mutex is one key",
	})
	scs = append(scs, scenario{
		title: "7. Cancellation storm: 32 goroutines on a hot key, random timeouts up to 50µs, 2µs busy critical section",
		label: "cancellation storm", table: otherTable,
		metrics: []metric{
			{"grants/s", fmtRate, true},
			{"give-ups/s", fmtRate, true},
			{"entries left", fmtCount, false},
		},
		takes: func(i benchmarks.Impl) bool { return i.New != nil && i.Cancellable },
		measure: func(i benchmarks.Impl) []float64 {
			c := benchmarks.CancelStorm(i, 32, hotKeyHold, 50*time.Microsecond, s.run)
			return []float64{c.Throughput(), float64(c.Failed) / c.Elapsed.Seconds(), float64(c.Entries)}
		},
		note: "the other locks cannot give up a wait: no context",
	})
	return append(scs, modeScenarios(s)...)
}

// modeScenarios are scenarios 8 to 11, of fairlock's shared holds and its
// Semaphore, each against the peer of its mode.
func modeScenarios(s settings) []scenario {
	rw := func(i benchmarks.Impl) bool { return i.NewRW != nil }
	sem := func(i benchmarks.Impl) bool { return i.NewSemaphore != nil }
	scs := []scenario{
		{
			title: "8. Uncontended over 4096 keys, one goroutine: Lock+Unlock and RLock+Unlock", label: "uncontended", table: modesTable,
			metrics: []metric{
				{"Lock+Unlock time/op", fmtDuration, true},
				{"Lock+Unlock allocs/op", fmtCount, false},
				{"RLock+Unlock time/op", fmtDuration, true},
				{"RLock+Unlock allocs/op", fmtCount, false},
			},
			takes: rw,
			measure: func(i benchmarks.Impl) []float64 {
				x, r := benchmarks.UncontendedRW(i, false), benchmarks.UncontendedRW(i, true)
				return []float64{x.NsPerOp, float64(x.AllocsPerOp), r.NsPerOp, float64(r.AllocsPerOp)}
			},
		},
		{
			title: fmt.Sprintf("9. Uncontended Acquire(1)+Unlock over 4096 keys, one goroutine, %d units per key", semUnits),
			label: "uncontended", table: modesTable,
			metrics: []metric{
				{"Acquire(1)+Unlock time/op", fmtDuration, true},
				{"Acquire(1)+Unlock allocs/op", fmtCount, false},
			},
			takes: sem,
			measure: func(i benchmarks.Impl) []float64 {
				r := benchmarks.UncontendedAcquire(i, semUnits)
				return []float64{r.NsPerOp, float64(r.AllocsPerOp)}
			},
		},
	}
	readMostly := []metric{
		{"reads/s", fmtRate, true},
		{"writes/s", fmtRate, true},
		{"writers' share", fmtPercent, false},
		cpuPerM,
		{"reader wait p99", fmtDuration, true},
		{"reader wait max", fmtDuration, true},
		{"writer wait p99", fmtDuration, true},
		{"writer wait max", fmtDuration, true},
		jain,
	}
	for _, g := range modeGs {
		w := benchmarks.ReadMostlyWriters(g)
		scs = append(scs, scenario{
			title: fmt.Sprintf("10. Read-mostly hot key, G=%d goroutines: %d write (Lock), %d read (RLock); %v busy critical section", g, w, g-w, hotKeyHold),
			label: fmt.Sprintf("read-mostly G=%d", g), table: modesTable,
			metrics: readMostly, takes: rw,
			measure: func(i benchmarks.Impl) []float64 {
				r := benchmarks.ReadMostly(i, g, w, hotKeyHold, s.run)
				return []float64{
					r.Readers.Throughput(), r.Writers.Throughput(), r.WriteShare(), r.All.CPUPerMillion(),
					float64(r.Readers.Quantile(0.99)), float64(r.Readers.Quantile(1)),
					float64(r.Writers.Quantile(0.99)), float64(r.Writers.Quantile(1)),
					r.All.Jain(),
				}
			},
			note: "writers' share: of all grants; Jain: over every goroutine, readers and writers; " +
				"moby/locker v2's RWMutexMap is absent: the module proxy has only v1.0.1",
		})
	}
	semaphore := []metric{grantsPerSec, cpuPerM, p99, pMax, jain}
	semRun := func(g int, maxW int64, title, label string) scenario {
		return scenario{
			title: title, label: label, table: modesTable,
			metrics: semaphore, takes: sem,
			measure: func(i benchmarks.Impl) []float64 {
				return contended(benchmarks.SemaphoreHotKey(i, g, semUnits, maxW, hotKeyHold, s.run), semaphore)
			},
		}
	}
	for _, g := range modeGs {
		scs = append(scs, semRun(g, 1,
			fmt.Sprintf("11. Semaphore hot key, %d units, G=%d goroutines each taking 1 unit, %v busy critical section", semUnits, g, hotKeyHold),
			fmt.Sprintf("semaphore G=%d", g)))
	}
	return append(scs, semRun(mixedG, mixedMaxW,
		fmt.Sprintf("11. Semaphore hot key, %d units, G=%d goroutines taking 1 to %d units (goroutine i: 1 + i mod %d), %v busy critical section",
			semUnits, mixedG, mixedMaxW, mixedMaxW, hotKeyHold),
		fmt.Sprintf("semaphore G=%d, 1–%d units", mixedG, mixedMaxW)))
}

// measured is what one compare run measured: for each scenario (by
// title) and implementation, one value per metric in each round.
type measured struct {
	machine   string
	rounds    int
	run       time.Duration
	impls     []benchmarks.Impl
	scenarios []scenario
	values    map[string]map[string][][]float64 // scenario title → impl name → round → metric
}

// measure runs every scenario for every implementation that takes part,
// s.rounds times: in round r, a scenario takes its implementations in
// their order rotated by r (runOrder), so that over as many rounds as it
// has implementations each takes each place once. It reports each round
// on progress.
func measure(s settings, impls []benchmarks.Impl, scs []scenario, progress io.Writer) measured {
	m := measured{
		machine: machine(), rounds: s.rounds, run: s.run, impls: impls, scenarios: scs,
		values: map[string]map[string][][]float64{},
	}
	for _, sc := range scs {
		m.values[sc.title] = map[string][][]float64{}
	}
	fmt.Fprintf(progress, "compare: %s; %d rounds, %v per timed run\n", m.machine, s.rounds, s.run)
	for r := range s.rounds {
		fmt.Fprintf(progress, "round %d of %d: each scenario takes its implementations in their order rotated by %d\n", r+1, s.rounds, r)
		for _, sc := range scs {
			if sc.once && r > 0 {
				continue
			}
			takes := slices.DeleteFunc(slices.Clone(impls), func(i benchmarks.Impl) bool { return !sc.takes(i) })
			for _, impl := range runOrder(takes, r) {
				m.values[sc.title][impl.Name] = append(m.values[sc.title][impl.Name], sc.measure(impl))
			}
		}
	}
	return m
}

// runOrder returns impls, the implementations that take part in a
// scenario, rotated left by round: the order in which round number round
// (from 0) measures them. Over as many rounds as there are
// implementations each one takes each place once, so an effect of the
// place (first, straight after the previous scenario's garbage was
// collected; last, after the others warmed the machine) falls on every
// implementation alike.
func runOrder(impls []benchmarks.Impl, round int) []benchmarks.Impl {
	if len(impls) == 0 {
		return nil
	}
	k := round % len(impls)
	return append(slices.Clone(impls[k:]), impls[:k]...)
}

// stat is a figure over the rounds: its median and range. ok is false
// when no round gave a value (NaN: the platform did not report it).
type stat struct {
	med, lo, hi float64
	ok          bool
}

// summarize returns the median, smallest and largest of xs, leaving out
// NaN.
func summarize(xs []float64) stat {
	xs = slices.DeleteFunc(slices.Clone(xs), math.IsNaN)
	if len(xs) == 0 {
		return stat{}
	}
	slices.Sort(xs)
	n := len(xs)
	med := xs[n/2]
	if n%2 == 0 {
		med = (xs[n/2-1] + xs[n/2]) / 2
	}
	return stat{med, xs[0], xs[n-1], true}
}

// stat returns metric j of scenario sc for impl over the rounds, and
// whether impl took part.
func (m measured) stat(sc scenario, j int, impl string) (stat, bool) {
	rounds, ok := m.values[sc.title][impl]
	if !ok {
		return stat{}, false
	}
	xs := make([]float64, len(rounds))
	for i, r := range rounds {
		xs[i] = r[j]
	}
	return summarize(xs), true
}

// value formats a stat as "median (lo–hi)", leaving out the range when
// every round gave the same figure and the range's units when they are the
// median's.
func value(f func(float64) (string, string), st stat) string {
	if !st.ok {
		return "n/a"
	}
	num, unit := f(st.med)
	loN, loU := f(st.lo)
	hiN, hiU := f(st.hi)
	if loN+loU == hiN+hiU {
		return num + unit
	}
	if loU == unit && hiU == unit {
		return fmt.Sprintf("%s%s (%s–%s)", num, unit, loN, hiN)
	}
	return fmt.Sprintf("%s%s (%s%s–%s%s)", num, unit, loN, loU, hiN, hiU)
}

// ratio formats fairlock's median ÷ the peer's.
func ratio(fair, peer stat) string {
	if !fair.ok || !peer.ok || peer.med == 0 {
		return "n/a"
	}
	return sig3(fair.med/peer.med) + "×"
}

// writeText prints one table per scenario: a row per metric with each
// implementation's median and range, and under each metric with a ratio,
// fairlock's ratio to each peer.
func writeText(w io.Writer, m measured) {
	fmt.Fprintf(w, "fairlock vs peers: %s\n", m.machine)
	fmt.Fprintf(w, "%d interleaved rounds, %v per timed run; each figure: median (smallest–largest) over the rounds\n", m.rounds, m.run)
	fmt.Fprintf(w, "fairlock ÷ peer: fairlock's median over the peer's; below 1 is faster for times, slower for throughput\n")
	for _, sc := range m.scenarios {
		present := m.present(sc)
		fmt.Fprintf(w, "\n%s\n", sc.title)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		row(tw, append([]string{""}, present...)...)
		for j, mt := range sc.metrics {
			cells := []string{mt.name}
			fair, _ := m.stat(sc, j, present[0])
			ratios := []string{"  fairlock ÷ peer", ""}
			for _, impl := range present {
				st, _ := m.stat(sc, j, impl)
				cells = append(cells, value(mt.format, st))
				if impl != present[0] {
					ratios = append(ratios, ratio(fair, st))
				}
			}
			row(tw, cells...)
			if mt.ratio && len(present) > 1 {
				row(tw, ratios...)
			}
		}
		tw.Flush()
		if sc.note != "" {
			fmt.Fprintf(w, "  (%s)\n", sc.note)
		}
	}
}

// writeMarkdown prints the tables of docs/performance.md: a sentence
// naming the machine and the run, the headline table (scenarios 1 to 4),
// the table of scenarios 5 to 7 and the table of fairlock's shared holds
// and Semaphore (scenarios 8 to 11). A row per metric, a column per
// implementation that took part in a scenario of the table, "—" where it
// took no part in a row's; each peer's cell ends with fairlock's ratio to
// it.
func writeMarkdown(w io.Writer, m measured) {
	fmt.Fprintf(w, "Machine: %s. One `compare -markdown` run: %d interleaved rounds, %v per timed run. "+
		"Each cell: median (smallest–largest) over the rounds · fairlock's median ÷ that lock's.\n",
		m.machine, m.rounds, m.run)
	for table := range tables {
		var scs []scenario
		for _, sc := range m.scenarios {
			if sc.table == table {
				scs = append(scs, sc)
			}
		}
		if len(scs) == 0 {
			continue
		}
		fmt.Fprintln(w)
		var impls []string
		for _, impl := range m.impls {
			if slices.ContainsFunc(scs, func(sc scenario) bool { _, ok := m.values[sc.title][impl.Name]; return ok }) {
				impls = append(impls, impl.Name)
			}
		}
		fmt.Fprintf(w, "| | %s |\n", strings.Join(impls, " | "))
		fmt.Fprintf(w, "| --- |%s\n", strings.Repeat(" --- |", len(impls)))
		for _, sc := range scs {
			for j, mt := range sc.metrics {
				cells := []string{sc.label + ": " + mt.name}
				fair, _ := m.stat(sc, j, impls[0])
				for _, impl := range impls {
					st, ok := m.stat(sc, j, impl)
					switch {
					case !ok:
						cells = append(cells, "—")
					case mt.ratio && impl != impls[0] && st.ok:
						cells = append(cells, value(mt.format, st)+" · "+ratio(fair, st))
					default:
						cells = append(cells, value(mt.format, st))
					}
				}
				fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
			}
		}
	}
}

// present lists the implementations that took part in sc, fairlock first.
func (m measured) present(sc scenario) []string {
	var ns []string
	for _, impl := range m.impls {
		if _, ok := m.values[sc.title][impl.Name]; ok {
			ns = append(ns, impl.Name)
		}
	}
	return ns
}

func row(tw *tabwriter.Writer, cells ...string) {
	fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
}

// sig3 formats x with three significant digits, or as a whole number
// from 999.5 up, and no exponent: 0.0167, 0.713, 2.31, 45.2, 812, 9253.
// It rounds first, so that 0.9997 prints as 1.00.
func sig3(x float64) string {
	if x == 0 {
		return "0"
	}
	if math.Abs(x) >= 999.5 {
		return strconv.FormatFloat(x, 'f', 0, 64)
	}
	r, _ := strconv.ParseFloat(strconv.FormatFloat(x, 'g', 3, 64), 64)
	decimals := 2 - int(math.Floor(math.Log10(math.Abs(r))))
	return strconv.FormatFloat(r, 'f', max(decimals, 0), 64)
}

// fmtDuration formats nanoseconds in ns, µs or ms.
func fmtDuration(ns float64) (string, string) {
	switch {
	case ns >= 999.5e3:
		return sig3(ns / 1e6), "ms"
	case ns >= 999.5:
		return sig3(ns / 1e3), "µs"
	default:
		return sig3(ns), "ns"
	}
}

// fmtRate formats a rate per second, in thousands or millions above 10⁴.
func fmtRate(x float64) (string, string) {
	switch {
	case x >= 999.5e3:
		return sig3(x / 1e6), "M"
	case x >= 1e4:
		return sig3(x / 1e3), "k"
	default:
		return strconv.FormatFloat(x, 'f', 0, 64), ""
	}
}

func fmtCPU(s float64) (string, string)      { return sig3(s), " s" }
func fmtPercent(x float64) (string, string)  { return strconv.FormatFloat(100*x, 'f', 1, 64), "%" }
func fmtJain(x float64) (string, string)     { return strconv.FormatFloat(x, 'f', 3, 64), "" }
func fmtCount(x float64) (string, string)    { return strconv.FormatFloat(x, 'f', 0, 64), "" }
func fmtPerGrant(x float64) (string, string) { return sig3(x), "" }
func fmtBytes(x float64) (string, string)    { return strconv.FormatFloat(x, 'f', 0, 64), " B" }
func fmtMiB(x float64) (string, string)      { return sig3(x / (1 << 20)), " MiB" }

// machine names the CPU, the processors Go may use and the Go version.
func machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if name, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), ":"))
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d CPUs, GOMAXPROCS=%d, %s %s/%s", cpu, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
