// Command pg-compare measures pglock beside session advisory locks (a
// blocking pg_advisory_lock on a connection per waiter, and the
// pg_try_advisory_lock polling loop) on one real PostgreSQL server that it
// starts (Debian's postgresql package's binaries; see package pgtest), in
// interleaved rounds, and prints a table of medians, ranges and pglock's
// ratios: the scenarios of package pgcmp.
//
//	go run ./cmd/pg-compare            # 5 rounds, a minute or two
//	go run ./cmd/pg-compare -markdown  # the table in Markdown
//	go run ./cmd/pg-compare -quick     # one short round
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/fairlock/fairlock/benchmarks/pgcmp"
	"github.com/fairlock/fairlock/pglock/pgtest"
)

func main() {
	if pgcmp.IsWorker() {
		os.Exit(pgcmp.RunWorker())
	}
	cfg := pgcmp.Defaults
	quick := flag.Bool("quick", false, "one short round (pgcmp.Quick), for a smoke run")
	markdown := flag.Bool("markdown", false, "print the table in Markdown")
	flag.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "interleaved rounds")
	flag.IntVar(&cfg.HandOffs, "handoffs", cfg.HandOffs, "hand-offs per lock and round")
	flag.DurationVar(&cfg.HotDuration, "duration", cfg.HotDuration, "each hot-key run")
	flag.DurationVar(&cfg.TTL, "ttl", cfg.TTL, "pglock's TTL")
	flag.DurationVar(&cfg.PollDelay, "poll", cfg.PollDelay, "the polling loop's sleep between tries")
	flag.Parse()
	if *quick {
		cfg = pgcmp.Quick
	}
	if err := run(cfg, *markdown); err != nil {
		fmt.Fprintln(os.Stderr, "pg-compare:", err)
		os.Exit(1)
	}
}

func run(cfg pgcmp.Config, markdown bool) error {
	srv, err := pgtest.NewServer()
	if err != nil {
		return err
	}
	defer srv.Close()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	c, err := pgcmp.Start(srv.ConnString(), []string{exe}, cfg)
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
