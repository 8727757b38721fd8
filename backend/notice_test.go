package backend

import (
	"bytes"
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/fairlock/fairlock/owner"
)

// TestTurnEndedWhileItsGrantIsTaken: a Turn whose enqueue's reply
// granted it (a bound that came before the reply, or a reply that says
// its turn has come) is ended by a second bound (GrantTurnsLocked: the
// notice after the releasing Locker's own reply, a re-read) while its
// call is between its check of turnDone and the Core's mutex in wait.
// The call must return without taking the grant: the Turn's books were
// closed by GrantTurnsLocked, and finish does not close them again, so
// a grant counted there would stay counted for ever (Close waits for it,
// or reports it still held). The call is held in wait by the test
// holding the Core's mutex until the call's goroutine blocks on it.
func TestTurnEndedWhileItsGrantIsTaken(t *testing.T) {
	k := New(Config{Package: "backendtest", Kind: "backendtest.Locker", DefaultName: "backendtest"}, NewSettings(nil))
	defer k.Abort()
	ctx := context.Background()
	c, err := k.begin(ctx, "k", owner.Of(ctx), Turn, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	// As run leaves a Turn whose reply granted it: confirmed, granted,
	// still queued.
	k.mu.Lock()
	c.NameLocked("e1")
	c.token, c.confirmed, c.granted = 5, true, true
	done := make(chan error, 1)
	go func() { done <- k.wait(ctx, c, nil) }()
	awaitBlockedInWait(t)
	k.GrantTurnsLocked("k", 10)
	k.mu.Unlock()
	err = recvWithin(t, done, 10*time.Second)
	k.finish(c, err)
	if err != nil {
		t.Fatalf("wait: %v, want nil", err)
	}
	k.mu.Lock()
	calls, grants := k.calls, k.grants
	k.mu.Unlock()
	if calls != 0 || grants != 0 {
		t.Fatalf("after the Turn returned: %d calls, %d grants in the books; want 0 and 0", calls, grants)
	}
}

// awaitBlockedInWait polls the goroutines' stacks until one is blocked
// on a mutex in Core.wait, failing t after 10 s.
func awaitBlockedInWait(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		for _, g := range bytes.Split(buf[:n], []byte("\n\n")) {
			if bytes.Contains(g, []byte("[sync.Mutex.Lock")) && bytes.Contains(g, []byte("backend.(*Core).wait(")) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no goroutine blocked on the Core's mutex in wait within 10s:\n%s", buf[:n])
		}
		time.Sleep(time.Millisecond)
	}
}

func recvWithin[T any](t *testing.T, ch <-chan T, d time.Duration) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("nothing received within %v", d)
	}
	var zero T
	return zero
}
