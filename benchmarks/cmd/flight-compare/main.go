// Command flight-compare measures package flight beside
// golang.org/x/sync/singleflight on a cache stampede across processes,
// on one real redis-server that it starts (the redis-server binary must
// be on $PATH; see package redistest): 4 processes × 250 concurrent
// requests per expired key, in interleaved rounds. It prints the fills
// per expiry and the requests' latency p50 and p99 of each, with
// flight's ratios: the measurement of package flightcmp.
//
//	go run ./cmd/flight-compare            # 5 rounds of 10 expiries each, a few seconds
//	go run ./cmd/flight-compare -markdown  # the table in Markdown
//	go run ./cmd/flight-compare -quick     # one round of 2 expiries
package main

import (
	"context"
	"flag"
	"os"

	"github.com/fairlock/fairlock/benchmarks/flightcmp"
	"github.com/fairlock/fairlock/benchmarks/internal/proccmp"
)

func main() {
	if flightcmp.IsWorker() {
		os.Exit(flightcmp.RunWorker())
	}
	cfg := flightcmp.Defaults
	cmd := proccmp.NewCommand("flight-compare", "one round of 2 expiries (flightcmp.Quick), for a smoke run", &cfg.Rounds)
	flag.IntVar(&cfg.Expiries, "expiries", cfg.Expiries, "expiries per implementation and round")
	flag.IntVar(&cfg.Procs, "procs", cfg.Procs, "worker processes")
	flag.IntVar(&cfg.Requests, "requests", cfg.Requests, "concurrent requests per process and expiry")
	flag.DurationVar(&cfg.Fill, "fill", cfg.Fill, "how long a fill runs")
	cmd.Main(func() { cfg = flightcmp.Quick }, func(exe string) (proccmp.Printer, error) {
		addr, stop, err := proccmp.StartRedis("flight-compare")
		if err != nil {
			return nil, err
		}
		defer stop()
		c, err := flightcmp.Start(addr, []string{exe}, cfg)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		return c.Run(context.Background(), os.Stderr)
	})
}
