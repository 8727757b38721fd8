package redislock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
)

// Who holds a key, from any process, and package elect, on Redis: the
// listing (Locker.Calls) and the debug view's calls ahead, read in this
// process of calls made by worker processes (the test binary
// re-executed, process_test.go), and elections among worker processes
// that a fenced store in this process checks. The scenarios are
// disttest's; what is Redis's alone stays here.

// TestHoldersAcrossProcesses: a Locker lists a key's calls in grant order
// across processes: the holder in a worker process with its flow's label,
// its host and pid and its Locker's name, its token and age; then this
// process's waiter with its label and no token. Once the worker is
// killed, its call leaves the listing after its session expires, and
// nothing of the key is left in Redis.
func TestHoldersAcrossProcesses(t *testing.T) {
	srv := redistest.StartServer(t)
	const prefix = "holders"
	disttest.HoldersAcrossProcesses(t, newBackend(t, srv), prefix)
	// Labels go with their entries: nothing of the key is left.
	c := srv.NewClient(t)
	if n, err := c.Exists(context.Background(), strings.TrimSuffix(redislock.QueueKey(prefix, "k"), "q")+"l").Result(); err != nil || n != 0 {
		t.Fatalf("the label hash: %d, %v; want gone", n, err)
	}
}

// TestHoldersModesAndUnits: shared holds, a queued Wait and a
// Semaphore's units are listed with their modes and units.
func TestHoldersModesAndUnits(t *testing.T) {
	c := redistest.Start(t)
	disttest.ListedModes(t, newLocker(t, c, "modes"))

	ctx := context.Background()
	s, err := redislock.NewSemaphore(c, "units", 5, redislock.WithTTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	a, err := s.Acquire(ctx, "k", 3)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Unlock(ctx)
	calls, err := s.Calls(ctx, "k")
	if err != nil || len(calls) != 1 || calls[0].Mode != keylock.ModeUnits || calls[0].Units != 3 || calls[0].Token != a.Token() {
		t.Fatalf("a Semaphore's listing: %+v, %v", calls, err)
	}
}

// TestDebugNamesHolderInOtherProcess: the debug dump of a Locker whose
// call waits on a key held in a worker process names that holder: its
// label, host:pid and Locker, its token; the JSON form carries the same.
func TestDebugNamesHolderInOtherProcess(t *testing.T) {
	disttest.DebugNamesHolderInOtherProcess(t, newBackend(t, redistest.StartServer(t)), "debug-ahead")
}

// TestElectPausedLeaderNeverActsAfterDeadline: the leader process is
// stopped (SIGSTOP) past its TTL while acting every 5 ms, and the next
// candidate, in another process, takes over and acts; resumed (SIGCONT),
// the old leader says its term ended and acts no more: the fenced store
// in this process never sees an action of the old term after one of the
// new. A process that does not campaign reads each leader's value,
// token and pid.
func TestElectPausedLeaderNeverActsAfterDeadline(t *testing.T) {
	disttest.ElectPausedLeader(t, newBackend(t, redistest.StartServer(t)), "elect-pause")
}

// TestElectKilledLeaderReplaced: the leader process is killed; the next
// candidate leads within the TTL plus the re-read period (TTL/3) plus a
// margin for a loaded machine, the bound docs/election.md gives.
func TestElectKilledLeaderReplaced(t *testing.T) {
	disttest.ElectKilledLeader(t, newBackend(t, redistest.StartServer(t)), "elect-kill", testTTL+testTTL/3+2*time.Second)
}

// TestElectResignAndObserve: a process that does not campaign observes
// the election while candidates in worker processes lead, resign with a
// candidate queued (who leads at once, pushed, well within the re-read
// period), resign with none (a vacancy), and campaign again; its stream
// shows every one of those states, in order.
func TestElectResignAndObserve(t *testing.T) {
	disttest.ElectResignAndObserve(t, newBackend(t, redistest.StartServer(t)), "elect-observe")
}
