package fairlock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/fairlock/fairlock/fairlock"
	"go.uber.org/goleak"
)

// FuzzLocker drives random Lock / TryLock / cancel / Unlock / stale-Unlock
// sequences, and Unlock racing a cancel, from several goroutines (actors)
// against a model of the lock: per key a holder and a FIFO queue. After
// every step it checks that the Locker agrees with the model (one holder
// per key, queue lengths, Len), every grant goes to the model's head
// waiter, Len()==0 once idle, and no goroutine is left behind.
func FuzzLocker(f *testing.F) {
	f.Add([]byte{0x00, 0x01, 0x02, 0x10, 0x19, 0x22, 0x31, 0x28})
	f.Add([]byte{0x00, 0x01, 0x02, 0x03, 0x28, 0x19, 0x10, 0x11, 0x12})
	f.Add([]byte{0x04, 0x05, 0x06, 0x2c, 0x1d, 0x34, 0x14, 0x20})
	f.Fuzz(func(t *testing.T, ops []byte) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		if len(ops) > 64 {
			ops = ops[:64]
		}
		newModelRun(t).run(ops)
	})
}

const fuzzActors = 4

var fuzzKeys = [2]string{"a", "b"}

type actorState uint8

const (
	idle actorState = iota
	holding
	waitingFor
)

type fuzzCmd struct {
	try bool
	key string
	ctx context.Context
}

type fuzzResult struct {
	g   fairlock.Guard[string]
	err error
}

type fuzzActor struct {
	cmds   chan fuzzCmd
	res    chan fuzzResult
	state  actorState
	key    string
	guard  fairlock.Guard[string]
	stale  fairlock.Guard[string] // a released guard, for stale Unlocks
	cancel context.CancelFunc
}

type modelRun struct {
	t      *testing.T
	l      *fairlock.Locker[string]
	actors [fuzzActors]*fuzzActor
	holder map[string]int   // key -> actor index
	queue  map[string][]int // key -> waiting actors, oldest first
	wg     sync.WaitGroup
}

func newModelRun(t *testing.T) *modelRun {
	m := &modelRun{t: t, l: fairlock.New[string](fairlock.WithShards(2)), holder: map[string]int{}, queue: map[string][]int{}}
	for i := range m.actors {
		a := &fuzzActor{cmds: make(chan fuzzCmd), res: make(chan fuzzResult, 1)}
		m.actors[i] = a
		m.wg.Add(1)
		go func() { // each actor is its own owner (goroutine id)
			defer m.wg.Done()
			for c := range a.cmds {
				var r fuzzResult
				if c.try {
					r.g, r.err = m.l.TryLock(c.ctx, c.key)
				} else {
					r.g, r.err = m.l.Lock(c.ctx, c.key)
				}
				a.res <- r
			}
		}()
	}
	return m
}

func (m *modelRun) run(ops []byte) {
	for _, op := range ops {
		i, key := int(op)%fuzzActors, fuzzKeys[(op>>2)&1]
		a := m.actors[i]
		switch (op >> 3) % 6 {
		case 0:
			m.lock(i, key)
		case 1:
			m.tryLock(i, key)
		case 2:
			if a.state == holding {
				m.unlock(i)
			}
		case 3:
			if a.state == waitingFor {
				a.cancel()
				if r := recv(m.t, a.res); !errors.Is(r.err, context.Canceled) {
					m.t.Fatalf("cancelled actor %d got %v", i, r.err)
				}
				m.dequeue(i)
			}
		case 4:
			before := m.l.Locked(a.stale.Key()) // stale Unlock changes nothing
			a.stale.Unlock()
			if m.l.Locked(a.stale.Key()) != before {
				m.t.Fatalf("stale Unlock by actor %d changed key %q", i, a.stale.Key())
			}
		case 5:
			if a.state == holding && len(m.queue[a.key]) > 0 {
				m.unlockRacingCancel(i)
			}
		}
		m.check()
	}
	// Wind down: cancel every waiter, then release every holder.
	for i, a := range m.actors {
		if a.state == waitingFor {
			a.cancel()
			recv(m.t, a.res)
			m.dequeue(i)
		}
	}
	for i, a := range m.actors {
		if a.state == holding {
			m.unlock(i)
		}
	}
	m.check()
	if n := m.l.Len(); n != 0 {
		m.t.Fatalf("Len = %d when idle", n)
	}
	if err := m.l.Close(context.Background()); err != nil {
		m.t.Fatal(err)
	}
	for _, a := range m.actors {
		close(a.cmds)
	}
	m.wg.Wait()
}

func (m *modelRun) lock(i int, key string) {
	a := m.actors[i]
	if a.state == waitingFor || (a.state == holding && a.key != key) {
		return // one lock per actor keeps the model small
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.cmds <- fuzzCmd{key: key, ctx: ctx}
	h, held := m.holder[key]
	switch {
	case held && h == i:
		r := recv(m.t, a.res)
		cancel()
		if !errors.Is(r.err, fairlock.ErrReentrant) {
			m.t.Fatalf("actor %d relocking %q got %v, want ErrReentrant", i, key, r.err)
		}
	case held:
		a.state, a.key, a.cancel = waitingFor, key, cancel
		m.queue[key] = append(m.queue[key], i)
		waitWaiters(m.t, m.l, key, len(m.queue[key]))
	default:
		a.cancel = cancel
		m.granted(i, key, recv(m.t, a.res))
	}
}

func (m *modelRun) tryLock(i int, key string) {
	a := m.actors[i]
	if a.state == waitingFor || (a.state == holding && a.key != key) {
		return
	}
	a.cmds <- fuzzCmd{try: true, key: key, ctx: context.Background()}
	r := recv(m.t, a.res)
	h, held := m.holder[key]
	switch {
	case held && h == i:
		if !errors.Is(r.err, fairlock.ErrReentrant) {
			m.t.Fatalf("TryLock by holder %d got %v", i, r.err)
		}
	case held:
		if !errors.Is(r.err, fairlock.ErrWouldBlock) {
			m.t.Fatalf("TryLock of held %q by %d got %v", key, i, r.err)
		}
	default:
		a.cancel = func() {}
		m.granted(i, key, r)
	}
}

// granted records that actor i got key, after checking the result.
func (m *modelRun) granted(i int, key string, r fuzzResult) {
	if r.err != nil {
		m.t.Fatalf("actor %d: Lock of free %q: %v", i, key, r.err)
	}
	if h, held := m.holder[key]; held {
		m.t.Fatalf("actor %d granted %q while actor %d holds it", i, key, h)
	}
	a := m.actors[i]
	a.state, a.key, a.guard = holding, key, r.g
	m.holder[key] = i
}

// unlock releases actor i's key; the model's head waiter must get it.
func (m *modelRun) unlock(i int) {
	a := m.actors[i]
	key := a.key
	a.guard.Unlock()
	m.released(i)
	if q := m.queue[key]; len(q) > 0 {
		m.expectGrant(q[0], key)
	}
}

func (m *modelRun) released(i int) {
	a := m.actors[i]
	delete(m.holder, a.key)
	a.cancel()
	a.stale, a.guard, a.state = a.guard, fairlock.Guard[string]{}, idle
}

// expectGrant waits for actor h (the head of key's queue) to report its
// grant and checks that no other actor woke.
func (m *modelRun) expectGrant(h int, key string) {
	r := recv(m.t, m.actors[h].res)
	m.dequeue(h)
	m.granted(h, key, r)
	for j, other := range m.actors {
		if j != h {
			mustNotReceive(m.t, other.res, "a waiter other than the head woke")
		}
	}
}

func (m *modelRun) dequeue(i int) {
	a := m.actors[i]
	q := m.queue[a.key]
	j := slices.Index(q, i)
	if j < 0 {
		m.t.Fatalf("actor %d not queued on %q", i, a.key)
	}
	m.queue[a.key] = slices.Delete(q, j, j+1)
	a.state = idle
}

// unlockRacingCancel releases actor i's key while the head waiter's
// context is cancelled at the same time. The head either gets the key
// (nil error) or an error, and then the grant passes to the next waiter.
func (m *modelRun) unlockRacingCancel(i int) {
	key := m.actors[i].key
	head := m.queue[key][0]
	h := m.actors[head]
	var wg sync.WaitGroup
	wg.Add(2)
	g := m.actors[i].guard
	go func() { defer wg.Done(); g.Unlock() }()
	go func() { defer wg.Done(); h.cancel() }()
	wg.Wait()
	m.released(i)
	r := recv(m.t, h.res)
	m.dequeue(head)
	if r.err == nil {
		m.granted(head, key, r)
		return
	}
	if !errors.Is(r.err, context.Canceled) || r.g != (fairlock.Guard[string]{}) {
		m.t.Fatalf("racing head %d got (%v, %v)", head, r.g, r.err)
	}
	if q := m.queue[key]; len(q) > 0 {
		m.expectGrant(q[0], key)
	}
}

// check compares the Locker with the model.
func (m *modelRun) check() {
	m.t.Helper()
	for _, k := range fuzzKeys {
		_, held := m.holder[k]
		if got := m.l.Locked(k); got != held {
			m.t.Fatalf("Locked(%q) = %v, model %v", k, got, held)
		}
		// Exact at once: a grant dequeues inside Unlock, a cancelled
		// waiter leaves the queue before its Lock returns.
		if got, want := m.l.Waiters(k), len(m.queue[k]); got != want {
			m.t.Fatalf("Waiters(%q) = %d, model %d", k, got, want)
		}
	}
	if got := m.l.Len(); got != len(m.holder) {
		m.t.Fatalf("Len = %d, model %d", got, len(m.holder))
	}
}
