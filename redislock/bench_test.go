package redislock_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	"github.com/fairlock/fairlock/redislock/redistest"
)

// The benchmarks run against a real redis-server on loopback. The
// comparison with redsync and bsm/redislock belongs in benchmarks/, which
// may require peers; the cluster demo prints redsync's hand-off beside
// redislock's.
//
//	go test -run '^$' -bench . -benchtime 2000x

// BenchmarkLockUnlock: an uncontended Lock and Unlock, two scripts (two
// round trips).
func BenchmarkLockUnlock(b *testing.B) {
	c := redistest.Start(b)
	l := newLocker(b, c, "bench")
	ctx := context.Background()
	for b.Loop() {
		g, err := l.Lock(ctx, "k")
		if err != nil {
			b.Fatal(err)
		}
		if err := g.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHandOff: the time from a holder's Unlock to the return of a
// Lock queued behind it through another Locker on another client: the
// release script, its notice on the prefix's channel, and the waiter's
// wake-up. It reports the median and the 99th percentile as p50-ns and
// p99-ns.
func BenchmarkHandOff(b *testing.B) {
	srv := redistest.StartServer(b)
	c := srv.NewClient(b)
	holder, waiter := newLocker(b, srv.NewClient(b), "bench"), newLocker(b, srv.NewClient(b), "bench")
	ctx := context.Background()
	var samples []time.Duration
	for b.Loop() {
		g, err := holder.Lock(ctx, "k")
		if err != nil {
			b.Fatal(err)
		}
		got := make(chan time.Time, 1)
		go func() {
			w, err := waiter.Lock(ctx, "k")
			got <- time.Now()
			if err != nil {
				b.Error(err)
				return
			}
			w.Unlock(ctx)
		}()
		awaitQueue(b, c, "bench", "k", 2, 10*time.Second)
		start := time.Now()
		if err := g.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
		samples = append(samples, (<-got).Sub(start))
		awaitQueue(b, c, "bench", "k", 0, 10*time.Second)
	}
	slices.Sort(samples)
	b.ReportMetric(float64(samples[len(samples)/2]), "p50-ns")
	b.ReportMetric(float64(samples[len(samples)*99/100]), "p99-ns")
}

// BenchmarkWaitsReleased: a holder's release with 200 Waits queued
// behind it through four Lockers on clients of their own: the time from
// its Unlock to the return of the last Wait (ns/op, ms/release), beside
// the release with one Wait queued (ms/release-of-1) and
// a round trip to the server (a PING, ms/round-trip), medians of
// interleaved runs, and their ratios; in-process, the same on one
// fairlock.Locker (disttest.WaitsReleased).
//
//	go test -run '^$' -bench WaitsReleased -benchtime 20x
func BenchmarkWaitsReleased(b *testing.B) {
	const waits = 200
	b.Run("in-process", func(b *testing.B) { disttest.WaitsReleasedInProcess(b, waits) })
	b.Run("redis", func(b *testing.B) {
		srv := redistest.StartServer(b)
		admin := srv.NewClient(b)
		var ls []keylock.Locker
		for range 5 {
			ls = append(ls, newLocker(b, srv.NewClient(b), "bench"))
		}
		calls := func(key string) int { return queueLen(b, admin, "bench", key) }
		disttest.WaitsReleased(b, waits, ls, calls, func(ctx context.Context) error { return admin.Ping(ctx).Err() })
	})
}
