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
// holder of a key, through lockers (the holder's is the first; the
// Waits go round the others, or the first if it is alone). Each
// iteration takes a fresh key, queues the Waits (waiting, with the timer
// stopped, until queued(key) reports n of them queued), and times from
// the holder's Unlock call to the return of the last Wait: ns/op is that
// time. It also reports it as ms/release, and, when roundTrip is not nil,
// the median of 50 round trips to the engine measured before the
// iterations (roundTrip makes one: a PING, a read of one key) as
// ms/round-trip, and their ratio as round-trips/release.
//
// keylock's promise (adjacent Waits return together) is that it is a
// few round trips, whatever n, where a backend that released the Waits
// one after the other would take about n.
func WaitsReleased(b *testing.B, n int, lockers []keylock.Locker, queued func(key string) int, roundTrip func(context.Context) error) {
	ctx := context.Background()
	var rtt time.Duration
	if roundTrip != nil {
		rtts := make([]time.Duration, 50)
		for i := range rtts {
			start := time.Now()
			if err := roundTrip(ctx); err != nil {
				b.Fatal(err)
			}
			rtts[i] = time.Since(start)
		}
		slices.Sort(rtts)
		rtt = rtts[len(rtts)/2]
	}
	waiters := lockers
	if len(lockers) > 1 {
		waiters = lockers[1:]
	}
	var total time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		key := "waits-released/" + strconv.Itoa(i)
		h, err := lockers[0].Lock(ctx, key)
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
		deadline := time.Now().Add(time.Minute)
		for queued(key) < n {
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d Waits queued after a minute", queued(key), n)
			}
			time.Sleep(time.Millisecond)
		}
		b.StartTimer()
		released := time.Now()
		if err := h.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		wg.Wait()
		b.StopTimer()
		if werr != nil {
			b.Fatal(werr)
		}
		total += last.Sub(released)
	}
	per := total / time.Duration(b.N)
	b.ReportMetric(float64(per)/1e6, "ms/release")
	if rtt > 0 {
		b.ReportMetric(float64(rtt)/1e6, "ms/round-trip")
		b.ReportMetric(float64(per)/float64(rtt), "round-trips/release")
	}
}

// WaitsReleasedInProcess is WaitsReleased on one fairlock.Locker in this
// process (keylock.InProcess), for the figure beside a backend's.
func WaitsReleasedInProcess(b *testing.B, n int) {
	l := fairlock.New[string]()
	defer l.Close(context.Background())
	WaitsReleased(b, n, []keylock.Locker{keylock.InProcess(l)}, l.Waiters, nil)
}
