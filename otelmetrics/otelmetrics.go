// Package otelmetrics reports fairlock Lockers' metrics to OpenTelemetry.
//
//	obs, err := otelmetrics.New(meterProvider) // nil: otel.GetMeterProvider()
//	if err != nil { … }
//	locks := fairlock.New[string](fairlock.WithName("orders"), fairlock.WithObserver(obs))
//
// NewWithOptions takes options: WithDurationBuckets sets the duration
// histograms' boundaries (DefaultDurationBuckets otherwise).
//
// The instruments (docs/metrics.md says what each tells an operator):
//
//	fairlock.lock.acquisitions   Int64Counter                 {acquisition}  fairlock.locker, fairlock.result
//	fairlock.lock.wait.duration  Float64Histogram             s              fairlock.locker, fairlock.result
//	fairlock.lock.hold.duration  Float64Histogram             s              fairlock.locker
//	fairlock.lock.held           Int64ObservableUpDownCounter {key}          fairlock.locker
//	fairlock.lock.waiters        Int64ObservableUpDownCounter {waiter}       fairlock.locker
//
// fairlock.result is one of acquired, reentrant, canceled,
// deadline_exceeded, would_block, closed, deadlock, invalid_key,
// invalid_weight, and, from the distributed backends, lost (the call's
// session expired) and error (the engine failed) (fairlock.Results).
// Wait calls are not in the counter or
// the wait histogram (they acquire nothing), but a queued Wait counts in
// fairlock.lock.waiters. Keys are
// never attributes: their cardinality is unbounded. Attribute sets are
// built once per Locker and result, so recording allocates nothing per
// operation in this package.
package otelmetrics

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

const (
	// ScopeName is the instrumentation scope: this package's import path.
	ScopeName = "github.com/fairlock/fairlock/otelmetrics"
	// Version is the instrumentation scope's version.
	Version = "0.1.0"
)

// Attribute keys.
const (
	LockerKey = attribute.Key("fairlock.locker") // the Locker's WithName
	ResultKey = attribute.Key("fairlock.result") // a fairlock.Result's String
)

// DefaultDurationBuckets returns the explicit histogram boundaries, in
// seconds, that both duration histograms use unless NewWithOptions is
// given WithDurationBuckets: 1-2.5-5 steps from 1µs to 10s, the span from an
// uncontended hand-off to a stuck holder. It returns a new slice on each
// call, so a caller may change it freely (to pass a variant of it to
// WithDurationBuckets).
func DefaultDurationBuckets() []float64 {
	return []float64{
		1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4,
		1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
	}
}

// An Option configures NewWithOptions.
type Option func(*config)

// config is NewWithOptions' settings; defaults are set in one place, at
// its start.
type config struct {
	buckets []float64 // histogram boundaries, in seconds
}

// WithDurationBuckets sets the explicit boundaries, in seconds, of both
// duration histograms (fairlock.lock.wait.duration and
// fairlock.lock.hold.duration) in place of DefaultDurationBuckets. There
// must be at least one, finite and strictly increasing, or NewWithOptions
// returns an error (the OpenTelemetry SDK reads an empty list as none
// given, and would apply its own default boundaries, 0 to 10000, meant
// for milliseconds). New copies them: changing the slice afterwards
// changes nothing. A View set on the MeterProvider overrides them, as it
// would the default.
func WithDurationBuckets(bounds ...float64) Option {
	return func(c *config) { c.buckets = slices.Clone(bounds) }
}

// observer is the fairlock.Observer: the instruments, shared by every
// Locker it serves, and the set of Lockers whose gauges it reports.
type observer struct {
	acquisitions metric.Int64Counter
	wait         metric.Float64Histogram
	hold         metric.Float64Histogram
	held         metric.Int64ObservableUpDownCounter
	waiters      metric.Int64ObservableUpDownCounter

	mu      sync.Mutex
	lockers map[*lockerObserver]struct{} // guarded by mu: open Lockers
}

// New returns a fairlock.Observer that records to meters from mp (nil means
// otel.GetMeterProvider()), with the default settings: it is
// NewWithOptions(mp). It creates the instruments and registers one
// callback for both gauges; it returns the first error the meter reports.
// One Observer may serve any number of Lockers (pass it to each with
// fairlock.WithObserver); each reports under its own fairlock.locker.
func New(mp metric.MeterProvider) (fairlock.Observer, error) {
	return NewWithOptions(mp)
}

// NewWithOptions is New configured by opts (WithDurationBuckets). It
// returns an error for buckets that are none, or not finite and strictly
// increasing, and the first error the meter reports.
func NewWithOptions(mp metric.MeterProvider, opts ...Option) (fairlock.Observer, error) {
	cfg := config{buckets: DefaultDurationBuckets()}
	for _, opt := range opts {
		if opt != nil {
			opt(&cfg)
		}
	}
	if len(cfg.buckets) == 0 {
		return nil, fmt.Errorf("fairlock: otelmetrics: no duration buckets: want at least one boundary")
	}
	for i, b := range cfg.buckets {
		if math.IsNaN(b) || math.IsInf(b, 0) || i > 0 && b <= cfg.buckets[i-1] {
			return nil, fmt.Errorf("fairlock: otelmetrics: duration buckets %v: want finite boundaries in increasing order", cfg.buckets)
		}
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName, metric.WithInstrumentationVersion(Version))
	o := &observer{lockers: make(map[*lockerObserver]struct{})}
	var err error
	if o.acquisitions, err = m.Int64Counter("fairlock.lock.acquisitions",
		metric.WithUnit("{acquisition}"),
		metric.WithDescription("The number of calls that asked for a key (Lock, RLock, Acquire and their Try forms), by result."),
	); err != nil {
		return nil, err
	}
	// The option keeps the slice, and the global MeterProvider applies it
	// only once a real provider is set: cfg.buckets is this call's own.
	buckets := cfg.buckets
	if o.wait, err = m.Float64Histogram("fairlock.lock.wait.duration",
		metric.WithUnit("s"),
		metric.WithDescription("The time calls that asked for a key spent queued for it, by result; calls that never queued record 0."),
		metric.WithExplicitBucketBoundaries(buckets...),
	); err != nil {
		return nil, err
	}
	if o.hold, err = m.Float64Histogram("fairlock.lock.hold.duration",
		metric.WithUnit("s"),
		metric.WithDescription("The time keys were held, from grant to Unlock."),
		metric.WithExplicitBucketBoundaries(buckets...),
	); err != nil {
		return nil, err
	}
	if o.held, err = m.Int64ObservableUpDownCounter("fairlock.lock.held",
		metric.WithUnit("{key}"),
		metric.WithDescription("The number of keys held right now."),
	); err != nil {
		return nil, err
	}
	if o.waiters, err = m.Int64ObservableUpDownCounter("fairlock.lock.waiters",
		metric.WithUnit("{waiter}"),
		metric.WithDescription("The number of calls queued for a held key right now (Lock, RLock, Acquire and Wait)."),
	); err != nil {
		return nil, err
	}
	if _, err = m.RegisterCallback(o.observe, o.held, o.waiters); err != nil {
		return nil, err
	}
	return o, nil
}

// observe reports every open Locker's gauges. The set is copied under
// o.mu and each Locker's stats is called outside it, so a slow Locker does
// not hold up Register and Unregister of the others; a Locker unregistered
// after the copy is skipped by readStats.
func (o *observer) observe(_ context.Context, obs metric.Observer) error {
	o.mu.Lock()
	open := make([]*lockerObserver, 0, len(o.lockers))
	for lo := range o.lockers {
		open = append(open, lo)
	}
	o.mu.Unlock()
	for _, lo := range open {
		st, ok := lo.readStats()
		if !ok {
			continue
		}
		obs.ObserveInt64(o.held, int64(st.Keys), lo.gaugeOpts...)
		obs.ObserveInt64(o.waiters, int64(st.Waiters), lo.gaugeOpts...)
	}
	return nil
}

// Register implements fairlock.Observer.
func (o *observer) Register(name string, stats func() fairlock.Stats) fairlock.LockerObserver {
	locker := LockerKey.String(name)
	results := fairlock.Results()
	lo := &lockerObserver{
		o:         o,
		stats:     stats,
		addOpts:   make([][]metric.AddOption, len(results)),
		waitOpts:  make([][]metric.RecordOption, len(results)),
		gaugeOpts: []metric.ObserveOption{metric.WithAttributeSet(attribute.NewSet(locker))},
		holdOpts:  []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(locker))},
	}
	for _, r := range results {
		set := attribute.NewSet(locker, ResultKey.String(r.String()))
		lo.addOpts[r] = []metric.AddOption{metric.WithAttributeSet(set)}
		lo.waitOpts[r] = []metric.RecordOption{metric.WithAttributeSet(set)}
	}
	o.mu.Lock()
	o.lockers[lo] = struct{}{}
	o.mu.Unlock()
	return lo
}

// lockerObserver records one Locker's events with option slices built once,
// indexed by fairlock.Result.
type lockerObserver struct {
	o *observer

	// statsMu is held across every call of stats. Unregister takes it to
	// set unregistered, so it waits for a call in flight, and no call
	// starts after it returns (fairlock.LockerObserver's contract).
	statsMu      sync.Mutex
	unregistered bool // guarded by statsMu
	stats        func() fairlock.Stats

	addOpts   [][]metric.AddOption
	waitOpts  [][]metric.RecordOption
	holdOpts  []metric.RecordOption
	gaugeOpts []metric.ObserveOption
}

// Acquire implements fairlock.LockerObserver.
func (lo *lockerObserver) Acquire(r fairlock.Result, wait time.Duration) {
	if int(r) >= len(lo.addOpts) {
		return
	}
	ctx := context.Background()
	lo.o.acquisitions.Add(ctx, 1, lo.addOpts[r]...)
	lo.o.wait.Record(ctx, wait.Seconds(), lo.waitOpts[r]...)
}

// Release implements fairlock.LockerObserver.
func (lo *lockerObserver) Release(hold time.Duration) {
	lo.o.hold.Record(context.Background(), hold.Seconds(), lo.holdOpts...)
}

// readStats calls stats unless the Locker was unregistered; ok is false
// if it was.
func (lo *lockerObserver) readStats() (st fairlock.Stats, ok bool) {
	lo.statsMu.Lock()
	defer lo.statsMu.Unlock()
	if lo.unregistered {
		return fairlock.Stats{}, false
	}
	return lo.stats(), true
}

// Unregister implements fairlock.LockerObserver: the Locker's gauges stop.
// It waits for a stats call that a collection is making, and once it
// returns no collection calls stats again.
func (lo *lockerObserver) Unregister() {
	lo.statsMu.Lock()
	lo.unregistered = true
	lo.statsMu.Unlock()
	lo.o.mu.Lock()
	delete(lo.o.lockers, lo)
	lo.o.mu.Unlock()
}
