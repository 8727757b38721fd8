package etcdlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	"github.com/fairlock/fairlock/owner"
)

// Who holds a key, from any process, and package elect, on etcd: the
// listing (Locker.Calls) and the debug view's calls ahead, read in this
// process of calls made by worker processes (the test binary
// re-executed, process_test.go), and elections among worker processes
// that a fenced store in this process checks. The scenarios are
// disttest's; what is etcd's alone stays here.

// TestHoldersAcrossProcesses: a Locker lists a key's calls in grant order
// across processes: the holder in a worker process with its flow's label,
// its host and pid and its Locker's name, its token and age; then this
// process's waiter with its label and no token. Once the worker is
// killed, its call leaves the listing with its lease.
func TestHoldersAcrossProcesses(t *testing.T) {
	disttest.HoldersAcrossProcesses(t, newBackend(t, etcdtest.StartServer(t)), "/holders")
}

// TestHoldersModesAndUnits: shared holds, a queued Wait and a
// Semaphore's units are listed with their modes and units.
func TestHoldersModesAndUnits(t *testing.T) {
	c := etcdtest.Start(t)
	disttest.ListedModes(t, newLocker(t, c, "/modes"))

	ctx := context.Background()
	s, err := etcdlock.NewSemaphore(c, "/units", 5, etcdlock.WithTTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	a := mustAcquire(t, ctx, s, "k", 3)
	defer a.Unlock(ctx)
	b := startAcquire(owner.NewContext(ctx), s, "k", 3)
	deadline := time.Now().Add(10 * time.Second)
	var calls []keylock.CallInfo
	for {
		calls, err = s.Calls(ctx, "k")
		if err != nil || len(calls) == 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err != nil || len(calls) != 2 || calls[0].Mode != keylock.ModeUnits || calls[0].Units != 3 || calls[0].Token != a.Token() ||
		!calls[0].Held || calls[1].Held || calls[1].Units != 3 {
		t.Fatalf("a Semaphore's listing: %+v, %v", calls, err)
	}
	mustUnlock(t, ctx, a)
	mustUnlock(t, ctx, b.granted(t, "the second Acquire"))
}

// TestDebugNamesHolderInOtherProcess: the debug dump of a Locker whose
// call waits on a key held in a worker process names that holder: its
// label, host:pid and Locker, its token; the JSON form carries the same.
func TestDebugNamesHolderInOtherProcess(t *testing.T) {
	disttest.DebugNamesHolderInOtherProcess(t, newBackend(t, etcdtest.StartServer(t)), "/debug-ahead")
}

// TestElectPausedLeaderNeverActsAfterDeadline: the leader process is
// stopped (SIGSTOP) past its TTL while acting every 5 ms, and the next
// candidate, in another process, takes over and acts; resumed (SIGCONT),
// the old leader says its term ended and acts no more: the fenced store
// in this process never sees an action of the old term after one of the
// new. A process that does not campaign reads each leader's value,
// token and pid.
func TestElectPausedLeaderNeverActsAfterDeadline(t *testing.T) {
	disttest.ElectPausedLeader(t, newBackend(t, etcdtest.StartServer(t)), "/elect-pause")
}

// TestElectKilledLeaderReplaced: the leader process is killed; the next
// candidate leads within the TTL plus the server's expiry scan and a
// commit, and a margin for a loaded machine: the bound docs/election.md
// gives.
func TestElectKilledLeaderReplaced(t *testing.T) {
	disttest.ElectKilledLeader(t, newBackend(t, etcdtest.StartServer(t)), "/elect-kill", testTTL+2*time.Second)
}

// TestElectResignAndObserve: a process that does not campaign observes
// the election while candidates in worker processes lead, resign with a
// candidate queued (who leads at once, pushed by the watch), resign with
// none (a vacancy), and campaign again; its stream shows every one of
// those states, in order.
func TestElectResignAndObserve(t *testing.T) {
	disttest.ElectResignAndObserve(t, newBackend(t, etcdtest.StartServer(t)), "/elect-observe")
}
