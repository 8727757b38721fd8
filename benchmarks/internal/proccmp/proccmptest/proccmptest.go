// Package proccmptest holds the tests and the benchmark that every lock
// comparison across processes (package proccmp) runs on its engine's
// locks, on a real server with worker processes, and Start, with which
// the tests of every comparison across processes (flightcmp's too) start
// theirs. An engine's test file starts the server and calls them.
package proccmptest

import (
	"context"
	"io"
	"os"
	"testing"

	"github.com/fairlock/fairlock/benchmarks/internal/proccmp"
	"go.uber.org/goleak"
)

// Main is the TestMain of a comparison's package, whose test binary is
// also the comparison's worker (Start re-executes it with the worker's
// environment): in a worker process (isWorker) it exits with runWorker's
// code; else it runs the tests and fails if they leave a goroutine
// running (goleak.VerifyTestMain).
func Main(m *testing.M, isWorker func() bool, runWorker func() int) {
	if isWorker() {
		os.Exit(runWorker())
	}
	goleak.VerifyTestMain(m)
}

// Start starts a comparison with start, whose workers are the test
// binary (argv: it re-executes itself running no test, and its TestMain
// hands over to the worker), and closes it by tb.Cleanup; it fails tb if
// either fails.
func Start[C io.Closer](tb testing.TB, start func(argv []string) (C, error)) C {
	tb.Helper()
	c, err := start([]string{os.Args[0], "-test.run=^$"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := c.Close(); err != nil {
			tb.Error(err)
		}
	})
	return c
}

// FIFOAcrossProcesses checks that the grant-order scenario, run twice,
// sees no grant out of order for the first lock (fairlock's), and that
// the hand-off scenario completes for every lock.
func FIFOAcrossProcesses(t *testing.T, c *proccmp.Comparison) {
	t.Helper()
	names := c.Names()
	ctx := context.Background()
	for range 2 {
		n, err := c.GrantOrder(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("%s: %d of %d grants out of order", names[0], n, c.Config().Waiters)
		}
	}
	for impl, name := range names {
		if _, err := c.HandOffs(ctx, impl, c.Holds(1)); err != nil {
			t.Errorf("%s: hand-off: %v", name, err)
		}
	}
}

// HolderKilled checks that after the holder's process is killed at once
// after its grant, each lock's waiter is granted, within three TTLs: a
// TTL and a third at most (the TTL, and fairlock's re-read of its queue
// every third of it), with a margin for a loaded machine.
func HolderKilled(t *testing.T, c *proccmp.Comparison) {
	t.Helper()
	names := c.Names()
	ttl := c.Config().TTL
	for impl, name := range names {
		d, ok, err := c.HolderDies(context.Background(), impl, 0)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !ok {
			t.Errorf("%s: the waiter gave up", name)
		} else if d > 3*ttl {
			t.Errorf("%s: granted %v after the kill, want within about %v", name, d, ttl+ttl/3)
		}
	}
}

// Benchmark runs every scenario of c (Run) once per iteration, and
// reports, from the last run, each lock's figure of each row as a metric
// (proccmp.Results.Metrics).
func Benchmark(b *testing.B, c *proccmp.Comparison) {
	var r *proccmp.Results
	for b.Loop() {
		var err error
		if r, err = c.Run(context.Background(), nil); err != nil {
			b.Fatal(err)
		}
	}
	for _, m := range r.Metrics() {
		b.ReportMetric(m.Value, m.Unit)
	}
}
