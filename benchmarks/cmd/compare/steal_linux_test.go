package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestStealClock checks the steal time compare prints against the kernel's
// account read by hand: the eighth number of /proc/stat's "cpu" line, in
// hundredths of a second (proc(5)). A read through the clock must fall
// between two reads by hand, and a span over it is never negative.
func TestStealClock(t *testing.T) {
	byHand := func() time.Duration {
		t.Helper()
		b, err := os.ReadFile("/proc/stat")
		if err != nil {
			t.Fatal(err)
		}
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		if len(f) < 9 || f[0] != "cpu" {
			t.Fatalf("unexpected first line of /proc/stat: %q", line)
		}
		ticks, err := strconv.ParseInt(f[8], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return time.Duration(ticks) * 10 * time.Millisecond
	}
	c := newStealClock()
	if !c.ok {
		t.Fatal("steal time not readable through /proc on Linux")
	}
	span := c.start()
	before := byHand()
	got, ok := c.read()
	after := byHand()
	// procfs divides the ticks by 100 as a float: allow a rounding error.
	if !ok || got < before-time.Microsecond || got > after+time.Microsecond {
		t.Fatalf("steal time read %v (%v), want it between %v and %v read by hand", got, ok, before, after)
	}
	if d, ok := span.stop(); !ok || d < 0 {
		t.Fatalf("steal over a span = %v, %v", d, ok)
	}
	if got := (hostSteal{}).String(); !strings.Contains(got, "not read") {
		t.Errorf("an unread steal time prints %q", got)
	}
}
