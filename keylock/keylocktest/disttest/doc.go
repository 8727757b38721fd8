// Package disttest holds the tests that every distributed backend of
// package keylock repeats, written once: worker processes (the test
// binary re-executed), a fenced store, holders killed or paused past
// their TTL, dead waiters, one fill of a cache across processes (package
// flight), debug views and the Observer, listings of a key's calls,
// elections (package elect), and the benchmark of Waits released
// together. keylocktest.Run checks one process's promises; this package
// checks what only several processes, or a process's view of itself, can
// show.
//
// A backend's tests run the checks (Run) with a Backend, a small adapter
// over its engine (what a worker dials, how this process makes a Locker,
// counts a key's calls and writes to a fenced store), and dispatch the
// worker processes from their TestMain:
//
//	func TestMain(m *testing.M) {
//		if w, ok := disttest.IsWorker(); ok {
//			os.Exit(runWorker(w)) // dial w.Server, make a Locker on w.Prefix with w.TTL, return w.Run(...)
//		}
//		goleak.VerifyTestMain(m)
//	}
//
//	func TestDistributed(t *testing.T) {
//		disttest.Run(t, func(t *testing.T) disttest.Backend { return newBackend(t) }) // a server per check
//	}
//
// Start and Proc serve the backend's own tests across processes too, and
// Observer its own tests of the Observer. Other scenarios are the
// backend's to call, each from a Test function of its own, with the
// prefix and bounds it chooses: the listing of a key's calls and the
// debug views across processes (HoldersAcrossProcesses, ListedModes,
// DebugNamesHolderInOtherProcess), and elections of package elect among
// worker processes (ElectPausedLeader, ElectKilledLeader,
// ElectResignAndObserve), and Observe's every term and vacancy over a
// backend that follows a key (ElectObserveEveryTerm, for a
// keylock.Follower).
//
// A worker reports on its standard output, one line per event, and the
// test reads the lines (Proc.Line, Proc.Wait); every check orders events
// by what a worker says or what the engine shows (Backend.Calls), never
// by sleeping, and bounds each wait only to fail.
//
// The package imports only the standard library and the core module's
// packages, so that a backend in a module of its own adds nothing to its
// graph by using it. Stopping and resuming a process (SIGSTOP, SIGCONT)
// needs a Unix system; elsewhere the checks that do it are skipped.
package disttest
