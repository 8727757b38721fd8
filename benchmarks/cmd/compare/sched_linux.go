package main

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// scheduler names the kernel scheduling policy compare runs under, for
// the header of its output: the policy decides how long a runnable thread
// can wait for a CPU, which the hot-key maxima measure (see "The
// scheduling class" in docs/performance.md). realtime reports whether it
// is SCHED_FIFO or SCHED_RR.
func scheduler() (name string, realtime bool) {
	a, err := unix.SchedGetAttr(0, 0) // the calling thread: every thread of a chrt-started process inherits it
	if err != nil {
		return fmt.Sprintf("scheduler unknown (%v)", err), false
	}
	switch a.Policy {
	case unix.SCHED_NORMAL:
		return fmt.Sprintf("SCHED_OTHER nice %d", a.Nice), false
	case unix.SCHED_BATCH:
		return fmt.Sprintf("SCHED_BATCH nice %d", a.Nice), false
	case unix.SCHED_IDLE:
		return "SCHED_IDLE", false
	case unix.SCHED_FIFO:
		return fmt.Sprintf("SCHED_FIFO priority %d", a.Priority), true
	case unix.SCHED_RR:
		return fmt.Sprintf("SCHED_RR priority %d", a.Priority), true
	case unix.SCHED_DEADLINE:
		return "SCHED_DEADLINE", false
	case unix.SCHED_EXT:
		return "SCHED_EXT", false
	}
	return fmt.Sprintf("scheduling policy %d", a.Policy), false
}
