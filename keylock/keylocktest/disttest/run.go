package disttest

import "testing"

// Run runs every check of this package on a backend, each in a subtest
// of t named after it (go test -run 'TestX/ProcessPaused' runs one),
// with a Backend that newBackend makes for the subtest (a server of its
// own per check). It blocks until every check is done. The checks:
//
//   - ProcessesFIFO: four worker processes queued one after the other
//     behind a holder in this process are granted in that order, with
//     growing tokens, as a fenced store logs them.
//   - ProcessKilled: a holder process killed with SIGKILL is replaced by
//     the waiter behind it within Backend.Expiry, with a larger token;
//     the dead grant's fenced write is refused.
//   - ProcessPaused: a holder process stopped with SIGSTOP until the
//     waiter behind it is granted, then resumed, finds keylock.Valid
//     false in its first check after resuming, before its Lost closes,
//     then sees Lost close; its fenced write is refused and its Unlock
//     returns fairlock.ErrLost. Skipped where SIGSTOP is not.
//   - DeadWaiters: three waiter processes killed in the middle of a
//     queue delay the live waiter behind them by one Backend.Expiry, not
//     three.
//   - FlightOneFill and FlightFillerKilled (with Backend.Cache): 4
//     processes × 250 requests for one expired key through flight.Cache
//     cause one fill; with the filler killed mid-fill, exactly one more.
//   - DebugAndObserver (with Backend.Observed): the debug views and the
//     Observer of a Locker, and what Close does to them.
//
// A check whose Backend lacks what it needs is skipped.
func Run(t *testing.T, newBackend func(t *testing.T) Backend) {
	t.Helper()
	checks := []struct {
		name  string
		needs func(Backend) bool
		run   func(*testing.T, Backend)
	}{
		{"ProcessesFIFO", nil, processesFIFO},
		{"ProcessKilled", nil, processKilled},
		{"ProcessPaused", nil, processPaused},
		{"DeadWaiters", nil, deadWaiters},
		{"FlightOneFill", hasCache, flightOneFill},
		{"FlightFillerKilled", hasCache, flightFillerKilled},
		{"DebugAndObserver", func(b Backend) bool { return b.Observed != nil }, debugAndObserver},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			b := newBackend(t)
			if c.needs != nil && !c.needs(b) {
				t.Skip("disttest: the Backend lacks what this check needs")
			}
			c.run(t, b)
		})
	}
}

// hasCache reports whether b has what the flight checks need.
func hasCache(b Backend) bool { return b.Cache != nil }
