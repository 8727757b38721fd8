// Command otel runs a short contended workload on a fairlock Locker wired
// to the OpenTelemetry SDK, and prints the metrics with the stdout exporter
// when it ends.
//
//	go run ./examples/otel
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"sync"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/otelmetrics"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

func main() {
	if err := run(os.Stdout, 200); err != nil {
		log.Fatal(err)
	}
}

func run(out io.Writer, rounds int) error {
	exp, err := stdoutmetric.New(stdoutmetric.WithWriter(out), stdoutmetric.WithPrettyPrint())
	if err != nil {
		return err
	}
	// The periodic reader exports once more on Shutdown, after the work.
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp, sdkmetric.WithInterval(time.Hour))))
	obs, err := otelmetrics.New(mp)
	if err != nil {
		return err
	}
	l := fairlock.New[string](fairlock.WithName("accounts"), fairlock.WithObserver(obs))

	// Eight workers on three keys, one of them hot; some calls give up after
	// a short deadline, so several results show up.
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				key := "acct-hot"
				if i%3 == 0 {
					key = fmt.Sprintf("acct-%d", w%2)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Microsecond)
				g, err := l.Lock(ctx, key)
				cancel()
				if err != nil {
					continue // counted as deadline_exceeded
				}
				time.Sleep(50 * time.Microsecond)
				g.Unlock()
			}
		}()
	}
	wg.Wait()
	ctx := context.Background()
	// Shut the provider down (its last export) while the Locker is open,
	// so the Locker's gauges are in the export; then close the Locker.
	if err := mp.Shutdown(ctx); err != nil {
		return err
	}
	return l.Close(ctx)
}
