// Package otelsdktest has no code: its tests check package otelmetrics
// against the real OpenTelemetry SDK (a ManualReader reads back what
// otelmetrics.New records). It is a module of its own so that the library
// module, and so every program that requires it, does not require the SDK.
package otelsdktest
