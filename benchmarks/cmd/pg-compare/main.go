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
	"os"

	"github.com/fairlock/fairlock/benchmarks/internal/proccmp"
	"github.com/fairlock/fairlock/benchmarks/pgcmp"
	"github.com/fairlock/fairlock/pglock/pgtest"
)

func main() {
	if pgcmp.IsWorker() {
		os.Exit(pgcmp.RunWorker())
	}
	cfg := pgcmp.Defaults
	cmd := proccmp.NewCommand("pg-compare", "one short round (pgcmp.Quick), for a smoke run", &cfg.Rounds)
	cfg.DefineFlags()
	flag.DurationVar(&cfg.TTL, "ttl", cfg.TTL, "pglock's TTL")
	flag.DurationVar(&cfg.PollDelay, "poll", cfg.PollDelay, "the polling loop's sleep between tries")
	cmd.Main(func() { cfg = pgcmp.Quick }, func(exe string) (proccmp.Printer, error) {
		srv, err := pgtest.NewServer()
		if err != nil {
			return nil, err
		}
		defer srv.Close()
		c, err := pgcmp.Start(srv.ConnString(), []string{exe}, cfg)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		return c.Run(context.Background(), os.Stderr)
	})
}
