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

// TestDemo runs the whole demo, shortened: its FIFO, exclusion and kill
// checks must pass.
func TestDemo(t *testing.T) {
	*contend = time.Second
	*rounds = 3
	*ttl = 3 * time.Second // under -race on a loaded machine, a 2 s lease can miss its renewals
	*run = "test"
	// demo sets -endpoints to the embedded server it starts; a second run
	// in this process (-count=2) must start its own, not dial the first's.
	*endpoints = ""
	if err := demo(); err != nil {
		t.Fatal(err)
	}
}
