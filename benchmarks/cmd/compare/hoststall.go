package main

import (
	"runtime"
	"sync"
	"time"
)

// The clock-only probe measures how long the machine itself stops a
// thread that does nothing but run, with no lock and no other goroutine in
// play: one goroutine per processor, each locked to its thread, reads the
// clock in a loop, and the longest interval between two consecutive reads
// is a stall that the thread sat through (the host stopping its virtual
// CPU, or another thread taking that CPU). compare runs it for as long as
// one hot-key run, straight after the G=32 runs, and prints the longest
// stall beside the max-wait bar.
//
// Why. Every call's wait in the hot-key runs includes any stall of its own
// thread, and under a FIFO lock also any stall of the holder's thread
// (the queue cannot move on without it); a barging lock lets another
// thread take the key, but the caller it stalled still waits. So on a
// machine whose threads stop for longer than the bar allows, no lock can
// be sure of the bar. Steal time says how much CPU time the host took
// (steal.go); the probe says how long it took at once, which is what a
// maximum counts. It is measured next to the runs, not during them: a
// probe running beside a lock would take the CPU the lock needs.
//
// On the 2-vCPU EPYC host of docs/performance.md ("A third host"), a
// 15 s probe found a stall of 2.8 ms or more in every 1.35 s window, and
// of 9 ms or more in four of the eleven, with the rest of the machine
// idle; the max-wait bar allowed fairlock 3.0 to 4.8 ms there.

// clockStall runs the given number of threads, each reading the clock
// (now) in a loop for about d, and returns the longest interval any of
// them saw between two consecutive reads. compare runs one thread per
// processor (GOMAXPROCS). Each thread keeps its maximum in a local
// variable and stores it once at the end, so the threads share no cache
// line while they measure.
func clockStall(d time.Duration, threads int, now func() time.Time) time.Duration {
	longest := make([]time.Duration, threads)
	var wg sync.WaitGroup
	for i := range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var stall time.Duration
			start := now()
			prev := start
			for prev.Sub(start) < d {
				t := now()
				stall = max(stall, t.Sub(prev))
				prev = t
			}
			longest[i] = stall
		}()
	}
	wg.Wait()
	var m time.Duration
	for _, l := range longest {
		m = max(m, l)
	}
	return m
}
