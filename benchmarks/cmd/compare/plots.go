package main

import (
	"fmt"
	"time"

	"github.com/fairlock/fairlock/benchmarks"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// plotWaitCDF draws, for every implementation, the fraction of Lock calls
// on the hot key that waited at most x, with x on a log scale.
func plotWaitCDF(path string, impls []benchmarks.Impl, rs map[string]benchmarks.Contended) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Hot key, G=%d: wait-time CDF", rs[impls[0].Name].Goroutines)
	p.X.Label.Text = "wait (µs, log scale; waits under 0.1µs drawn at 0.1µs)"
	p.Y.Label.Text = "fraction of Lock calls waiting at most x"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = false // bottom right: the curves are near 0 or 1 there
	for i, impl := range impls {
		c, ok := rs[impl.Name]
		if !ok || len(c.Waits) == 0 {
			continue
		}
		line, err := plotter.NewLine(cdfPoints(c.Waits))
		if err != nil {
			return err
		}
		line.Color = plotutil.Color(i)
		line.Width = vg.Points(1.5)
		if i == 0 {
			line.Width = vg.Points(3)
		}
		p.Add(line)
		p.Legend.Add(impl.Name, line)
	}
	p.Add(plotter.NewGrid())
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}

// cdfPoints samples a sorted wait list at up to 400 quantiles; waits are
// clamped to 0.1µs so the log scale can show zero waits.
func cdfPoints(waits []time.Duration) plotter.XYs {
	n := len(waits)
	steps := min(n, 400)
	pts := make(plotter.XYs, 0, steps+1)
	for i := 0; i <= steps; i++ {
		idx := min(n-1, i*n/steps)
		x := max(float64(waits[idx])/1e3, 0.1)
		pts = append(pts, plotter.XY{X: x, Y: float64(idx+1) / float64(n)})
	}
	return pts
}

// plotThroughput draws hot-key throughput against goroutines.
func plotThroughput(path string, impls []benchmarks.Impl, gs []int, hot map[int]map[string]benchmarks.Contended) error {
	p := plot.New()
	p.Title.Text = "Hot key: throughput vs goroutines (2µs critical section)"
	p.X.Label.Text = "goroutines (log scale)"
	p.Y.Label.Text = "Lock+Unlock per second"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.ConstantTicks(ticks(gs))
	p.Y.Min = 0
	for i, impl := range impls {
		pts := make(plotter.XYs, 0, len(gs))
		for _, g := range gs {
			if c, ok := hot[g][impl.Name]; ok {
				pts = append(pts, plotter.XY{X: float64(g), Y: c.Throughput()})
			}
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		line.Color, points.Color = plotutil.Color(i), plotutil.Color(i)
		points.Shape = plotutil.Shape(i)
		if i == 0 {
			line.Width = vg.Points(3)
		}
		p.Add(line, points)
		p.Legend.Add(impl.Name, line, points)
	}
	p.Legend.Top = false
	p.Add(plotter.NewGrid())
	return p.Save(8*vg.Inch, 5*vg.Inch, path)
}

func ticks(gs []int) []plot.Tick {
	out := make([]plot.Tick, len(gs))
	for i, g := range gs {
		out[i] = plot.Tick{Value: float64(g), Label: fmt.Sprint(g)}
	}
	return out
}
