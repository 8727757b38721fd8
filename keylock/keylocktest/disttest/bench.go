package disttest

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
)

// WaitsReleased benchmarks one release freeing n Waits queued behind the
// holder of a key, through lockers (the holder's is the first; the Waits
// go round the others, or the first if it is alone); calls counts the
// calls holding or queued on a key, as Backend.Calls does, but a queued
// call only once its Locker is ready for the release (a backend whose
// calls read their queue after they queue counts a call once it has),
// so that the release is timed from a queue at rest. Each
// iteration measures, on fresh keys and in this order, when roundTrip is
// not nil, one round trip to the engine (roundTrip makes one: a PING, a
// read of one key), a release with one Wait queued, and a release with n
// Waits queued. The Waits queue with the timer stopped, until calls
// counts them all; a release is timed from the holder's Unlock call to
// the return of the last Wait, and the next measure waits until calls
// counts none on the key (the Waits' entries gone), so that the engine
// is idle for it. ns/op is the release of n. It reports the
// medians over the iterations, so that a machine's load in one iteration
// moves them little: ms/release (n Waits), ms/release-of-1,
// ms/round-trip, and the median of the ratios, per iteration, of the
// release of n to the release of one (x-release-of-1) and to the round
// trip (round-trips/release), and of what the release of n takes beyond
// the release of one, in round trips (round-trips-beyond-release-of-1:
// the cost of the n-1 more Waits). With roundTrip (a backend across
// processes), each iteration also releases n Waits on one fairlock.Locker
// in this process, the cost of waking n goroutines that the backend pays
// too, and it reports that release's median (ms/in-process) and the
// median, per iteration, of what the backend's release takes beyond it,
// in round trips (round-trips-beyond-in-process). Run it with a count of
// iterations (-benchtime 20x): each queues n Waits.
//
// keylock's promise (adjacent Waits return together) is that the release
// of n costs about what the release of one does, a few round trips,
// whatever n; a backend that released the Waits one after the other
// would take about n times as long.
func WaitsReleased(b *testing.B, n int, lockers []keylock.Locker, calls func(key string) int, roundTrip func(context.Context) error) {
	ctx := context.Background()
	waiters := lockers
	if len(lockers) > 1 {
		waiters = lockers[1:]
	}
	var many, one, rtts, ofOne, ofRTT, overOne, local, beyond []float64
	var inProcess func(i int) time.Duration
	if roundTrip != nil {
		l := fairlock.New[string]()
		defer l.Close(context.Background())
		lc := func(key string) int { return inProcessCalls(l, key) }
		ls := []keylock.Locker{keylock.InProcess(l)}
		inProcess = func(i int) time.Duration {
			return release(b, ctx, ls[0], ls, lc, "waits-released/in-process/"+strconv.Itoa(i), n, false)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		var rtt time.Duration
		if roundTrip != nil {
			start := time.Now()
			if err := roundTrip(ctx); err != nil {
				b.Fatal(err)
			}
			rtt = time.Since(start)
		}
		d1 := release(b, ctx, lockers[0], waiters, calls, "waits-released/one/"+strconv.Itoa(i), 1, false)
		dn := release(b, ctx, lockers[0], waiters, calls, "waits-released/"+strconv.Itoa(i), n, true)
		many, one = append(many, ms(dn)), append(one, ms(d1))
		ofOne = append(ofOne, float64(dn)/float64(d1))
		if roundTrip != nil {
			rtts = append(rtts, ms(rtt))
			ofRTT = append(ofRTT, float64(dn)/float64(rtt))
			overOne = append(overOne, float64(dn-d1)/float64(rtt))
			din := inProcess(i)
			local = append(local, ms(din))
			beyond = append(beyond, float64(dn-din)/float64(rtt))
		}
	}
	b.ReportMetric(median(many), "ms/release")
	b.ReportMetric(median(one), "ms/release-of-1")
	b.ReportMetric(median(ofOne), "x-release-of-1")
	if roundTrip != nil {
		b.ReportMetric(median(rtts), "ms/round-trip")
		b.ReportMetric(median(ofRTT), "round-trips/release")
		b.ReportMetric(median(overOne), "round-trips-beyond-release-of-1")
		b.ReportMetric(median(local), "ms/in-process")
		b.ReportMetric(median(beyond), "round-trips-beyond-in-process")
	}
}

// release locks key through holder, queues n Waits behind it through
// waiters (in turn), waits until calls(key) counts them and the holder,
// and returns the time from the holder's Unlock call to the return of
// the last Wait, once calls(key) counts none. With timed, the
// benchmark's timer runs from the Unlock to that return.
func release(b *testing.B, ctx context.Context, holder keylock.Locker, waiters []keylock.Locker, calls func(string) int, key string, n int, timed bool) time.Duration {
	h, err := holder.Lock(ctx, key)
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex // protects last and werr
	var last time.Time
	var werr error
	for j := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := waiters[j%len(waiters)].Wait(ctx, key)
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if now.After(last) {
				last = now
			}
			if err != nil && werr == nil {
				werr = err
			}
		}()
	}
	awaitCount(b, calls, key, n+1)
	if timed {
		b.StartTimer()
	}
	released := time.Now()
	if err := h.Unlock(ctx); err != nil {
		b.Fatal(err)
	}
	wg.Wait()
	if timed {
		b.StopTimer()
	}
	if werr != nil {
		b.Fatal(werr)
	}
	awaitCount(b, calls, key, 0)
	return last.Sub(released)
}

// awaitCount polls calls(key) until it is n, failing b after a minute.
func awaitCount(b *testing.B, calls func(string) int, key string, n int) {
	deadline := time.Now().Add(time.Minute)
	for calls(key) != n {
		if time.Now().After(deadline) {
			b.Fatalf("%d calls on %q after a minute, want %d", calls(key), key, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// ms returns d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// median returns the median of xs (which it sorts).
func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// WaitsReleasedInProcess is WaitsReleased on one fairlock.Locker in this
// process (keylock.InProcess), for the figure beside a backend's.
func WaitsReleasedInProcess(b *testing.B, n int) {
	l := fairlock.New[string]()
	defer l.Close(context.Background())
	calls := func(key string) int { return inProcessCalls(l, key) }
	WaitsReleased(b, n, []keylock.Locker{keylock.InProcess(l)}, calls, nil)
}

// inProcessCalls counts the calls holding or queued on key in l.
func inProcessCalls(l *fairlock.Locker[string], key string) int {
	if l.Locked(key) {
		return l.Waiters(key) + 1
	}
	return l.Waiters(key)
}
