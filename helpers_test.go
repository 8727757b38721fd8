package fairlock_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
)

// waitFor polls cond until it holds, yielding the processor between tries.
// It fails the test after a minute: that is a lost wake-up or a hang, not
// a slow machine.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		runtime.Gosched()
	}
}

// waitWaiters blocks until key has n queued waiters.
func waitWaiters[K comparable](t testing.TB, l *fairlock.Locker[K], key K, n int) {
	t.Helper()
	waitFor(t, "the key has its waiters", func() bool { return l.Waiters(key) == n })
}

// recv returns the next value from ch, failing the test if none arrives
// within a minute.
func recv[T any](t testing.TB, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatal("timed out waiting for a result: lost wake-up?")
		panic("unreachable")
	}
}

// mustNotReceive fails if ch has a value ready now.
func mustNotReceive[T any](t testing.TB, ch <-chan T, what string) {
	t.Helper()
	select {
	case v := <-ch:
		t.Fatalf("%s: got %v", what, v)
	default:
	}
}
