package flightcmp

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/fairlock/fairlock/benchmarks/internal/proccmp"
)

// The rows of the table.
const (
	rowFills = iota
	rowP50
	rowP99
	numRows
)

// rowNames are the rows' names, for the table and the Go benchmark's
// metrics.
var rowNames = [numRows]string{"fills per expiry", "request latency p50", "request latency p99"}

// Results are the figures of a comparison: for each row and
// implementation, one value per round.
type Results struct {
	cfg    Config
	values [numRows][numImpls][]float64
}

// add records a round of impl: its fills per expiry and its requests'
// latencies.
func (r *Results) add(impl int, fills float64, lat []time.Duration) {
	slices.Sort(lat)
	r.values[rowFills][impl] = append(r.values[rowFills][impl], fills)
	r.values[rowP50][impl] = append(r.values[rowP50][impl], float64(quantile(lat, 0.50)))
	r.values[rowP99][impl] = append(r.values[rowP99][impl], float64(quantile(lat, 0.99)))
}

// quantile returns the q-quantile of sorted d (nearest rank).
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(d)))) - 1
	return d[min(max(i, 0), len(d)-1)]
}

// Stat is a figure over the rounds: its median and range.
type Stat = proccmp.Stat

// Stat returns row's figure for impl over the rounds.
func (r *Results) Stat(row, impl int) Stat { return proccmp.Summarize(r.values[row][impl]) }

// Rows are the rows' names, in order.
func (r *Results) Rows() []string { return rowNames[:] }

// Ratio returns flight's median ÷ singleflight's for row.
func (r *Results) Ratio(row int) float64 {
	return r.Stat(row, Flight).Med / r.Stat(row, Singleflight).Med
}

// format formats a row's value.
func format(row int, v float64) string {
	if row == rowFills {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return time.Duration(v).Round(10 * time.Microsecond).String()
}

// cell formats a Stat as "median (lo–hi)", the range left out when every
// round gave the same figure.
func cell(row int, st Stat) string {
	if st.N == 0 {
		return "n/a"
	}
	med, lo, hi := format(row, st.Med), format(row, st.Lo), format(row, st.Hi)
	if lo == hi {
		return med
	}
	return fmt.Sprintf("%s (%s–%s)", med, lo, hi)
}

// Header returns the sentences that say what was run.
func (r *Results) Header() []string {
	c := r.cfg
	return []string{
		"Machine: " + proccmp.Machine() + ".",
		fmt.Sprintf("One flight-compare run: %d interleaved %s of %d expiries per implementation, on one local redis-server. Each expiry: one key, expired, requested by %d processes × %d concurrent requests; a fill counts itself in Redis and takes %v.",
			c.Rounds, proccmp.Plural(c.Rounds, "round", "rounds"), c.Expiries, c.Procs, c.Requests, c.Fill),
		fmt.Sprintf("flight: a flight.Cache per process over redislock (WithTTL(%v)) and a Redis store whose writes are fenced by a Lua script. x/sync/singleflight: a singleflight.Group per process around the same read, fill and write (a plain SET).", c.TTL),
		"Each cell: median (smallest–largest) over the rounds, each round's latency quantiles over all its requests; ratio: flight's median ÷ singleflight's.",
	}
}

// cells returns row's cells: each implementation's value and the ratio.
func (r *Results) cells(row int) []string {
	out := []string{rowNames[row]}
	for impl := range numImpls {
		out = append(out, cell(row, r.Stat(row, impl)))
	}
	return append(out, strconv.FormatFloat(r.Ratio(row), 'f', 2, 64))
}

// WriteText prints the header and the table as aligned text.
func (r *Results) WriteText(w io.Writer) { r.table().WriteText(w) }

// WriteMarkdown prints the header and the table in Markdown.
func (r *Results) WriteMarkdown(w io.Writer) { r.table().WriteMarkdown(w) }

// table returns the header and the table, whose last column is the
// ratio.
func (r *Results) table() proccmp.Table {
	t := proccmp.Table{Header: r.Header(), Columns: slices.Concat(Names[:], []string{"ratio"})}
	for row := range numRows {
		t.Rows = append(t.Rows, r.cells(row))
	}
	return t
}
