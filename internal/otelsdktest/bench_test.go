package otelsdktest_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/fairlock/fairlock/fairlock"
)

// BenchmarkLockUnlock compares uncontended Lock+Unlock with the observer
// off and on (recording to the OpenTelemetry SDK). Both report allocations;
// the observer adds two clock reads and three SDK recordings per cycle.
func BenchmarkLockUnlock(b *testing.B) {
	obs, _ := newObserver(b)
	for _, bc := range []struct {
		name string
		opts []fairlock.Option
	}{
		{"observer=off", nil},
		{"observer=on", []fairlock.Option{fairlock.WithObserver(obs)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l := fairlock.New[string](bc.opts...)
			defer l.Close(context.Background())
			keys := make([]string, 1024)
			for i := range keys {
				keys[i] = "k" + strconv.Itoa(i)
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				g, err := l.Lock(ctx, keys[i&1023])
				if err != nil {
					b.Fatal(err)
				}
				g.Unlock()
			}
		})
	}
}
