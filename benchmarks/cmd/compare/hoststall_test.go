package main

import (
	"sync/atomic"
	"testing"
	"time"
)

// TestClockStall checks that the probe reports the longest interval
// between two reads of the clock: a fake clock that advances 1µs a read,
// and 5ms once, at the 500th read.
func TestClockStall(t *testing.T) {
	base := time.Now()
	var reads atomic.Int64
	fake := func() time.Time {
		n := reads.Add(1)
		at := time.Duration(n) * time.Microsecond
		if n >= 500 {
			at += 5 * time.Millisecond
		}
		return base.Add(at)
	}
	if got, want := clockStall(20*time.Millisecond, 1, fake), 5*time.Millisecond+time.Microsecond; got != want {
		t.Errorf("clockStall with one 5ms jump of a 1µs-a-read clock = %v, want %v", got, want)
	}
	if n := reads.Load(); n < 15_000 {
		t.Errorf("clockStall stopped after %d reads (%v of the fake clock), want about 20ms of it", n, time.Duration(n)*time.Microsecond+5*time.Millisecond)
	}
}

// TestClockStallRealClock runs the probe on two threads of the real
// clock: it lasts at least as long as asked, and the longest interval it
// reports lies within that time.
func TestClockStallRealClock(t *testing.T) {
	start := time.Now()
	got := clockStall(20*time.Millisecond, 2, time.Now)
	took := time.Since(start)
	if took < 20*time.Millisecond {
		t.Errorf("clockStall(20ms) returned after %v", took)
	}
	if got <= 0 || got > took {
		t.Errorf("clockStall(20ms) = %v, want a positive interval within the %v it ran", got, took)
	}
}
