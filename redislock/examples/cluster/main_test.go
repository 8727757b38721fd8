package main

import (
	"flag"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain runs the worker processes the demo starts (it re-executes
// its own binary, here the test binary, with -worker) and checks the
// tests for leaked goroutines.
func TestMain(m *testing.M) {
	flag.Parse()
	if *worker != "" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// TestDemo runs the whole demo, shortened: its exclusion, order and kill
// checks must pass.
func TestDemo(t *testing.T) {
	*contend = time.Second
	*rounds = 3
	*run = "test"
	// demo sets -addr to the redis-server it starts; a second run in this
	// process (-count=2) must start its own, not dial the first's.
	*addr = ""
	if err := demo(); err != nil {
		t.Fatal(err)
	}
}
