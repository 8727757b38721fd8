package otelmetrics_test

import (
	"context"
	"log"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/otelmetrics"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// One observer serves every Locker built with it; each reports under its
// own fairlock.locker attribute. A program passes the MeterProvider of its
// OpenTelemetry SDK (or nil, for the global one set with
// otel.SetMeterProvider); the no-op provider here records nothing.
// internal/otelsdktest reads these metrics back through the SDK.
func ExampleNew() {
	var mp metric.MeterProvider = noop.NewMeterProvider() // your SDK's provider
	obs, err := otelmetrics.New(mp)
	if err != nil {
		log.Fatal(err)
	}
	orders := fairlock.New[string](fairlock.WithName("orders"), fairlock.WithObserver(obs))
	defer orders.Close(context.Background())
	payments := fairlock.New[string](fairlock.WithName("payments"), fairlock.WithObserver(obs))
	defer payments.Close(context.Background())

	g, err := orders.Lock(context.Background(), "order-7")
	if err != nil {
		log.Fatal(err)
	}
	defer g.Unlock()
}

// The duration histograms' boundaries are an option of NewWithOptions;
// without it (and with New), DefaultDurationBuckets.
func ExampleNewWithOptions() {
	var mp metric.MeterProvider = noop.NewMeterProvider() // your SDK's provider
	obs, err := otelmetrics.NewWithOptions(mp, otelmetrics.WithDurationBuckets(0.001, 0.01, 0.1, 1, 10))
	if err != nil {
		log.Fatal(err)
	}
	locks := fairlock.New[string](fairlock.WithName("jobs"), fairlock.WithObserver(obs))
	defer locks.Close(context.Background())
}
