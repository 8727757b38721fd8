package otelmetrics_test

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/otelmetrics"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.uber.org/goleak"
)

// The tests that read what New records through the OpenTelemetry SDK live
// in the module internal/otelsdktest, so that this module does not require
// the SDK. The tests here need only the metric API.

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNilMeterProviderUsesGlobal(t *testing.T) {
	obs, err := otelmetrics.New(nil)
	if err != nil || obs == nil {
		t.Fatalf("New(nil) = %v, %v", obs, err)
	}
	l := fairlock.New[int](fairlock.WithObserver(obs))
	g, err := l.Lock(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	g.Unlock()
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// callbackProvider is a no-op MeterProvider that keeps the callback New
// registers, so a test can run collections itself without an SDK.
type callbackProvider struct {
	noop.MeterProvider
	mu sync.Mutex
	cb metric.Callback // guarded by mu
}

func (p *callbackProvider) Meter(string, ...metric.MeterOption) metric.Meter {
	return callbackMeter{p: p}
}

// collect runs the registered callback once, as a reader's Collect would.
func (p *callbackProvider) collect(t testing.TB) {
	p.mu.Lock()
	cb := p.cb
	p.mu.Unlock()
	if err := cb(context.Background(), noop.Observer{}); err != nil {
		t.Error(err)
	}
}

type callbackMeter struct {
	noop.Meter
	p *callbackProvider
}

func (m callbackMeter) RegisterCallback(cb metric.Callback, _ ...metric.Observable) (metric.Registration, error) {
	m.p.mu.Lock()
	m.p.cb = cb
	m.p.mu.Unlock()
	return noop.Registration{}, nil
}

// TestNoStatsAfterUnregister: LockerObserver.Unregister's contract says
// stats is not called after it returns. A collection reads the set of
// open Lockers and then calls each one's stats; a Locker unregistered in
// between must be skipped, and an Unregister that comes while its stats
// runs must wait for that call.
func TestNoStatsAfterUnregister(t *testing.T) {
	t.Run("between the read of the set and the call", func(t *testing.T) {
		// Two Lockers; whichever stats the collection calls first blocks
		// until the other Locker has been unregistered. The collection then
		// comes to the other's stats, which must not run.
		p := &callbackProvider{}
		obs, err := otelmetrics.New(p)
		if err != nil {
			t.Fatal(err)
		}
		var (
			first     = make(chan int, 2) // which Locker's stats ran first
			proceed   = make(chan struct{})
			unreg     [2]atomic.Bool
			lateCalls atomic.Int64
			los       [2]fairlock.LockerObserver
		)
		for i := range los {
			los[i] = obs.Register(fmt.Sprint("l", i), func() fairlock.Stats {
				if unreg[i].Load() {
					lateCalls.Add(1)
					return fairlock.Stats{}
				}
				first <- i
				<-proceed
				return fairlock.Stats{}
			})
		}
		collected := make(chan struct{})
		go func() { p.collect(t); close(collected) }()
		other := 1 - <-first
		los[other].Unregister()
		unreg[other].Store(true) // Unregister has returned
		close(proceed)
		<-collected
		if n := lateCalls.Load(); n != 0 {
			t.Fatalf("stats called %d times after its Locker's Unregister returned", n)
		}
		los[1-other].Unregister()
	})
	t.Run("register and unregister under a collector loop", func(t *testing.T) {
		p := &callbackProvider{}
		obs, err := otelmetrics.New(p)
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		started := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
					p.collect(t)
				}
				if n == 0 {
					close(started)
				}
			}
		}()
		<-started
		var lateCalls, calls atomic.Int64
		for i := range 2000 {
			var unregistered atomic.Bool
			lo := obs.Register(fmt.Sprint("l", i%4), func() fairlock.Stats {
				calls.Add(1)
				if unregistered.Load() {
					lateCalls.Add(1)
				}
				return fairlock.Stats{Keys: 1}
			})
			lo.Acquire(fairlock.Acquired, 0)
			lo.Release(0)
			runtime.Gosched() // let the collector read the set with lo in it
			lo.Unregister()
			unregistered.Store(true)
		}
		close(stop)
		<-done
		t.Logf("%d stats calls", calls.Load())
		if n := lateCalls.Load(); n != 0 {
			t.Fatalf("stats called %d times after its Locker's Unregister returned", n)
		}
	})
}

// TestBadBucketsRefused: New refuses boundaries the SDK would reject.
func TestBadBucketsRefused(t *testing.T) {
	// No boundaries at all is refused too: the SDK takes an empty list
	// as "none given" and applies its own defaults (0, 5, 10 … 10000),
	// meant for milliseconds, to these histograms in seconds.
	for _, b := range [][]float64{{0.1, 0.01}, {0.1, 0.1}, {math.NaN()}, {1, math.Inf(1)}, {}} {
		if _, err := otelmetrics.NewWithOptions(noop.NewMeterProvider(), otelmetrics.WithDurationBuckets(b...)); err == nil {
			t.Errorf("New with buckets %v: no error", b)
		}
	}
	if _, err := otelmetrics.NewWithOptions(noop.NewMeterProvider(), otelmetrics.WithDurationBuckets(1)); err != nil {
		t.Errorf("New with one boundary (two buckets): %v", err)
	}
}
