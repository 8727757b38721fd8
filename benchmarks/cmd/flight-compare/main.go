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
	"fmt"
	"os"

	"github.com/fairlock/fairlock/benchmarks/flightcmp"
	"github.com/fairlock/fairlock/redislock/redistest"
)

func main() {
	if flightcmp.IsWorker() {
		os.Exit(flightcmp.RunWorker())
	}
	cfg := flightcmp.Defaults
	quick := flag.Bool("quick", false, "one round of 2 expiries (flightcmp.Quick), for a smoke run")
	markdown := flag.Bool("markdown", false, "print the table in Markdown")
	flag.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "interleaved rounds")
	flag.IntVar(&cfg.Expiries, "expiries", cfg.Expiries, "expiries per implementation and round")
	flag.IntVar(&cfg.Procs, "procs", cfg.Procs, "worker processes")
	flag.IntVar(&cfg.Requests, "requests", cfg.Requests, "concurrent requests per process and expiry")
	flag.DurationVar(&cfg.Fill, "fill", cfg.Fill, "how long a fill runs")
	flag.Parse()
	if *quick {
		cfg = flightcmp.Quick
	}
	if err := run(cfg, *markdown); err != nil {
		fmt.Fprintln(os.Stderr, "flight-compare:", err)
		os.Exit(1)
	}
}

func run(cfg flightcmp.Config, markdown bool) error {
	dir, err := os.MkdirTemp("", "flight-compare")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := redistest.NewServer(dir)
	if err != nil {
		return err
	}
	defer srv.Stop()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	c, err := flightcmp.Start(srv.Addr(), []string{exe}, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	r, err := c.Run(context.Background(), os.Stderr)
	if err != nil {
		return err
	}
	if markdown {
		r.WriteMarkdown(os.Stdout)
	} else {
		r.WriteText(os.Stdout)
	}
	return nil
}
