package otelsdktest_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/otelmetrics"
	"github.com/fairlock/fairlock/owner"
	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newObserver(t testing.TB) (fairlock.Observer, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	obs, err := otelmetrics.New(mp)
	if err != nil {
		t.Fatal(err)
	}
	return obs, reader
}

// TestBucketsAreTakenAtNew: the histograms use the WithDurationBuckets
// boundaries as they were when New was called, even through the global
// MeterProvider, which hands the instruments' options to the real
// provider only once one is set.
func TestBucketsAreTakenAtNew(t *testing.T) {
	bounds := []float64{0.001, 0.01}
	obs, err := otelmetrics.NewWithOptions(otel.GetMeterProvider(), otelmetrics.WithDurationBuckets(bounds...))
	if err != nil {
		t.Fatal(err)
	}
	bounds[0] = 0.5 // after New: must not count

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	otel.SetMeterProvider(mp)

	l := fairlock.New[string](fairlock.WithName("buckets"), fairlock.WithObserver(obs))
	g, err := l.Lock(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	g.Unlock()
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok {
				continue
			}
			for _, dp := range h.DataPoints {
				seen++
				if diff := cmp.Diff([]float64{0.001, 0.01}, dp.Bounds); diff != "" {
					t.Errorf("%s bounds (-at New +used):\n%s", m.Name, diff)
				}
			}
		}
	}
	if seen != 2 {
		t.Fatalf("%d histogram points, want wait and hold", seen)
	}
}

// TestDefaultBuckets: without the option both histograms use
// DefaultDurationBuckets, and a caller's change to that function's result
// does not reach the next New.
func TestDefaultBuckets(t *testing.T) {
	otelmetrics.DefaultDurationBuckets()[0] = 42 // a copy: changes nothing
	obs, reader := newObserver(t)
	l := fairlock.New[string](fairlock.WithName("default-buckets"), fairlock.WithObserver(obs))
	g, err := l.Lock(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	g.Unlock()
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok {
				for _, dp := range h.DataPoints {
					seen++
					if diff := cmp.Diff(otelmetrics.DefaultDurationBuckets(), dp.Bounds); diff != "" {
						t.Errorf("%s bounds (-default +used):\n%s", m.Name, diff)
					}
				}
			}
		}
	}
	if seen != 2 {
		t.Fatalf("%d histogram points, want wait and hold", seen)
	}
}

// point identifies one data point: instrument, locker and result.
type point struct{ name, locker, result string }

// collected is a reading: counter and gauge values, histogram counts and
// sums, keyed by point.
type collected struct {
	values map[point]int64
	counts map[point]uint64
	sums   map[point]float64
	scope  string
	units  map[string]string
}

func collect(t testing.TB, r *sdkmetric.ManualReader) collected {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	c := collected{values: map[point]int64{}, counts: map[point]uint64{}, sums: map[point]float64{}, units: map[string]string{}}
	key := func(name string, set attribute.Set) point {
		p := point{name: name}
		if v, ok := set.Value(otelmetrics.LockerKey); ok {
			p.locker = v.AsString()
		}
		if v, ok := set.Value(otelmetrics.ResultKey); ok {
			p.result = v.AsString()
		}
		return p
	}
	for _, sm := range rm.ScopeMetrics {
		c.scope = sm.Scope.Name + "@" + sm.Scope.Version
		for _, m := range sm.Metrics {
			c.units[m.Name] = m.Unit
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					c.values[key(m.Name, dp.Attributes)] = dp.Value
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					p := key(m.Name, dp.Attributes)
					c.counts[p] = dp.Count
					c.sums[p] = dp.Sum
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return c
}

func waitWaiters(t *testing.T, l *fairlock.Locker[string], key string, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for l.Waiters(key) != n {
		if time.Now().After(deadline) {
			t.Fatalf("Waiters(%q) never reached %d", key, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestEveryResultCountedOnce produces each result exactly once (acquired
// several times) and checks the counter and the wait histogram per result.
func TestEveryResultCountedOnce(t *testing.T) {
	obs, reader := newObserver(t)
	ctx := context.Background()
	l := fairlock.New[string](fairlock.WithName("orders"), fairlock.WithObserver(obs), fairlock.WithDeadlockDetection(), fairlock.WithLogger(discard()))

	g, err := l.Lock(ctx, "a") // acquired #1
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Lock(ctx, "a"); !errors.Is(err, fairlock.ErrReentrant) {
		t.Fatal(err)
	}
	other := owner.NewContext(ctx)
	if _, err := l.TryLock(other, "a"); !errors.Is(err, fairlock.ErrWouldBlock) {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(other)
	cancel()
	if _, err := l.Lock(cctx, "a"); !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithTimeout(other, 20*time.Millisecond)
	defer dcancel()
	timedOut := make(chan error, 1)
	go func() { _, err := l.Lock(dctx, "a"); timedOut <- err }()
	// Once the call is seen queued, its wait has started; it ends after the
	// deadline. So deadline-queued is a lower bound for the recorded wait,
	// whenever the call starts (on a loaded machine it may start late, even
	// after the deadline, and then the bound is negative and proves nothing).
	for l.Waiters("a") == 0 && dctx.Err() == nil {
		time.Sleep(100 * time.Microsecond)
	}
	queued := time.Now()
	if err := <-timedOut; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	deadline, _ := dctx.Deadline()
	leastWait := deadline.Sub(queued)
	// deadlock: other holds b and waits for a; we (holding a) ask for b.
	gb, err := l.Lock(other, "b") // acquired #2
	if err != nil {
		t.Fatal(err)
	}
	type lockResult struct {
		g   fairlock.Guard[string]
		err error
	}
	waited := make(chan lockResult, 1)
	go func() { g, err := l.Lock(other, "a"); waited <- lockResult{g, err} }()
	waitWaiters(t, l, "a", 1)
	if _, err := l.Lock(ctx, "b"); !errors.Is(err, fairlock.ErrDeadlock) {
		t.Fatalf("want ErrDeadlock, got %v", err)
	}
	g.Unlock() // hands a to other: acquired #3
	ga := <-waited
	if ga.err != nil {
		t.Fatal(ga.err)
	}
	gb.Unlock()
	ga.g.Unlock()
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Lock(ctx, "c"); !errors.Is(err, fairlock.ErrClosed) {
		t.Fatal(err)
	}

	c := collect(t, reader)
	want := map[string]int64{
		"acquired": 3, "reentrant": 1, "canceled": 1, "deadline_exceeded": 1,
		"would_block": 1, "closed": 1, "deadlock": 1,
	}
	got := map[string]int64{}
	gotWaits := map[string]int64{}
	for p, v := range c.values {
		if p.name == "fairlock.lock.acquisitions" {
			if p.locker != "orders" {
				t.Errorf("acquisitions point with locker %q", p.locker)
			}
			got[p.result] = v
		}
	}
	for p, n := range c.counts {
		if p.name == "fairlock.lock.wait.duration" {
			gotWaits[p.result] = int64(n)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("acquisitions by result (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, gotWaits); diff != "" {
		t.Errorf("wait histogram counts by result (-want +got):\n%s", diff)
	}
	if n := c.counts[point{name: "fairlock.lock.hold.duration", locker: "orders"}]; n != 3 {
		t.Errorf("hold histogram count = %d, want 3 (one per Unlock)", n)
	}
	if s := c.sums[point{"fairlock.lock.wait.duration", "orders", "deadline_exceeded"}]; s < leastWait.Seconds() {
		t.Errorf("deadline_exceeded wait sum = %vs, want at least %v (from seeing the call queued to the deadline)", s, leastWait)
	}
	if c.scope != otelmetrics.ScopeName+"@"+otelmetrics.Version {
		t.Errorf("scope = %q", c.scope)
	}
	for p := range c.values {
		if p.name == "fairlock.lock.held" {
			t.Errorf("a closed Locker still reports gauges: %v", p)
		}
	}
}

// TestInvalidKeyCounted: a key refused with ErrInvalidKey is counted under
// result invalid_key, with a zero wait, and not as canceled.
func TestInvalidKeyCounted(t *testing.T) {
	obs, reader := newObserver(t)
	ctx := context.Background()
	l := fairlock.New[float64](fairlock.WithName("floats"), fairlock.WithObserver(obs))
	if _, err := l.Lock(ctx, math.NaN()); !errors.Is(err, fairlock.ErrInvalidKey) {
		t.Fatalf("Lock(NaN) = %v, want ErrInvalidKey", err)
	}
	c := collect(t, reader)
	got := map[string]int64{}
	for p, v := range c.values {
		if p.name == "fairlock.lock.acquisitions" && p.locker == "floats" {
			got[p.result] = v
		}
	}
	if diff := cmp.Diff(map[string]int64{"invalid_key": 1}, got); diff != "" {
		t.Errorf("acquisitions by result (-want +got):\n%s", diff)
	}
	wait := point{"fairlock.lock.wait.duration", "floats", "invalid_key"}
	if c.counts[wait] != 1 || c.sums[wait] != 0 {
		t.Errorf("invalid_key wait histogram: count %d, sum %vs; want 1 and 0", c.counts[wait], c.sums[wait])
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestGaugesTrackHeldAndWaitersPerLocker: gauges follow held keys and
// waiters up and down, two Lockers stay apart, and a closed one stops.
func TestGaugesTrackHeldAndWaitersPerLocker(t *testing.T) {
	obs, reader := newObserver(t)
	ctx := context.Background()
	a := fairlock.New[string](fairlock.WithName("a"), fairlock.WithObserver(obs))
	b := fairlock.New[string](fairlock.WithName("b"), fairlock.WithObserver(obs))
	gauges := func() map[point]int64 {
		out := map[point]int64{}
		for p, v := range collect(t, reader).values {
			if p.name != "fairlock.lock.acquisitions" {
				out[p] = v
			}
		}
		return out
	}
	held := func(l string) point { return point{"fairlock.lock.held", l, ""} }
	waiting := func(l string) point { return point{"fairlock.lock.waiters", l, ""} }

	g1, _ := a.Lock(ctx, "k1")
	g2, _ := a.Lock(ctx, "k2")
	done := make(chan fairlock.Guard[string])
	go func() { g, _ := a.Lock(owner.NewContext(ctx), "k1"); done <- g }()
	waitWaiters(t, a, "k1", 1)
	g3, _ := b.Lock(ctx, "k1")
	want := map[point]int64{held("a"): 2, waiting("a"): 1, held("b"): 1, waiting("b"): 0}
	if diff := cmp.Diff(want, gauges()); diff != "" {
		t.Fatalf("gauges while busy (-want +got):\n%s", diff)
	}
	g1.Unlock()
	(<-done).Unlock()
	g2.Unlock()
	want = map[point]int64{held("a"): 0, waiting("a"): 0, held("b"): 1, waiting("b"): 0}
	if diff := cmp.Diff(want, gauges()); diff != "" {
		t.Fatalf("gauges after a drained (-want +got):\n%s", diff)
	}
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	g3.Unlock()
	want = map[point]int64{held("b"): 0, waiting("b"): 0}
	if diff := cmp.Diff(want, gauges()); diff != "" {
		t.Fatalf("gauges after a closed: a must stop (-want +got):\n%s", diff)
	}
	acq := collect(t, reader).values
	if acq[point{"fairlock.lock.acquisitions", "a", "acquired"}] != 3 || acq[point{"fairlock.lock.acquisitions", "b", "acquired"}] != 1 {
		t.Fatalf("acquisitions not kept apart per locker: %v", acq)
	}
	wantUnits := map[string]string{
		"fairlock.lock.acquisitions": "{acquisition}", "fairlock.lock.wait.duration": "s",
		"fairlock.lock.hold.duration": "s", "fairlock.lock.held": "{key}", "fairlock.lock.waiters": "{waiter}",
	}
	if diff := cmp.Diff(wantUnits, collect(t, reader).units); diff != "" {
		t.Errorf("instruments and units (-want +got):\n%s", diff)
	}
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestSemaphoreAndSharedHoldsReported: a Semaphore reports like a Locker
// (its acquisitions by result, its gauges), shared holds count as
// acquisitions and holds, and Wait acquires nothing.
func TestSemaphoreAndSharedHoldsReported(t *testing.T) {
	obs, reader := newObserver(t)
	ctx := context.Background()
	s := fairlock.NewSemaphore[string](2, fairlock.WithName("sem"), fairlock.WithObserver(obs))
	l := fairlock.New[string](fairlock.WithName("rw"), fairlock.WithObserver(obs))
	u1, _ := s.Acquire(owner.NewContext(ctx), "k", 2)
	if _, err := s.TryAcquire(owner.NewContext(ctx), "k", 1); err == nil {
		t.Fatal("TryAcquire of a full key succeeded")
	}
	_, _ = s.Acquire(ctx, "k", 3) // invalid weight
	r1, _ := l.RLock(owner.NewContext(ctx), "k")
	r2, _ := l.RLock(owner.NewContext(ctx), "k")
	values := collect(t, reader).values
	for p, want := range map[point]int64{
		{"fairlock.lock.acquisitions", "sem", "acquired"}:       1,
		{"fairlock.lock.acquisitions", "sem", "would_block"}:    1,
		{"fairlock.lock.acquisitions", "sem", "invalid_weight"}: 1,
		{"fairlock.lock.held", "sem", ""}:                       1,
		{"fairlock.lock.acquisitions", "rw", "acquired"}:        2,
		{"fairlock.lock.held", "rw", ""}:                        1,
	} {
		if got := values[p]; got != want {
			t.Errorf("%v = %d, want %d", p, got, want)
		}
	}
	u1.Unlock()
	r1.Unlock()
	r2.Unlock()
	if err := l.Wait(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	values = collect(t, reader).values
	if got := values[point{"fairlock.lock.acquisitions", "rw", "acquired"}]; got != 2 {
		t.Errorf("acquisitions of rw after a Wait: %d, want 2 (Wait acquires nothing)", got)
	}
	for _, closer := range []interface{ Close(context.Context) error }{s, l} {
		if err := closer.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
