//go:build !race

package benchmarks

import (
	"testing"
	"time"
)

// Built without -race, whose instrumentation allocates (CI runs these in
// its allocation step).

// TestContendedGrantsDoNotAllocate: on a hot key, fairlock's waiters
// are recycled, so the run's allocations per grant (the figure compare
// prints) stay far below one; containerd/kmutex's waits allocate (x/sync's
// semaphore queues a channel per waiter), so its figure is not zero, which
// shows the counter counts.
func TestContendedGrantsDoNotAllocate(t *testing.T) {
	for _, impl := range Impls() {
		if impl.Name != "fairlock" && impl.Name != "containerd/kmutex" {
			continue
		}
		c := HotKey(impl, 4, 2*time.Microsecond, 50*time.Millisecond)
		perGrant := c.AllocsPerOp()
		switch {
		case !c.AllocsOK || c.Ops == 0:
			t.Errorf("%s: %d grants, allocations counted: %v", impl.Name, c.Ops, c.AllocsOK)
		case impl.Name == "fairlock" && perGrant > 0.05:
			t.Errorf("fairlock: %.3f allocations per contended grant, want about 0", perGrant)
		case impl.Name == "containerd/kmutex" && perGrant < 0.5:
			t.Errorf("containerd/kmutex: %.3f allocations per contended grant, want its waits' allocations counted", perGrant)
		}
	}
}
