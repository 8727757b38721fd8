package pgcmp

import (
	"context"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/pglock/pgtest"
	"go.uber.org/goleak"
)

// The test binary is also the comparison's worker: Start re-executes it
// with the worker's environment, and TestMain hands over to RunWorker.
func TestMain(m *testing.M) {
	if IsWorker() {
		os.Exit(RunWorker())
	}
	goleak.VerifyTestMain(m)
}

// start starts a PostgreSQL server and a comparison on it with the Quick
// configuration, both stopped by tb.Cleanup.
func start(tb testing.TB) *Comparison {
	tb.Helper()
	srv := pgtest.StartServer(tb)
	c, err := Start(srv.ConnString(), []string{os.Args[0], "-test.run=^$"}, Quick)
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

// BenchmarkPgCompare runs every scenario of the comparison (one round
// of the Quick configuration per iteration: with -benchtime 1x, a few
// seconds) and reports each lock's figure of each row as a metric:
// durations in µs, the rest as they are.
//
//	go test -run '^$' -bench PgCompare -benchtime 1x ./pgcmp
//
// cmd/pg-compare runs more rounds and prints the table.
func BenchmarkPgCompare(b *testing.B) {
	c := start(b)
	var r *Results
	for b.Loop() {
		var err error
		if r, err = c.Run(context.Background(), nil); err != nil {
			b.Fatal(err)
		}
	}
	for row, name := range r.Rows() {
		unit := metricName(name)
		for impl, lock := range Names {
			v := r.Stat(row, impl).Med
			if math.IsInf(v, 0) || math.IsNaN(v) {
				continue
			}
			if isDuration(row) {
				v /= float64(time.Microsecond)
			}
			b.ReportMetric(v, strings.NewReplacer("/", "-", " ", "-").Replace(lock)+"-"+unit)
		}
	}
}

// isDuration reports whether row is a duration (reported in µs).
func isDuration(row int) bool {
	return row == rowUncontended || row == rowHandOff || row == rowDies
}

// metricName is a short metric unit for a row's name.
func metricName(name string) string {
	for _, m := range []struct{ in, out string }{
		{"uncontended", "uncontended-µs"},
		{"hand-off", "handoff-µs"},
		{"grants/s", "hotkey-grants/s"},
		{"Jain", "hotkey-jain"},
		{"grant order", "out-of-order"},
		{"SIGKILL", "holder-killed-µs"},
	} {
		if strings.Contains(name, m.in) {
			return m.out
		}
	}
	return name
}

// TestOutOfOrder: a grant counts as out of order when a waiter that
// arrived before it still waits.
func TestOutOfOrder(t *testing.T) {
	for _, tc := range []struct {
		grants []int
		want   int
	}{
		{[]int{0, 1, 2, 3}, 0},
		{[]int{1, 0, 2, 3}, 1},
		{[]int{3, 2, 1, 0}, 3},
		{[]int{1, 2, 3, 0}, 3},
		{[]int{0, 2, 1, 3}, 1},
	} {
		if got := outOfOrder(tc.grants); got != tc.want {
			t.Errorf("outOfOrder(%v) = %d, want %d", tc.grants, got, tc.want)
		}
	}
}

// TestPgLockIsFIFOAcrossProcesses: the grant-order scenario sees no
// grant out of order for pglock, and the hand-off scenario completes for
// every lock, on a real server with worker processes.
func TestPgLockIsFIFOAcrossProcesses(t *testing.T) {
	c := start(t)
	ctx := context.Background()
	for range 2 {
		n, err := c.GrantOrder(ctx, PgLock)
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("pglock: %d of %d grants out of order", n, c.Config().Waiters)
		}
	}
	for impl, name := range Names {
		if _, err := c.HandOffs(ctx, impl, c.Holds(1)); err != nil {
			t.Errorf("%s: hand-off: %v", name, err)
		}
	}
}

// TestHolderKilled: after the holder's process is killed, each lock's
// waiter is granted within about a TTL and a third (pglock: the TTL, and
// its re-read of the key every third of it; the advisory locks end with
// the killed process's connections at once), with a margin for a loaded
// machine.
func TestHolderKilled(t *testing.T) {
	c := start(t)
	ttl := c.Config().TTL
	for impl, name := range Names {
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
