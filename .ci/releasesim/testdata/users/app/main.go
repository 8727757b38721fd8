// Command app uses package fairlock with OpenTelemetry metrics, and
// etcdlock, as an application would, each installed from its tag. It
// starts no etcd server: an etcdlock user's graph holds the etcd client,
// never the server (that is etcdtest's, in a module of its own).
package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/otelmetrics"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/metric/noop"
	"go.uber.org/zap"
)

func main() {
	ctx := context.Background()
	obs, err := otelmetrics.New(noop.NewMeterProvider())
	if err != nil {
		panic(err)
	}
	l := fairlock.New[string](fairlock.WithObserver(obs))
	g, err := l.Lock(ctx, "k")
	if err != nil {
		panic(err)
	}
	g.Unlock()
	if err := l.Close(ctx); err != nil {
		panic(err)
	}
	fmt.Println("app: fairlock with otelmetrics locked and unlocked k")

	// No server listens on port 1, and the client's context is already
	// done: New fails at its first request, the lease grant, without
	// waiting. (clientv3.New itself dials without blocking.)
	done, cancel := context.WithCancel(ctx)
	cancel()
	client, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{"127.0.0.1:1"},
		DialTimeout: time.Second,
		Context:     done,
		Logger:      zap.NewNop(), // not the client's warning of the failed call
	})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	_, err = etcdlock.New(client, "/app/locks", etcdlock.WithTTL(5*time.Second))
	if !errors.Is(err, context.Canceled) {
		panic(fmt.Sprintf("etcdlock.New on a client whose context is done: %v, want context.Canceled", err))
	}
	fmt.Println("app: etcdlock.New without a server:", err)
}
