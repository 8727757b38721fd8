package keylock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest"
)

// inProcess is a keylocktest harness over the in-process lock: one
// fairlock.Locker per test, and one fairlock.Semaphore per test and size,
// each handed out as views (keylock.InProcess), so that every Locker the
// suite gets for a test excludes the others.
type inProcess struct {
	mu         sync.Mutex
	lockers    map[testing.TB]*fairlock.Locker[string]
	semaphores map[testing.TB]map[int64]*fairlock.Semaphore[string]
}

func (h *inProcess) locker(t testing.TB) *fairlock.Locker[string] {
	h.mu.Lock()
	defer h.mu.Unlock()
	l, ok := h.lockers[t]
	if !ok {
		l = fairlock.New[string]()
		h.lockers[t] = l
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := l.Close(ctx); err != nil {
				t.Errorf("Close: %v", err)
			}
			h.mu.Lock()
			delete(h.lockers, t)
			h.mu.Unlock()
		})
	}
	return l
}

func (h *inProcess) semaphore(t testing.TB, n int64) *fairlock.Semaphore[string] {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.semaphores[t] == nil {
		h.semaphores[t] = map[int64]*fairlock.Semaphore[string]{}
		t.Cleanup(func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			delete(h.semaphores, t)
		})
	}
	s, ok := h.semaphores[t][n]
	if !ok {
		s = fairlock.NewSemaphore[string](n)
		h.semaphores[t][n] = s
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := s.Close(ctx); err != nil {
				t.Errorf("Semaphore.Close: %v", err)
			}
		})
	}
	return s
}

// waiters counts the calls queued on key over t's Locker and Semaphores.
func (h *inProcess) waiters(t testing.TB, key string) int {
	n := h.locker(t).Waiters(key)
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.semaphores[t] {
		n += s.Waiters(key)
	}
	return n
}

func inProcessHarness() keylocktest.Harness {
	h := &inProcess{
		lockers:    map[testing.TB]*fairlock.Locker[string]{},
		semaphores: map[testing.TB]map[int64]*fairlock.Semaphore[string]{},
	}
	return keylocktest.Harness{
		New:     func(t testing.TB) keylock.Locker { return keylock.InProcess(h.locker(t)) },
		Waiters: h.waiters,
		NewSemaphore: func(t testing.TB, n int64) keylock.Semaphore {
			return keylock.InProcessSemaphore(h.semaphore(t, n))
		},
	}
}

// TestInProcessConformance runs the conformance suite against the
// in-process lock: every promise of package keylock, shared holds and the
// semaphore included (an in-process grant cannot be lost: no Lose).
func TestInProcessConformance(t *testing.T) {
	keylocktest.Run(t, inProcessHarness())
}
