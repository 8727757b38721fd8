module github.com/fairlock/fairlock

go 1.24.0

require (
	github.com/google/go-cmp v0.7.0
	github.com/petermattis/goid v0.0.0-20260820044319-269ab09b5261
	go.opentelemetry.io/otel v1.41.0
	go.opentelemetry.io/otel/metric v1.41.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel/trace v1.41.0 // indirect
)
