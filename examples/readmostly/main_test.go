package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSharedReadsOverlap runs both workloads briefly: with Lock for all,
// one reader holds at a time; with RLock, several do; no writer ever holds
// beside anyone; and the report has every row.
func TestSharedReadsOverlap(t *testing.T) {
	var out strings.Builder
	if err := run(config{duration: 300 * time.Millisecond, clients: 16, writes: 10, hold: 200 * time.Microsecond}, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	report := out.String()
	for _, want := range []string{"reads/s", "writes/s", "writer wait p99", "writer wait max", "shared holds served"} {
		if !strings.Contains(report, want) {
			t.Errorf("report lacks %q:\n%s", want, report)
		}
	}
	for _, line := range strings.Split(report, "\n") {
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "most readers holding at once"):
			excl, _ := strconv.Atoi(f[len(f)-2])
			shared, _ := strconv.Atoi(f[len(f)-1])
			if excl != 1 || shared < 2 {
				t.Errorf("readers at once: %d with Lock (want 1), %d with RLock (want several)", excl, shared)
			}
		case strings.HasPrefix(line, "a writer beside a holder"):
			if f[len(f)-1] != "0" || f[len(f)-2] != "0" {
				t.Errorf("a writer held beside another holder: %q", line)
			}
		case strings.HasPrefix(line, "writes/s"):
			if f[len(f)-1] == "0" || f[len(f)-2] == "0" {
				t.Errorf("writers starved: %q", line)
			}
		}
	}
	t.Log(report)
}
