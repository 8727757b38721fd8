// Command otel runs a short contended workload on a fairlock Locker wired
// to the OpenTelemetry SDK, prints what the SDK collected with the stdout
// exporter (JSON), and ends with a summary read from the same data: one
// line per result of a Lock call, with counts and waits.
//
// Some calls give up on purpose: each Lock has a deadline (-timeout) that
// is shorter than a wait behind the other workers can last, so that the
// export shows a second result, deadline_exceeded, beside acquired.
//
//	go run ./examples/otel
//	go run ./examples/otel -export=false            # the summary only
//	go run ./examples/otel -timeout 0 -rounds 1000  # no deadline: every call acquires
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/otelmetrics"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

type config struct {
	workers int
	rounds  int           // Lock calls per worker
	timeout time.Duration // each Lock's deadline; 0: none
	hold    time.Duration // how long a granted call holds its key
	export  bool          // print the collected metrics as JSON
}

func main() {
	var cfg config
	flag.IntVar(&cfg.workers, "workers", 8, "goroutines calling Lock")
	flag.IntVar(&cfg.rounds, "rounds", 200, "Lock calls per worker")
	flag.DurationVar(&cfg.timeout, "timeout", 300*time.Microsecond, "deadline of each Lock call (0: none); shorter than a wait behind the other workers, so some calls give up")
	flag.DurationVar(&cfg.hold, "hold", 50*time.Microsecond, "how long a granted call holds its key")
	flag.BoolVar(&cfg.export, "export", true, "print the collected metrics as JSON with the stdout exporter")
	flag.Parse()
	if cfg.workers < 1 || cfg.rounds < 1 || cfg.timeout < 0 || cfg.hold < 0 {
		fmt.Fprintln(os.Stderr, "otel: need -workers and -rounds >= 1, -timeout and -hold >= 0")
		os.Exit(2)
	}
	if err := run(os.Stdout, cfg); err != nil {
		log.Fatal(err)
	}
}

// lockerName is the Locker's WithName: the fairlock.locker attribute.
const lockerName = "accounts"

func run(out io.Writer, cfg config) error {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	obs, err := otelmetrics.New(mp)
	if err != nil {
		return err
	}
	l := fairlock.New[string](fairlock.WithName(lockerName), fairlock.WithObserver(obs))

	// Workers on three keys, most calls on one hot key, each call with a
	// deadline: a call that would wait past it gives up with
	// context.DeadlineExceeded, which the observer counts as
	// deadline_exceeded.
	var wg sync.WaitGroup
	for w := range cfg.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range cfg.rounds {
				key := "acct-hot"
				if i%3 == 0 {
					key = fmt.Sprintf("acct-%d", w%2)
				}
				lctx, cancel := ctx, context.CancelFunc(func() {})
				if cfg.timeout > 0 {
					lctx, cancel = context.WithTimeout(ctx, cfg.timeout)
				}
				g, err := l.Lock(lctx, key)
				cancel()
				if err != nil {
					continue // the observer has counted it
				}
				time.Sleep(cfg.hold)
				g.Unlock()
			}
		}()
	}
	wg.Wait()

	// Collect while the Locker is open, so that its gauges (held keys,
	// waiters) are in the data; then close it.
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return err
	}
	if err := l.Close(ctx); err != nil {
		return err
	}
	if cfg.export {
		exp, err := stdoutmetric.New(stdoutmetric.WithWriter(out), stdoutmetric.WithPrettyPrint())
		if err != nil {
			return err
		}
		if err := exp.Export(ctx, &rm); err != nil {
			return err
		}
	}
	return summarize(out, cfg, &rm)
}

// result is what the metrics say about one fairlock.result value.
type result struct {
	calls            int64
	waitSum, waitMax float64 // seconds
	waitMaxOK        bool
}

// summarize prints one line per result kind of the Locker's Lock calls,
// read from the collected metrics, explains the deliberate timeouts, and
// ends with the gauges.
func summarize(out io.Writer, cfg config, rm *metricdata.ResourceMetrics) error {
	results := map[string]*result{}
	of := func(set attribute.Set) *result {
		if v, _ := set.Value("fairlock.locker"); v.AsString() != lockerName {
			return nil
		}
		v, _ := set.Value("fairlock.result")
		r := results[v.AsString()]
		if r == nil {
			r = &result{}
			results[v.AsString()] = r
		}
		return r
	}
	gauges := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					switch m.Name {
					case "fairlock.lock.acquisitions":
						if r := of(dp.Attributes); r != nil {
							r.calls += dp.Value
						}
					case "fairlock.lock.held", "fairlock.lock.waiters":
						if v, _ := dp.Attributes.Value("fairlock.locker"); v.AsString() == lockerName {
							gauges[m.Name] += dp.Value
						}
					}
				}
			case metricdata.Histogram[float64]:
				if m.Name != "fairlock.lock.wait.duration" {
					continue
				}
				for _, dp := range data.DataPoints {
					if r := of(dp.Attributes); r != nil {
						r.waitSum += dp.Sum
						if mx, ok := dp.Max.Value(); ok {
							r.waitMax, r.waitMaxOK = max(r.waitMax, mx), true
						}
					}
				}
			}
		}
	}
	if len(results) == 0 {
		return fmt.Errorf("otel: the collected metrics have no fairlock.lock.acquisitions for locker %q", lockerName)
	}

	var total int64
	kinds := make([]string, 0, len(results))
	for k, r := range results {
		kinds = append(kinds, k)
		total += r.calls
	}
	slices.Sort(kinds)
	fmt.Fprintf(out, "\nsummary: %d Lock calls on locker %q (%d workers × %d), by fairlock.result:\n", total, lockerName, cfg.workers, cfg.rounds)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, k := range kinds {
		r := results[k]
		line := fmt.Sprintf("  %s\t%d calls\t%.1f%%", k, r.calls, 100*float64(r.calls)/float64(total))
		if r.calls > 0 {
			line += fmt.Sprintf("\twait mean %v", seconds(r.waitSum/float64(r.calls)))
			if r.waitMaxOK {
				line += fmt.Sprintf(", max %v", seconds(r.waitMax))
			}
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	if r := results["deadline_exceeded"]; r != nil && r.calls > 0 {
		fmt.Fprintf(out, "deadline_exceeded is on purpose: every Lock call here has a %v deadline (-timeout), and %d workers take turns on one hot key,\n"+
			"each holding it at least %v (-hold), so a call that queues behind a few of them gives up. A give-up's wait runs past its deadline\n"+
			"until the runtime's timer fires and the call leaves the queue. Run with -timeout 0 for no deadline.\n",
			cfg.timeout, cfg.workers, cfg.hold)
	}
	var names []string
	for _, k := range []string{"fairlock.lock.held", "fairlock.lock.waiters"} {
		names = append(names, fmt.Sprintf("%s %d", k, gauges[k]))
	}
	fmt.Fprintf(out, "gauges when collected, after the work: %s\n", strings.Join(names, ", "))
	return nil
}

// seconds renders a duration in seconds, as the histogram records it.
func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(time.Microsecond)
}
