package etcdlock_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"github.com/fairlock/fairlock/etcdlock/internal/testhook"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// The benchmarks measure etcdlock beside etcd's own concurrency.Mutex on
// one embedded server, alternating the two within each iteration so that
// both see the same machine and the same server state. Run them with a
// count of iterations, not a duration: a concurrency.Mutex hand-off takes
// about 100 ms.
//
//	go test -run '^$' -bench . -benchtime 200x

// mutexLock is one lock implementation under benchmark: lock blocks
// until it holds key and returns the function that unlocks it.
type mutexLock interface {
	lock(ctx context.Context, key string) (unlock func(), err error)
}

type etcdlockImpl struct{ l *etcdlock.Locker }

func (e etcdlockImpl) lock(ctx context.Context, key string) (func(), error) {
	g, err := e.l.Lock(ctx, key)
	if err != nil {
		return nil, err
	}
	return func() { _ = g.Unlock(ctx) }, nil
}

// etcdMutex is etcd's concurrency.Mutex with one session per
// implementation, as its users make it (one Mutex per Lock call: a Mutex
// is not reusable concurrently).
type etcdMutex struct{ s *concurrency.Session }

func (e etcdMutex) lock(ctx context.Context, key string) (func(), error) {
	m := concurrency.NewMutex(e.s, "/mutex/"+key)
	if err := m.Lock(ctx); err != nil {
		return nil, err
	}
	return func() { _ = m.Unlock(ctx) }, nil
}

// benchSetup starts a server and returns, for each implementation, a
// holder side and a waiter side on separate clients (as two processes
// would have).
func benchSetup(b *testing.B) (client *clientv3.Client, holders, waiters [2]mutexLock) {
	srv := etcdtest.StartServer(b)
	client = srv.Client(b)
	for i := range 2 {
		c := srv.Client(b)
		l, err := etcdlock.New(c, "/etcdlock")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = l.Close(context.Background()) })
		s, err := concurrency.NewSession(c)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = s.Close() })
		if i == 0 {
			holders = [2]mutexLock{etcdlockImpl{l}, etcdMutex{s}}
		} else {
			waiters = [2]mutexLock{etcdlockImpl{l}, etcdMutex{s}}
		}
	}
	return client, holders, waiters
}

// bind returns m's lock of key as an etcdtest.LockFunc.
func bind(m mutexLock, key string) etcdtest.LockFunc {
	return func(ctx context.Context) (func(), error) { return m.lock(ctx, key) }
}

var implNames = [2]string{"etcdlock", "mutex"}
var implPrefixes = [2]string{"/etcdlock/", "/mutex/"}

// BenchmarkHandOff measures the hand-off to a freshly queued waiter: a
// holder holds the key, a waiter on another client calls Lock, and as
// soon as the waiter's key is visible in etcd the holder unlocks. The
// hand-off is the time from the holder's Unlock call to the waiter's Lock
// return. It reports the median and 99th percentile for etcdlock and for
// concurrency.Mutex, and etcdlock's divided by the Mutex's.
func BenchmarkHandOff(b *testing.B) {
	client, holders, waiters := benchSetup(b)
	ctx := context.Background()
	var samples [2][]time.Duration
	for b.Loop() {
		for i := range 2 {
			d, err := etcdtest.HandOff(ctx, client, bind(holders[i], "k"), bind(waiters[i], "k"), implPrefixes[i]+"k/")
			if err != nil {
				b.Fatal(err)
			}
			samples[i] = append(samples[i], d)
		}
	}
	reportQuantiles(b, samples, "handoff")
}

// BenchmarkUncontended measures Lock+Unlock of a free key: etcdlock's and
// concurrency.Mutex's (on a session made beforehand), and their ratio.
func BenchmarkUncontended(b *testing.B) {
	_, holders, _ := benchSetup(b)
	ctx := context.Background()
	var samples [2][]time.Duration
	for b.Loop() {
		for i := range 2 {
			start := time.Now()
			unlock, err := holders[i].lock(ctx, "free")
			if err != nil {
				b.Fatal(err)
			}
			unlock()
			samples[i] = append(samples[i], time.Since(start))
		}
	}
	reportQuantiles(b, samples, "lock+unlock")
}

// reportQuantiles reports each implementation's mean, median and 99th
// percentile in milliseconds, and etcdlock's over the Mutex's.
func reportQuantiles(b *testing.B, samples [2][]time.Duration, what string) {
	var mean, p50, p99 [2]float64
	for i, s := range samples {
		var sum time.Duration
		for _, d := range s {
			sum += d
		}
		mean[i] = float64(sum) / float64(len(s)) / float64(time.Millisecond)
		slices.Sort(s)
		p50[i] = float64(etcdtest.Quantile(s, 0.50)) / float64(time.Millisecond)
		p99[i] = float64(etcdtest.Quantile(s, 0.99)) / float64(time.Millisecond)
		b.ReportMetric(mean[i], implNames[i]+"-"+what+"-mean-ms")
		b.ReportMetric(p50[i], implNames[i]+"-"+what+"-p50-ms")
		b.ReportMetric(p99[i], implNames[i]+"-"+what+"-p99-ms")
	}
	b.ReportMetric(mean[0]/mean[1], "mean-ratio")
	b.ReportMetric(p50[0]/p50[1], "p50-ratio")
	b.ReportMetric(p99[0]/p99[1], "p99-ratio")
}

// BenchmarkWaitsReleased: a holder's release with 200 Waits queued
// behind it through four Lockers on clients of their own: the time from
// its Unlock to the return of the last Wait (ns/op, ms/release), beside
// the release with one Wait queued (ms/release-of-1) and
// a round trip to the server (a linearizable Get of one key,
// ms/round-trip), medians of interleaved runs, and their ratios;
// in-process, the same on one fairlock.Locker (disttest.WaitsReleased).
//
//	go test -run '^$' -bench WaitsReleased -benchtime 20x
func BenchmarkWaitsReleased(b *testing.B) {
	const waits = 200
	b.Run("in-process", func(b *testing.B) { disttest.WaitsReleasedInProcess(b, waits) })
	b.Run("etcd", func(b *testing.B) {
		srv := etcdtest.StartServer(b)
		admin := srv.Client(b)
		var ls []keylock.Locker
		for range 5 {
			ls = append(ls, newLocker(b, srv.Client(b), "/bench"))
		}
		// A call counts once its key is written and its Locker has read
		// what it waits for: the release is timed from a settled queue,
		// not while the last Waits still read theirs.
		calls := func(key string) int {
			n := countUnder(b, admin, rangeUnder("/bench", key))
			for _, l := range ls {
				n -= testhook.Unsettled(l, key)
			}
			return n
		}
		disttest.WaitsReleased(b, waits, ls, calls, func(ctx context.Context) error {
			_, err := admin.Get(ctx, "/round-trip")
			return err
		})
	})
}
