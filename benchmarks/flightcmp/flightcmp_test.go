package flightcmp

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/benchmarks/internal/proccmp/proccmptest"
	"github.com/fairlock/fairlock/redislock/redistest"
)

// The test binary is also the comparison's worker: Start re-executes it
// with the worker's environment, and TestMain hands over to RunWorker.
func TestMain(m *testing.M) { proccmptest.Main(m, IsWorker, RunWorker) }

// start starts a redis-server and a comparison on it with the Quick
// configuration, both stopped by tb.Cleanup.
func start(tb testing.TB) *Comparison {
	tb.Helper()
	srv := redistest.StartServer(tb)
	return proccmptest.Start(tb, func(argv []string) (*Comparison, error) {
		return Start(srv.Addr(), argv, Quick)
	})
}

// TestFillsPerExpiry: an expiry under every worker's requests costs
// flight one fill and singleflight one per process, and every request is
// answered.
func TestFillsPerExpiry(t *testing.T) {
	c := start(t)
	cfg := c.Config()
	for impl, want := range [numImpls]int{Flight: 1, Singleflight: cfg.Procs} {
		fills, lat, err := c.Expiry(context.Background(), impl)
		if err != nil {
			t.Fatalf("%s: %v", Names[impl], err)
		}
		if fills != want {
			t.Errorf("%s: %d fills for one expiry, want %d", Names[impl], fills, want)
		}
		if len(lat) != cfg.Procs*cfg.Requests {
			t.Errorf("%s: %d requests answered, want %d", Names[impl], len(lat), cfg.Procs*cfg.Requests)
		}
	}
}

// BenchmarkFlightCompare runs one Quick comparison per iteration (with
// -benchtime 1x, a second or two) and reports each implementation's
// figures as metrics: fills per expiry, latencies in µs.
//
//	go test -run '^$' -bench FlightCompare -benchtime 1x ./flightcmp
//
// cmd/flight-compare runs more rounds and prints the table.
func BenchmarkFlightCompare(b *testing.B) {
	c := start(b)
	var r *Results
	for b.Loop() {
		var err error
		if r, err = c.Run(context.Background(), nil); err != nil {
			b.Fatal(err)
		}
	}
	for row, name := range r.Rows() {
		unit, scale := strings.ReplaceAll(name, " ", "-"), 1.0
		if row != rowFills {
			unit, scale = unit+"-µs", float64(time.Microsecond)
		}
		for impl, impName := range Names {
			v := r.Stat(row, impl).Med / scale
			b.ReportMetric(v, strings.ReplaceAll(impName, "/", "-")+"-"+unit)
		}
	}
}
