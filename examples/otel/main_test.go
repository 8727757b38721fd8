package main

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRunExportsEveryInstrument checks the JSON export names every
// instrument and the summary after it counts every call.
func TestRunExportsEveryInstrument(t *testing.T) {
	var out strings.Builder
	cfg := config{workers: 4, rounds: 20, timeout: 300 * time.Microsecond, hold: 50 * time.Microsecond, export: true}
	if err := run(&out, cfg); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		`"Name": "fairlock.lock.acquisitions"`, `"Name": "fairlock.lock.wait.duration"`,
		`"Name": "fairlock.lock.hold.duration"`, `"Name": "fairlock.lock.held"`,
		`"Name": "fairlock.lock.waiters"`, `"Value": "accounts"`, `"Value": "acquired"`,
		"\nsummary: 80 Lock calls on locker \"accounts\" (4 workers × 20), by fairlock.result:\n",
		"gauges when collected, after the work: fairlock.lock.held 0, fairlock.lock.waiters 0\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if i, j := strings.Index(got, `"Name": "fairlock.lock.acquisitions"`), strings.Index(got, "\nsummary: "); i < 0 || j < i {
		t.Errorf("the summary does not follow the export:\n%s", got)
	}
	// A give-up gets the line that says it is on purpose; none without one.
	if strings.Contains(got, "  deadline_exceeded ") != strings.Contains(got, "deadline_exceeded is on purpose") {
		t.Errorf("deadline_exceeded and its explanation do not come together:\n%s", got[strings.Index(got, "\nsummary: "):])
	}
}

// TestRunWithoutDeadline: with no deadline every call acquires, and
// without -export only the summary is printed.
func TestRunWithoutDeadline(t *testing.T) {
	var out strings.Builder
	if err := run(&out, config{workers: 4, rounds: 25, hold: 10 * time.Microsecond}); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if strings.Contains(got, `"Name"`) {
		t.Errorf("JSON printed without -export:\n%s", got)
	}
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "summary: 100 Lock calls") ||
		!strings.HasPrefix(strings.TrimSpace(lines[1]), "acquired ") || !strings.Contains(lines[1], " 100 calls ") ||
		!strings.HasPrefix(lines[2], "gauges ") {
		t.Errorf("want the heading, one acquired line and the gauges; got:\n%s", got)
	}
}
