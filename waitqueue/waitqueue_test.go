package waitqueue_test

import (
	"slices"
	"testing"

	"github.com/fairlock/fairlock/waitqueue"
	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func values(q *waitqueue.Queue[int]) []int {
	var out []int
	for w := range q.All() {
		out = append(out, w.Value)
	}
	return out
}

func newWaiters(n int) []*waitqueue.Waiter[int] {
	ws := make([]*waitqueue.Waiter[int], n)
	for i := range ws {
		ws[i] = waitqueue.NewWaiter[int]()
		ws[i].Value = i
	}
	return ws
}

func TestFIFO(t *testing.T) {
	var q waitqueue.Queue[int]
	if q.PopFront() != nil || q.Front() != nil || q.Len() != 0 {
		t.Fatal("zero Queue is not empty")
	}
	ws := newWaiters(4)
	for _, w := range ws {
		q.PushBack(w)
	}
	if diff := cmp.Diff([]int{0, 1, 2, 3}, values(&q)); diff != "" {
		t.Fatalf("All (-want +got):\n%s", diff)
	}
	for i := range ws {
		if got := q.PopFront(); got != ws[i] || got.Queued() {
			t.Fatalf("PopFront #%d = %v (queued %v), want waiter %d", i, got.Value, got.Queued(), i)
		}
	}
	if q.Len() != 0 || q.PopFront() != nil {
		t.Fatal("queue not empty after popping every waiter")
	}
}

func TestRemoveAnywhere(t *testing.T) {
	for _, victim := range []int{0, 2, 4} { // head, middle, tail
		var q waitqueue.Queue[int]
		ws := newWaiters(5)
		for _, w := range ws {
			q.PushBack(w)
		}
		if !q.Remove(ws[victim]) {
			t.Fatalf("Remove(%d) = false", victim)
		}
		if q.Remove(ws[victim]) {
			t.Fatalf("second Remove(%d) = true", victim)
		}
		want := slices.Delete([]int{0, 1, 2, 3, 4}, victim, victim+1)
		if diff := cmp.Diff(want, values(&q)); diff != "" {
			t.Fatalf("after Remove(%d) (-want +got):\n%s", victim, diff)
		}
		if q.Len() != 4 {
			t.Fatalf("Len = %d, want 4", q.Len())
		}
	}
}

func TestRemoveFromOtherQueueIsNoop(t *testing.T) {
	var a, b waitqueue.Queue[int]
	w := waitqueue.NewWaiter[int]()
	a.PushBack(w)
	if b.Remove(w) {
		t.Fatal("Remove from a queue w is not in returned true")
	}
	if a.Len() != 1 || b.Len() != 0 {
		t.Fatalf("lens a=%d b=%d, want 1 0", a.Len(), b.Len())
	}
}

func TestPushBackQueuedPanics(t *testing.T) {
	var q waitqueue.Queue[int]
	w := waitqueue.NewWaiter[int]()
	q.PushBack(w)
	defer func() {
		if recover() == nil {
			t.Fatal("PushBack of a queued waiter did not panic")
		}
	}()
	q.PushBack(w)
}

func TestSignalOncePerWait(t *testing.T) {
	w := waitqueue.NewWaiter[int]()
	for range 3 { // reusable: one signal, one receive, again
		w.Signal()
		<-w.Ready()
	}
	w.Signal()
	defer func() {
		if r := recover(); r != "waitqueue: waiter signalled twice in one wait" {
			t.Fatalf("a second Signal before the receive recovered %v, want the signalled-twice panic", r)
		}
	}()
	w.Signal()
}

// TestZeroWaiterSignalPanicsClearly: the zero Waiter has no channel, and
// Signal says so rather than blaming a second signal.
func TestZeroWaiterSignalPanicsClearly(t *testing.T) {
	var w waitqueue.Waiter[int]
	defer func() {
		if r := recover(); r != "waitqueue: Signal of a Waiter not made by NewWaiter" {
			t.Fatalf("Signal of the zero Waiter recovered %v", r)
		}
	}()
	w.Signal()
}

func TestOperationsDoNotAllocate(t *testing.T) {
	var q waitqueue.Queue[int]
	ws := newWaiters(3)
	allocs := testing.AllocsPerRun(100, func() {
		for _, w := range ws {
			q.PushBack(w)
		}
		q.Remove(ws[1])
		q.PopFront()
		q.PopFront()
		ws[0].Signal()
		<-ws[0].Ready()
	})
	if allocs != 0 {
		t.Fatalf("queue operations allocate %v times per run", allocs)
	}
}

// FuzzQueue drives random PushBack/PopFront/Remove sequences against a
// slice model and checks order, length and membership after every step.
func FuzzQueue(f *testing.F) {
	f.Add([]byte{0, 0, 0, 1, 2, 0, 1})
	f.Add([]byte{0, 0, 0, 0, 0x42, 0x22, 1, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var q waitqueue.Queue[int]
		ws := newWaiters(8)
		var model []int
		for _, op := range ops {
			i := int(op>>2) % len(ws)
			switch op & 3 {
			case 0, 3: // push waiter i if it is free
				if !ws[i].Queued() {
					q.PushBack(ws[i])
					model = append(model, i)
				}
			case 1:
				w := q.PopFront()
				if len(model) == 0 {
					if w != nil {
						t.Fatalf("PopFront of empty queue = %d", w.Value)
					}
					continue
				}
				if w == nil || w.Value != model[0] {
					t.Fatalf("PopFront = %v, model head %d", w, model[0])
				}
				model = model[1:]
			case 2:
				j := slices.Index(model, i)
				if got := q.Remove(ws[i]); got != (j >= 0) {
					t.Fatalf("Remove(%d) = %v, model has it: %v", i, got, j >= 0)
				}
				if j >= 0 {
					model = slices.Delete(model, j, j+1)
				}
			}
			if q.Len() != len(model) {
				t.Fatalf("Len = %d, model %d", q.Len(), len(model))
			}
			if diff := cmp.Diff(model, values(&q), cmp.Comparer(func(a, b []int) bool { return slices.Equal(a, b) })); diff != "" {
				t.Fatalf("order (-model +queue):\n%s", diff)
			}
		}
	})
}
