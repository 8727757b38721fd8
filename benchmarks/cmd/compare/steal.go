package main

import (
	"time"

	"github.com/prometheus/procfs"
)

// Steal time is how long the hypervisor ran something else while this
// machine's virtual CPUs had work to do: the steal column of /proc/stat,
// summed over the CPUs (0 on bare metal). Nothing else inside the guest
// sees a stopped virtual CPU. compare prints it with every run so that a
// series shows how much the host disturbed it; it counts how long, not
// when, so it does not tell which run a stall decided ("A second host" in
// docs/performance.md).

// stealClock reads the machine's total steal time. Its zero value reads
// nothing (not Linux, or no /proc).
type stealClock struct {
	fs procfs.FS
	ok bool
}

func newStealClock() stealClock {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return stealClock{}
	}
	c := stealClock{fs: fs, ok: true}
	if _, ok := c.read(); !ok {
		return stealClock{}
	}
	return c
}

// read returns the steal time summed over the CPUs since boot, and false
// if it cannot be read.
func (c stealClock) read() (time.Duration, bool) {
	if !c.ok {
		return 0, false
	}
	st, err := c.fs.Stat()
	if err != nil {
		return 0, false
	}
	return time.Duration(st.CPUTotal.Steal * float64(time.Second)), true
}

// stealSpan measures the steal time over a span of the run.
type stealSpan struct {
	clock stealClock
	start time.Duration
	ok    bool
}

func (c stealClock) start() stealSpan {
	t, ok := c.read()
	return stealSpan{clock: c, start: t, ok: ok}
}

// stop returns the steal time since start, and false if it could not be
// read at either end.
func (s stealSpan) stop() (time.Duration, bool) {
	t, ok := s.clock.read()
	if !ok || !s.ok {
		return 0, false
	}
	return t - s.start, true
}

// hostSteal is the steal time over one run of compare and over its G=32
// hot-key runs, where the thinnest bars are measured.
type hostSteal struct {
	run, hot32 time.Duration
	ok         bool
}

func (h hostSteal) String() string {
	if !h.ok {
		return "host steal time not read on this machine"
	}
	// /proc/stat counts in hundredths of a second.
	return "host steal time " + h.run.Round(10*time.Millisecond).String() + " over the run, " +
		h.hot32.Round(10*time.Millisecond).String() + " in its G=32 hot-key runs"
}
