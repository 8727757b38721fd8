package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/fairlock/fairlock/benchmarks"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// ccdfG is the goroutine count whose hot-key waits the CCDF plot draws.
const ccdfG = 32

// plotData is what the plots need from the hot-key runs.
type plotData struct {
	keepWaits bool
	waits     map[string][]time.Duration   // every G=ccdfG wait, by implementation, pooled over the rounds
	ops       map[int]map[string][]float64 // each round's throughput, by G and implementation
}

func newPlotData(keepWaits bool) *plotData {
	return &plotData{keepWaits: keepWaits, waits: map[string][]time.Duration{}, ops: map[int]map[string][]float64{}}
}

// add records one hot-key run of impl with g goroutines.
func (pd *plotData) add(g int, impl string, c benchmarks.Contended) {
	if pd.ops[g] == nil {
		pd.ops[g] = map[string][]float64{}
	}
	pd.ops[g][impl] = append(pd.ops[g][impl], c.Throughput())
	if pd.keepWaits && g == ccdfG {
		pd.waits[impl] = append(pd.waits[impl], c.Waits...)
	}
}

// plot writes the hot-key plots into dir and returns their paths.
func (pd *plotData) plot(dir string, impls []benchmarks.Impl) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ccdf := filepath.Join(dir, "hotkey-wait-ccdf.png")
	thr := filepath.Join(dir, "hotkey-throughput.png")
	if err := plotWaitCCDF(ccdf, impls, pd.waits); err != nil {
		return nil, err
	}
	if err := plotThroughput(thr, impls, hotKeyGs, pd.ops); err != nil {
		return nil, err
	}
	return []string{ccdf, thr}, nil
}

// style is how one implementation is drawn: a colour of the Okabe–Ito
// palette, which stays distinct for the common forms of colour blindness
// (Okabe and Ito, "Color Universal Design", 2008), and a solid line for
// the FIFO locks, dashed for the barging ones, dotted for the bare
// sync.Mutex (the floor).
type style struct {
	color  color.Color
	dashes []vg.Length
	width  vg.Length
}

var (
	solid  []vg.Length
	dashed = []vg.Length{vg.Points(6), vg.Points(3)}
	dotted = []vg.Length{vg.Points(2), vg.Points(2)}
)

func styleOf(name string) style {
	switch name {
	case "fairlock":
		return style{color.RGBA{0, 0, 0, 255}, solid, vg.Points(2.5)}
	case "containerd/kmutex":
		return style{color.RGBA{0, 114, 178, 255}, solid, vg.Points(1.5)} // blue
	case "moby/locker":
		return style{color.RGBA{213, 94, 0, 255}, dashed, vg.Points(1.5)} // vermillion
	case "sync.Mutex map":
		return style{color.RGBA{0, 158, 115, 255}, dashed, vg.Points(1.5)} // bluish green
	case "k8s/keymutex":
		return style{color.RGBA{230, 159, 0, 255}, dashed, vg.Points(1.5)} // orange
	default: // sync.Mutex
		return style{color.RGBA{204, 121, 167, 255}, dotted, vg.Points(1.5)} // reddish purple
	}
}

// plotWaitCCDF draws, for every implementation, the fraction of hot-key
// Lock calls that waited at least x, on log scales: the tail, where the
// locks differ, spreads over decades instead of squeezing under the top
// of a CDF.
func plotWaitCCDF(path string, impls []benchmarks.Impl, waits map[string][]time.Duration) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Hot key, G=%d, %v critical section: wait CCDF (solid: FIFO, dashed: barging, dotted: sync.Mutex)", ccdfG, hotKeyHold)
	p.X.Label.Text = "wait x (µs; waits under 0.1µs drawn at 0.1µs)"
	p.Y.Label.Text = "share of calls waiting ≥ x"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	p.Y.Max = 1
	p.Legend.Top, p.Legend.Left = false, true // bottom left: no curve goes there
	for _, impl := range impls {
		ws := slices.Clone(waits[impl.Name])
		if len(ws) == 0 {
			continue
		}
		slices.Sort(ws)
		line, err := plotter.NewLine(ccdfPoints(ws))
		if err != nil {
			return err
		}
		st := styleOf(impl.Name)
		line.Color, line.Dashes, line.Width = st.color, st.dashes, st.width
		p.Add(line)
		p.Legend.Add(impl.Name, line)
	}
	p.Add(plotter.NewGrid())
	return p.Save(9*vg.Inch, 5.5*vg.Inch, path)
}

// ccdfPoints samples a sorted wait list at up to 400 points spaced evenly
// on the log of the fraction, from 1 down to 1/n, so the last decades of
// the tail get as many points as the first; each point is (w, fraction of
// waits >= w). Waits are clamped to 0.1µs so the log scale can show zero
// waits.
func ccdfPoints(waits []time.Duration) plotter.XYs {
	n := len(waits)
	const steps = 400
	pts := make(plotter.XYs, 0, steps+1)
	last := -1
	for i := 0; i <= steps; i++ {
		// frac runs from 1 to 1/n geometrically; idx is the first wait of
		// the top frac of the list.
		frac := math.Pow(float64(n), -float64(i)/steps)
		idx := min(n-1, n-int(frac*float64(n)+0.5))
		if idx <= last {
			continue
		}
		last = idx
		x := max(float64(waits[idx])/1e3, 0.1)
		pts = append(pts, plotter.XY{X: x, Y: float64(n-idx) / float64(n)})
	}
	return pts
}

// rangeXYs are medians with their smallest and largest values, for error
// bars.
type rangeXYs struct {
	plotter.XYs
	lo, hi []float64
}

func (r rangeXYs) YError(i int) (float64, float64) { return r.XYs[i].Y - r.lo[i], r.hi[i] - r.XYs[i].Y }

// plotThroughput draws hot-key throughput against goroutines: the median
// over the rounds, with a bar from the smallest to the largest.
func plotThroughput(path string, impls []benchmarks.Impl, gs []int, ops map[int]map[string][]float64) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Hot key: throughput vs goroutines (%v critical section; bars: smallest to largest round)", hotKeyHold)
	p.X.Label.Text = "goroutines (log scale)"
	p.Y.Label.Text = "Lock+Unlock per second"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.ConstantTicks(ticks(gs))
	p.Y.Min = 0
	for k, impl := range impls {
		var r rangeXYs
		for _, g := range gs {
			st := summarize(ops[g][impl.Name])
			if !st.ok {
				continue
			}
			// Nudge each implementation sideways a little so that the
			// bars of close figures do not hide each other.
			x := float64(g) * (1 + 0.02*float64(k-len(impls)/2))
			r.XYs = append(r.XYs, plotter.XY{X: x, Y: st.med})
			r.lo, r.hi = append(r.lo, st.lo), append(r.hi, st.hi)
		}
		if len(r.XYs) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(r.XYs)
		if err != nil {
			return err
		}
		bars, err := plotter.NewYErrorBars(r)
		if err != nil {
			return err
		}
		st := styleOf(impl.Name)
		line.Color, line.Dashes, line.Width = st.color, st.dashes, st.width
		points.Color, points.Shape = st.color, draw.CircleGlyph{}
		bars.Color = st.color
		p.Add(line, points, bars)
		p.Legend.Add(impl.Name, line, points)
	}
	p.Legend.Top = false
	p.Add(plotter.NewGrid())
	return p.Save(9*vg.Inch, 5.5*vg.Inch, path)
}

func ticks(gs []int) []plot.Tick {
	out := make([]plot.Tick, len(gs))
	for i, g := range gs {
		out[i] = plot.Tick{Value: float64(g), Label: fmt.Sprint(g)}
	}
	return out
}
