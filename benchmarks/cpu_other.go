//go:build !unix

package benchmarks

import "time"

// processCPU reports that this platform's process CPU time is not read
// here (getrusage(2) is Unix only).
func processCPU() (time.Duration, bool) { return 0, false }
