//go:build unix

package benchmarks

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time the whole process has used so far, user
// and system, as getrusage(2) reports it for RUSAGE_SELF: the sum over all
// of its threads, live and exited.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
