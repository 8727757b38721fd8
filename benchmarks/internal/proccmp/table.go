package proccmp

import (
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
)

// Stat is a figure over the rounds: its median and range.
type Stat struct {
	Med, Lo, Hi float64
	N           int // rounds
}

// Summarize returns the Stat of xs, one value per round (the median of
// an even count the mean of the middle two); NaNs and N 0 when xs is
// empty. It sorts a copy of xs.
func Summarize(xs []float64) Stat {
	xs = slices.Clone(xs)
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

// Table is a comparison's table as it prints: the sentences above it,
// its column heads, and its rows, each a name and a cell per column.
type Table struct {
	Header  []string
	Columns []string
	Rows    [][]string
}

// WriteText prints the header, a sentence a line, and the table as
// aligned text.
func (t Table) WriteText(w io.Writer) {
	for _, s := range t.Header {
		fmt.Fprintln(w, s)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\t"+strings.Join(t.Columns, "\t"))
	for _, row := range t.Rows {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	tw.Flush()
}

// WriteMarkdown prints the header as one paragraph and the table in
// Markdown.
func (t Table) WriteMarkdown(w io.Writer) {
	fmt.Fprintln(w, strings.Join(t.Header, " "))
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| | "+strings.Join(t.Columns, " | ")+" |")
	fmt.Fprintln(w, strings.Repeat("| --- ", len(t.Columns)+1)+"|")
	for _, row := range t.Rows {
		fmt.Fprintln(w, "| "+strings.Join(row, " | ")+" |")
	}
}

// Machine describes the machine, for a table's header: CPU, CPUs,
// GOMAXPROCS, Go version.
func Machine() string {
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

// Plural returns one if n is 1, else many.
func Plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
