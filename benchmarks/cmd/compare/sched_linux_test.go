package main

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// TestScheduler checks the policy compare prints against the kernel's
// other account of it, the policy field of /proc/thread-self/stat (field
// 41, proc(5)), read on the same thread. Run it under chrt -f 1 to cover
// the realtime branch.
func TestScheduler(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b, err := os.ReadFile("/proc/thread-self/stat")
	if err != nil {
		t.Fatalf("the policy to check against: %v", err)
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces; the first of them is field 3.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	policy, err := strconv.Atoi(fields[41-3])
	if err != nil {
		t.Fatalf("policy field %q: %v", fields[41-3], err)
	}
	want := map[int]string{0: "SCHED_OTHER", 1: "SCHED_FIFO", 2: "SCHED_RR", 3: "SCHED_BATCH", 5: "SCHED_IDLE", 6: "SCHED_DEADLINE", 7: "SCHED_EXT"}[policy]
	name, realtime := scheduler()
	if want == "" || !strings.HasPrefix(name, want) {
		t.Errorf("scheduler() = %q; /proc says policy %d (%s)", name, policy, want)
	}
	if wantRT := policy == 1 || policy == 2; realtime != wantRT {
		t.Errorf("scheduler() realtime = %v for policy %d", realtime, policy)
	}
	t.Logf("%s, realtime %v", name, realtime)
}
