// Command redis-compare measures redislock beside redsync and
// bsm/redislock on one real redis-server that it starts (the
// redis-server binary must be on $PATH; see package redistest), in
// interleaved rounds, and prints a table of medians, ranges and
// redislock's ratios: the scenarios of package rediscmp.
//
//	go run ./cmd/redis-compare            # 5 rounds, a few minutes
//	go run ./cmd/redis-compare -markdown  # the table of docs/performance.md
//	go run ./cmd/redis-compare -quick     # one short round
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/fairlock/fairlock/benchmarks/rediscmp"
	"github.com/fairlock/fairlock/redislock/redistest"
)

func main() {
	if rediscmp.IsWorker() {
		os.Exit(rediscmp.RunWorker())
	}
	cfg := rediscmp.Defaults
	quick := flag.Bool("quick", false, "one short round (rediscmp.Quick), for a smoke run")
	markdown := flag.Bool("markdown", false, "print the table in Markdown")
	flag.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "interleaved rounds")
	flag.IntVar(&cfg.HandOffs, "handoffs", cfg.HandOffs, "hand-offs per lock and round")
	flag.DurationVar(&cfg.HotDuration, "duration", cfg.HotDuration, "each hot-key run")
	flag.DurationVar(&cfg.TTL, "ttl", cfg.TTL, "redislock's TTL; redsync's expiry and bsm/redislock's TTL")
	flag.DurationVar(&cfg.RedsyncDelay, "redsync-delay", cfg.RedsyncDelay, "redsync's WithRetryDelay")
	flag.Parse()
	if *quick {
		cfg = rediscmp.Quick
	}
	if err := run(cfg, *markdown); err != nil {
		fmt.Fprintln(os.Stderr, "redis-compare:", err)
		os.Exit(1)
	}
}

func run(cfg rediscmp.Config, markdown bool) error {
	dir, err := os.MkdirTemp("", "redis-compare")
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
	c, err := rediscmp.Start(srv.Addr(), []string{exe}, cfg)
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
