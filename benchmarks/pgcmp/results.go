package pgcmp

import (
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// The rows of the table.
const (
	rowUncontended = iota
	rowHandOff
	rowHotRate
	rowHotJain
	rowOrder
	rowDies
	numRows
)

// Results are the figures of a comparison: for each row and lock, one
// value per round.
type Results struct {
	cfg    Config
	server string // the server's version
	values [numRows][numImpls][]float64
}

func newResults(cfg Config, server string) *Results { return &Results{cfg: cfg, server: server} }

func (r *Results) add(row, impl int, v float64) {
	r.values[row][impl] = append(r.values[row][impl], v)
}

// Stat is a figure over the rounds: its median and range.
type Stat struct {
	Med, Lo, Hi float64
	N           int // rounds
}

// Stat returns the figure of row (an index into Rows) for impl (an index
// into Names) over the rounds; a NaN median when there is none.
func (r *Results) Stat(row, impl int) Stat {
	xs := slices.Clone(r.values[row][impl])
	if len(xs) == 0 {
		return Stat{Med: math.NaN(), Lo: math.NaN(), Hi: math.NaN()}
	}
	slices.Sort(xs)
	n := len(xs)
	med := xs[n/2]
	if n%2 == 0 {
		med = (xs[n/2-1] + xs[n/2]) / 2
	}
	return Stat{med, xs[0], xs[n-1], n}
}

// rowInfo is how a row is named and formatted, and whether it has a
// ratio.
type rowInfo struct {
	name  func(Config) string
	f     func(float64) (string, string)
	ratio bool
}

var rows = [numRows]rowInfo{
	rowUncontended: {func(Config) string { return "uncontended Lock+Unlock: time" }, fmtDuration, true},
	rowHandOff:     {func(Config) string { return "hand-off to a waiter in another process: median" }, fmtDuration, true},
	rowHotRate: {func(c Config) string {
		return fmt.Sprintf("hot key, 3 processes × %d goroutines: grants/s", c.HotG)
	}, fmtRate, true},
	rowHotJain: {func(Config) string { return "hot key: Jain's index of grants per goroutine" }, fmtJain, false},
	rowOrder: {func(c Config) string {
		return fmt.Sprintf("grant order, %d waiters in 3 processes: grants out of order", c.Waiters)
	}, fmtCount, false},
	rowDies: {func(Config) string { return "holder SIGKILLed: kill → next grant" }, fmtDuration, true},
}

// Rows are the rows' names, in order, for the Go benchmarks' metrics.
func (r *Results) Rows() []string {
	names := make([]string, numRows)
	for i, ri := range rows {
		names[i] = ri.name(r.cfg)
	}
	return names
}

// value formats a Stat as "median (lo–hi)", the range left out when every
// round gave the same figure.
func value(f func(float64) (string, string), st Stat) string {
	if st.N == 0 {
		return "n/a"
	}
	num, unit := f(st.Med)
	loN, loU := f(st.Lo)
	hiN, hiU := f(st.Hi)
	if loN+loU == hiN+hiU {
		return num + unit
	}
	if loU == unit && hiU == unit {
		return fmt.Sprintf("%s%s (%s–%s)", num, unit, loN, hiN)
	}
	return fmt.Sprintf("%s%s (%s%s–%s%s)", num, unit, loN, loU, hiN, hiU)
}

// cells returns the row's cells: each lock's value, and for the others
// than pglock, where the row has one, pglock's median ÷ theirs.
func (r *Results) cells(row int) []string {
	ri := rows[row]
	base := r.Stat(row, PgLock)
	out := []string{ri.name(r.cfg)}
	for impl := range numImpls {
		st := r.Stat(row, impl)
		cell := value(ri.f, st)
		if ri.ratio && impl != PgLock {
			if q := base.Med / st.Med; !math.IsNaN(q) && !math.IsInf(q, 0) && q != 0 {
				cell += " · " + sig3(q) + "×"
			}
		}
		out = append(out, cell)
	}
	return out
}

// Header returns the sentences that say what was run: the machine, the
// rounds, and how each lock was configured.
func (r *Results) Header() []string {
	c := r.cfg
	return []string{
		"Machine: " + machine() + ".",
		fmt.Sprintf("One pg-compare run: %d interleaved %s on one local PostgreSQL server (%s); %d Lock+Unlock pairs and %d hand-offs (the holder keeps the key a random 0–%v after the waiter queued) per lock and round, hot-key runs of %v.", c.Rounds, plural(c.Rounds, "round", "rounds"), r.server, c.Uncontended, c.HandOffs, c.MaxHold, c.HotDuration),
		fmt.Sprintf("Waiting: pglock WithTTL(%v), queued and woken by LISTEN/NOTIFY, no connection held while waiting; pg_advisory_lock (a 64-bit FNV-1a hash of the key) blocking on a pooled connection of its own per waiter, held until the unlock; pg_try_advisory_lock retried every %v, its connection returned between tries; every wait bounded by %v.", c.TTL, c.PollDelay, c.Bound),
		"Each cell: median (smallest–largest) over the rounds · pglock's median ÷ that lock's.",
	}
}

// plural returns one if n is 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// WriteText prints the table as aligned text.
func (r *Results) WriteText(w io.Writer) {
	for _, s := range r.Header() {
		fmt.Fprintln(w, s)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\t"+strings.Join(Names[:], "\t"))
	for row := range numRows {
		fmt.Fprintln(tw, strings.Join(r.cells(row), "\t"))
	}
	tw.Flush()
}

// WriteMarkdown prints the header and the table in Markdown.
func (r *Results) WriteMarkdown(w io.Writer) {
	fmt.Fprintln(w, strings.Join(r.Header(), " "))
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| | "+strings.Join(Names[:], " | ")+" |")
	fmt.Fprintln(w, "| --- | --- | --- | --- |")
	for row := range numRows {
		fmt.Fprintln(w, "| "+strings.Join(r.cells(row), " | ")+" |")
	}
}

// sig3 formats x to three significant digits (whole numbers from 1000).
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

// fmtDuration formats nanoseconds in µs, ms or s; +Inf (a waiter that
// was never granted) as "never".
func fmtDuration(ns float64) (string, string) {
	switch {
	case math.IsInf(ns, 1):
		return "never", ""
	case ns >= 999.5e6:
		return sig3(ns / 1e9), "s"
	case ns >= 999.5e3:
		return sig3(ns / 1e6), "ms"
	case ns >= 999.5:
		return sig3(ns / 1e3), "µs"
	default:
		return sig3(ns), "ns"
	}
}

// fmtRate formats a rate per second, in thousands above 10⁴.
func fmtRate(x float64) (string, string) {
	if x >= 1e4 {
		return sig3(x / 1e3), "k"
	}
	return strconv.FormatFloat(x, 'f', 0, 64), ""
}

func fmtJain(x float64) (string, string)  { return strconv.FormatFloat(x, 'f', 3, 64), "" }
func fmtCount(x float64) (string, string) { return strconv.FormatFloat(x, 'f', 0, 64), "" }

// machine describes the machine: CPU, CPUs, GOMAXPROCS, Go version.
func machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if name, ok := strings.CutPrefix(line, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(name), ":"))
				break
			}
		}
	}
	return fmt.Sprintf("%s, %d CPUs, GOMAXPROCS=%d, %s %s/%s", cpu, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
