package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRunReports runs the demo briefly and checks that its report has every
// row, served requests on both sides, no failures, a mid-run dump, and no
// key left held.
func TestRunReports(t *testing.T) {
	var out strings.Builder
	cfg := config{duration: 300 * time.Millisecond, clients: 8, keys: 50, skew: 2, steps: 4, hold: 20 * time.Microsecond}
	if err := run(context.Background(), cfg, &out); err != nil {
		t.Fatal(err)
	}
	report := out.String()
	for _, want := range []string{
		"requests served", "throughput (req/s)", "Jain index", "p50", "p99", "max",
		"fairlock keys held after the run: 0",
		`debug.Dump taken mid-run under load`, `fairlock "orders"`,
	} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	for _, line := range strings.Split(report, "\n") {
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(strings.TrimSpace(line), "requests served"):
			if f[2] == "0" || f[3] == "0" {
				t.Errorf("an implementation served nothing: %q", line)
			}
		case strings.HasPrefix(strings.TrimSpace(line), "requests failed"):
			if f[2] != "0" || f[3] != "0" {
				t.Errorf("requests failed: %q", line)
			}
		}
	}
}

func TestJain(t *testing.T) {
	if got := jain([]float64{5, 5, 5, 5}); got != 1 {
		t.Errorf("jain(even) = %v, want 1", got)
	}
	if got := jain([]float64{8, 0, 0, 0}); got != 0.25 {
		t.Errorf("jain(one takes all) = %v, want 1/n = 0.25", got)
	}
}
