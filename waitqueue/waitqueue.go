// Package waitqueue is the intrusive FIFO queue behind each fairlock key.
//
// A [Waiter] carries its own links and its own ready channel, so pushing,
// popping and removing allocate nothing: the only allocation of a wait is
// the Waiter itself, and fairlock recycles those. Removal of a waiter from
// the middle of the queue (a cancelled Lock) is O(1). The layout follows
// the runtime's semaphore queue (runtime/sema.go, sudog.next/prev).
//
// A Queue is not safe for concurrent use; fairlock guards each one with
// its shard's mutex. Only [Waiter.Signal] and [Waiter.Ready] may be used
// without that mutex.
package waitqueue

import "iter"

// Waiter is one queued request. Value holds the caller's data (fairlock
// keeps the waiter's owner, its arrival time and the outcome of the wait
// there). A Waiter is in at most one Queue at a time.
//
// The ready channel has room for one signal: the party that decides the
// wait's outcome (a grant, or Close) calls [Waiter.Signal] exactly once,
// after releasing the queue's mutex, and the waiter receives it from
// [Waiter.Ready]. Because the channel is buffered and drained on every
// wait, a Waiter can be reused for many waits. Make one with NewWaiter:
// the zero Waiter has no channel and is not usable.
type Waiter[T any] struct {
	next, prev *Waiter[T]
	queue      *Queue[T] // the queue w is in, or nil
	ready      chan struct{}

	// Value is the caller's payload.
	Value T
}

// NewWaiter returns a Waiter with its ready channel; it allocates the
// Waiter and the channel.
func NewWaiter[T any]() *Waiter[T] {
	return &Waiter[T]{ready: make(chan struct{}, 1)}
}

// Ready returns the channel that receives the waiter's one signal per wait.
func (w *Waiter[T]) Ready() <-chan struct{} { return w.ready }

// Signal delivers the waiter's signal. It never blocks. It panics if the
// previous signal was not received: that would mean two parties decided
// the same wait, which is a broken invariant in the caller. It also panics
// on a Waiter not made by NewWaiter (the zero Waiter has no channel).
func (w *Waiter[T]) Signal() {
	select {
	case w.ready <- struct{}{}:
	default:
		if w.ready == nil {
			panic("waitqueue: Signal of a Waiter not made by NewWaiter")
		}
		panic("waitqueue: waiter signalled twice in one wait")
	}
}

// Queued reports whether w is in a queue.
func (w *Waiter[T]) Queued() bool { return w.queue != nil }

// Queue is a FIFO of waiters. The zero Queue is empty and ready to use.
type Queue[T any] struct {
	head, tail *Waiter[T]
	n          int
}

// Len returns the number of queued waiters.
func (q *Queue[T]) Len() int { return q.n }

// Front returns the oldest waiter, or nil if q is empty.
func (q *Queue[T]) Front() *Waiter[T] { return q.head }

// PushBack appends w, the newest waiter. It panics if w is already queued.
func (q *Queue[T]) PushBack(w *Waiter[T]) {
	if w.queue != nil {
		panic("waitqueue: PushBack of a waiter that is already queued")
	}
	w.queue = q
	w.next = nil
	w.prev = q.tail
	if q.tail == nil {
		q.head = w
	} else {
		q.tail.next = w
	}
	q.tail = w
	q.n++
}

// PopFront removes and returns the oldest waiter, or nil if q is empty.
func (q *Queue[T]) PopFront() *Waiter[T] {
	w := q.head
	if w != nil {
		q.unlink(w)
	}
	return w
}

// Remove takes w out of q wherever it is and reports whether it was there.
// Removing a waiter that is not in q (already popped, or in another queue)
// changes nothing and returns false.
func (q *Queue[T]) Remove(w *Waiter[T]) bool {
	if w.queue != q {
		return false
	}
	q.unlink(w)
	return true
}

func (q *Queue[T]) unlink(w *Waiter[T]) {
	if w.prev == nil {
		q.head = w.next
	} else {
		w.prev.next = w.next
	}
	if w.next == nil {
		q.tail = w.prev
	} else {
		w.next.prev = w.prev
	}
	w.next, w.prev, w.queue = nil, nil, nil
	q.n--
}

// All yields the queued waiters from oldest to newest. The queue must not
// be changed during the walk.
func (q *Queue[T]) All() iter.Seq[*Waiter[T]] {
	return func(yield func(*Waiter[T]) bool) {
		for w := q.head; w != nil; w = w.next {
			if !yield(w) {
				return
			}
		}
	}
}
