package otelsdktest_test

import (
	"context"
	"fmt"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/otelmetrics"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// An observer from otelmetrics.New records every Locker built with it.
// Here the OpenTelemetry SDK's ManualReader reads the acquisitions counter
// after three Locks and one TryLock refused as reentrant. (This example
// was otelmetrics' ExampleNew; it lives here so that the library module
// does not require the SDK.)
func Example_manualReader() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	obs, err := otelmetrics.New(mp)
	if err != nil {
		fmt.Println(err)
		return
	}
	orders := fairlock.New[string](fairlock.WithName("orders"), fairlock.WithObserver(obs))
	defer orders.Close(context.Background())

	ctx := context.Background()
	for range 2 {
		g, _ := orders.Lock(ctx, "order-7")
		g.Unlock()
	}
	g, _ := orders.Lock(ctx, "order-8")
	_, _ = orders.TryLock(context.Background(), "order-8") // same goroutine: ErrReentrant
	g.Unlock()

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		fmt.Println(err)
		return
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "fairlock.lock.acquisitions" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				result, _ := dp.Attributes.Value(otelmetrics.ResultKey)
				fmt.Printf("%s %s=%d\n", m.Name, result.AsString(), dp.Value)
			}
		}
	}
	// Unordered output:
	// fairlock.lock.acquisitions acquired=3
	// fairlock.lock.acquisitions reentrant=1
}
