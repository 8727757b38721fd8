package pglock

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BenchmarkWaitsReleased: a holder's release with 200 Waits queued
// behind it through four Lockers on pools of their own: the time from
// its Unlock to the return of the last Wait (ns/op, ms/release), beside
// the release with one Wait queued (ms/release-of-1) and a round trip to
// the server (SELECT 1, ms/round-trip), medians of interleaved runs, and
// their ratios; in-process, the same on one fairlock.Locker
// (disttest.WaitsReleased).
//
//	go test -run '^$' -bench WaitsReleased -benchtime 20x
func BenchmarkWaitsReleased(b *testing.B) {
	const waits = 200
	b.Run("in-process", func(b *testing.B) { disttest.WaitsReleasedInProcess(b, waits) })
	b.Run("postgres", func(b *testing.B) {
		srv := server(b)
		admin := srv.NewPool(b)
		if err := ensureSchema(context.Background(), admin); err != nil {
			b.Fatal(err)
		}
		prefix := "bench#" + b.Name()
		var ls []keylock.Locker
		for range 5 {
			ls = append(ls, newLocker(b, srv.NewPool(b, func(c *pgxpool.Config) { c.MaxConns = 8 }), prefix))
		}
		calls := func(key string) int { return rowsOf(b, admin, key, prefix) }
		disttest.WaitsReleased(b, waits, ls, calls, func(ctx context.Context) error {
			var one int
			return admin.QueryRow(ctx, "SELECT 1").Scan(&one)
		})
	})
}

// BenchmarkQueue: on a key with n exclusive calls queued behind its
// holder, the holder's release (which grants the next call and announces
// it) and an enqueue at the tail, as one more waiter arrives, each one
// round trip on a pool; the queue then has n waiters again, the next
// holder at its head. With readers, n readers hold the key: the oldest
// releases and a new one is granted at once; with units, a semaphore of
// one unit, the holder's and n queued. ns/op is the release and
// the enqueue together; release-µs and enqueue-µs their medians. A
// statement walks the queue from its head to the first call it does not
// grant, reading a run of readers in one step (walk.go), so both stay
// flat as n grows.
//
//	go test -run '^$' -bench Queue -benchtime 200x
func BenchmarkQueue(b *testing.B) {
	for _, c := range []struct {
		n int
		m mode
	}{{1, modeExclusive}, {100, modeExclusive}, {500, modeExclusive}, {500, modeShared}, {500, modeUnits}} {
		name := map[mode]string{modeExclusive: "waiters", modeShared: "readers", modeUnits: "units"}[c.m] + fmt.Sprintf("=%d", c.n)
		var w, size int64 // a semaphore of one unit
		if c.m == modeUnits {
			w, size = 1, 1
		}
		b.Run(name, func(b *testing.B) {
			pool, s := setup(b, 4)
			sess := newSession(b, pool, s, testTTL)
			queue := make([]callRef, 0, c.n+1)
			for range c.n + 1 {
				ref, _, _ := mustEnqueue(b, pool, s, "k", sess, c.m, w, size, false)
				queue = append(queue, ref)
			}
			var rel, enq []time.Duration
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				mustRelease(b, pool, s, "k", queue[0])
				mid := time.Now()
				ref, _, _ := mustEnqueue(b, pool, s, "k", sess, c.m, w, size, false)
				rel, enq = append(rel, mid.Sub(start)), append(enq, time.Since(mid))
				queue = append(queue[1:], ref)
			}
			b.StopTimer()
			b.ReportMetric(float64(medianOf(rel).Microseconds()), "release-µs")
			b.ReportMetric(float64(medianOf(enq).Microseconds()), "enqueue-µs")
		})
	}
}

// medianOf returns the median of d, which it sorts.
func medianOf(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}
