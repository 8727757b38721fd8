package proccmp

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
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
	e               *Engine
	cfg             Config
	server, waiting string // the header's, from Setup
	values          [numRows][][]float64
}

func newResults(c *Comparison) *Results {
	r := &Results{e: c.e, cfg: c.cfg, server: c.server, waiting: c.waiting}
	for row := range r.values {
		r.values[row] = make([][]float64, len(c.e.Names))
	}
	return r
}

func (r *Results) add(row, impl int, v float64) {
	r.values[row][impl] = append(r.values[row][impl], v)
}

// Stat returns the figure of row (an index into Rows) for impl (an index
// into the engine's Names) over the rounds; a NaN median when there is
// none.
func (r *Results) Stat(row, impl int) Stat { return Summarize(r.values[row][impl]) }

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

// cells returns the row's cells: each lock's value, and for the others
// than the first (fairlock's), where the row has one, the first's median
// ÷ theirs.
func (r *Results) cells(row int) []string {
	ri := rows[row]
	base := r.Stat(row, 0)
	out := []string{ri.name(r.cfg)}
	for impl := range r.e.Names {
		st := r.Stat(row, impl)
		cell := value(ri.f, st)
		if ri.ratio && impl != 0 {
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
		"Machine: " + Machine() + ".",
		fmt.Sprintf("One %s run: %d interleaved %s on one local %s; %d Lock+Unlock pairs and %d hand-offs (the holder keeps the key a random 0–%v after the waiter queued) per lock and round, hot-key runs of %v.", r.e.Program, c.Rounds, Plural(c.Rounds, "round", "rounds"), r.server, c.Uncontended, c.HandOffs, c.MaxHold, c.HotDuration),
		r.waiting,
		"Each cell: median (smallest–largest) over the rounds · " + r.e.Names[0] + "'s median ÷ that lock's.",
	}
}

// table returns the header and the table.
func (r *Results) table() Table {
	t := Table{Header: r.Header(), Columns: r.e.Names}
	for row := range numRows {
		t.Rows = append(t.Rows, r.cells(row))
	}
	return t
}

// WriteText prints the header and the table as aligned text.
func (r *Results) WriteText(w io.Writer) { r.table().WriteText(w) }

// WriteMarkdown prints the header and the table in Markdown.
func (r *Results) WriteMarkdown(w io.Writer) { r.table().WriteMarkdown(w) }

// Metric is one figure of Results as a Go benchmark reports it
// (testing.B.ReportMetric).
type Metric struct {
	Value float64
	Unit  string // the lock's name and the row's, as "redislock-handoff-µs"
}

// Metrics returns each lock's median of each row, durations in µs and
// the rest as they are, leaving out a median that is not finite (a
// waiter that was never granted).
func (r *Results) Metrics() []Metric {
	lock := strings.NewReplacer("/", "-", " ", "-")
	var ms []Metric
	for row, name := range r.Rows() {
		unit := metricName(name)
		for impl, lockName := range r.e.Names {
			v := r.Stat(row, impl).Med
			if math.IsInf(v, 0) || math.IsNaN(v) {
				continue
			}
			if row == rowUncontended || row == rowHandOff || row == rowDies {
				v /= float64(time.Microsecond)
			}
			ms = append(ms, Metric{v, lock.Replace(lockName) + "-" + unit})
		}
	}
	return ms
}

// metricName is a short metric unit for a row's name.
func metricName(name string) string {
	for _, m := range []struct{ in, out string }{
		{"uncontended", "uncontended-µs"},
		{"hand-off", "handoff-µs"},
		{"grants/s", "hotkey-grants/s"},
		{"Jain", "hotkey-jain"},
		{"grant order", "out-of-order"},
		{"SIGKILL", "holder-killed-µs"},
	} {
		if strings.Contains(name, m.in) {
			return m.out
		}
	}
	return name
}
