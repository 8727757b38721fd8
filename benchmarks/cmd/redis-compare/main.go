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
	"os"

	"github.com/fairlock/fairlock/benchmarks/internal/proccmp"
	"github.com/fairlock/fairlock/benchmarks/rediscmp"
)

func main() {
	if rediscmp.IsWorker() {
		os.Exit(rediscmp.RunWorker())
	}
	cfg := rediscmp.Defaults
	cmd := proccmp.NewCommand("redis-compare", "one short round (rediscmp.Quick), for a smoke run", &cfg.Rounds)
	cfg.DefineFlags()
	flag.DurationVar(&cfg.TTL, "ttl", cfg.TTL, "redislock's TTL; redsync's expiry and bsm/redislock's TTL")
	flag.DurationVar(&cfg.RedsyncDelay, "redsync-delay", cfg.RedsyncDelay, "redsync's WithRetryDelay")
	cmd.Main(func() { cfg = rediscmp.Quick }, func(exe string) (proccmp.Printer, error) {
		addr, stop, err := proccmp.StartRedis("redis-compare")
		if err != nil {
			return nil, err
		}
		defer stop()
		c, err := rediscmp.Start(addr, []string{exe}, cfg)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		return c.Run(context.Background(), os.Stderr)
	})
}
