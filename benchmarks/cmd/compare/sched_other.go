//go:build !linux

package main

// scheduler names the scheduling policy compare runs under; it is read
// only on Linux.
func scheduler() (name string, realtime bool) { return "scheduler not read on this OS", false }
