package main

import (
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/benchmarks"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestMaxWaitShape checks that the line under the targets tells the three
// shapes of fairlock's longest wait apart, at the FIFO bound of G-1 grants.
func TestMaxWaitShape(t *testing.T) {
	waits := []time.Duration{80 * time.Microsecond, 3 * time.Millisecond}
	for _, c := range []struct {
		grants int
		pause  time.Duration
		want   string
	}{
		{32, 100 * time.Microsecond, "held up before it joined the queue (32 grants"},
		{31, 2 * time.Millisecond, "in the queue through a stall of the whole run (no grant anywhere for 2.00ms of it)"},
		{31, 100 * time.Microsecond, "in the queue (31 grants; longest interval without one 100.0µs)"},
	} {
		got := maxWaitShape(benchmarks.Contended{Goroutines: 32, Waits: waits, GrantsInMaxWait: c.grants, PauseInMaxWait: c.pause})
		if !strings.HasPrefix(got, "3.00ms, ") || !strings.Contains(got, c.want) {
			t.Errorf("maxWaitShape(%d grants, pause %v) = %q, want 3.00ms and %q", c.grants, c.pause, got, c.want)
		}
	}
}
