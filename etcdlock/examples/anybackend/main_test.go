package main

import (
	"context"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestBackends runs the same transfers on each backend: the total must
// be kept on every one. The postgres backend starts a server of its own
// (pgtest: Debian's postgresql package's binaries).
func TestBackends(t *testing.T) {
	for _, b := range []string{"inprocess", "etcd", "postgres"} {
		t.Run(b, func(t *testing.T) {
			total, err := run(context.Background(), b, 20)
			if err != nil {
				t.Fatal(err)
			}
			if total != 300 {
				t.Fatalf("total %d, want 300", total)
			}
		})
	}
	if _, err := run(context.Background(), "nowhere", 1); err == nil {
		t.Error("an unknown backend was accepted")
	}
}
