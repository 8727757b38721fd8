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

// FuzzLocker drives random Lock / TryLock / cancel / Unlock /
// stale Unlock sequences, Unlock racing a cancel, and Close (alone or
// racing an Unlock), from several goroutines (actors) against a model of
// the lock: per key a holder and a FIFO queue. The first byte picks the
// Locker's configuration (lockerConfigs). After every step it checks that
// the Locker agrees with the model (one holder per key, queue lengths,
// Len) and every grant goes to the model's head waiter; at the end, that
// Len()==0 once idle, that an observer heard of every call and release
// the model counted, and that no goroutine is left behind.
func FuzzLocker(f *testing.F) {
	for c := range byte(len(lockerConfigs)) {
		f.Add([]byte{c, 0x00, 0x01, 0x02, 0x10, 0x19, 0x22, 0x31, 0x28})
		f.Add([]byte{c, 0x00, 0x01, 0x02, 0x03, 0x28, 0x19, 0x10, 0x11, 0x12})
		f.Add([]byte{c, 0x04, 0x05, 0x06, 0x2c, 0x1d, 0x34, 0x14, 0x20})
		// Keys locked again after they went idle: Lock, TryLock, Unlock.
		f.Add([]byte{c, 0x00, 0x10, 0x05, 0x00, 0x11, 0x10, 0x08, 0x0d, 0x10})
		// Close racing the Unlock of a key with two waiters; Close while
		// two keys are held; Close of an idle Locker.
		f.Add([]byte{c, 0x00, 0x01, 0x02, 0xf8, 0x09, 0x11, 0x12, 0x07})
		f.Add([]byte{c, 0x00, 0x05, 0xf9, 0x10, 0x0c, 0x11})
		f.Add([]byte{c, 0xfb, 0x00, 0x0d})
	}
	f.Fuzz(func(t *testing.T, ops []byte) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		if len(ops) == 0 {
			return
		}
		c := lockerConfigs[int(ops[0])%len(lockerConfigs)]
		ops = ops[1:]
		if len(ops) > 64 {
			ops = ops[:64]
		}
		newModelRun(t, c).run(ops)
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
	t   *testing.T
	l   *fairlock.Locker[string]
	obs *tally
	// What the model expects the observer to have heard: calls per
	// result, and releases.
	results  map[fairlock.Result]int
	releases int
	actors   [fuzzActors]*fuzzActor
	holder   map[string]int   // key -> actor index
	queue    map[string][]int // key -> waiting actors, oldest first
	// closed is set once Close was called; closeErr then receives its
	// result, and closeReturned is set once the model has taken it.
	closed        bool
	closeErr      chan error
	closeReturned bool
	wg            sync.WaitGroup
}

func newModelRun(t *testing.T, c lockerConfig) *modelRun {
	l, obs := newLocker[string](t, c, fairlock.WithShards(2))
	m := &modelRun{t: t, l: l, obs: obs, results: map[fairlock.Result]int{}, holder: map[string]int{}, queue: map[string][]int{}}
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
		if op>>3 == 31 { // 0xf8-0xff only: every Lock after it is refused
			m.close(i)
			m.check()
			continue
		}
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
				m.results[fairlock.Canceled]++
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
			if r := recv(m.t, a.res); !errors.Is(r.err, context.Canceled) {
				m.t.Fatalf("cancelled actor %d got %v", i, r.err)
			}
			m.results[fairlock.Canceled]++
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
	checkTally(m.t, m.obs, m.results, m.releases)
	if err := m.l.Close(context.Background()); err != nil { // the first, or a second
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
	if m.closed {
		m.refusedClosed(i, fuzzCmd{key: key, ctx: context.Background()})
		return
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
		m.results[fairlock.Reentrant]++
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
	if m.closed {
		m.refusedClosed(i, fuzzCmd{try: true, key: key, ctx: context.Background()})
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
		m.results[fairlock.Reentrant]++
	case held:
		if !errors.Is(r.err, fairlock.ErrWouldBlock) {
			m.t.Fatalf("TryLock of held %q by %d got %v", key, i, r.err)
		}
		m.results[fairlock.WouldBlock]++
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
	m.results[fairlock.Acquired]++
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
	m.releases++
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
	// Granted and given back unused, or cancelled while queued: either
	// way one cancellation, and no release reported.
	m.results[fairlock.Canceled]++
	if q := m.queue[key]; len(q) > 0 {
		m.expectGrant(q[0], key)
	}
}

// close calls Close. If actor i holds a key with waiters, its Unlock races
// the Close: the head waiter either gets the key or ErrClosed. Every other
// waiter gets ErrClosed.
func (m *modelRun) close(i int) {
	if m.closed {
		return
	}
	m.closed, m.closeErr = true, make(chan error, 1)
	a := m.actors[i]
	head := -1
	if a.state == holding && len(m.queue[a.key]) > 0 {
		head = m.queue[a.key][0]
		g := a.guard
		unlocked := make(chan struct{})
		go func() { defer close(unlocked); g.Unlock() }()
		go func() { m.closeErr <- m.l.Close(context.Background()) }()
		recv(m.t, unlocked)
		m.released(i)
	} else {
		go func() { m.closeErr <- m.l.Close(context.Background()) }()
	}
	for j, w := range m.actors {
		if w.state != waitingFor {
			continue
		}
		key := w.key
		r := recv(m.t, w.res)
		m.dequeue(j)
		if j == head && r.err == nil {
			m.granted(j, key, r)
			continue
		}
		if !errors.Is(r.err, fairlock.ErrClosed) || r.g != (fairlock.Guard[string]{}) {
			m.t.Fatalf("actor %d waiting for %q when closed got (%v, %v), want ErrClosed", j, key, r.g, r.err)
		}
		m.results[fairlock.Closed]++
	}
	m.awaitClosed()
}

// awaitClosed returns once Close has closed the shards of both keys: it
// runs in a goroutine of its own and closes one shard after another. It
// probes with TryLock from the test's goroutine, an owner apart from the
// actors, and counts what each probe reports.
func (m *modelRun) awaitClosed() {
	for _, k := range fuzzKeys {
		waitFor(m.t, "Close has reached key "+k, func() bool {
			g, err := m.l.TryLock(context.Background(), k)
			switch {
			case err == nil:
				g.Unlock()
				m.results[fairlock.Acquired]++
				m.releases++
			case errors.Is(err, fairlock.ErrWouldBlock):
				m.results[fairlock.WouldBlock]++
			case errors.Is(err, fairlock.ErrClosed):
				m.results[fairlock.Closed]++
				return true
			default:
				m.t.Fatalf("probe TryLock of %q while closing: %v", k, err)
			}
			return false
		})
	}
}

// refusedClosed sends cmd to actor i after Close and checks it is refused.
func (m *modelRun) refusedClosed(i int, cmd fuzzCmd) {
	m.actors[i].cmds <- cmd
	if r := recv(m.t, m.actors[i].res); !errors.Is(r.err, fairlock.ErrClosed) || r.g != (fairlock.Guard[string]{}) {
		m.t.Fatalf("actor %d: %q after Close got (%v, %v), want ErrClosed", i, cmd.key, r.g, r.err)
	}
	m.results[fairlock.Closed]++
}

// check compares the Locker with the model.
func (m *modelRun) check() {
	m.t.Helper()
	if m.closed && !m.closeReturned {
		// Close returns once no key is held, and not before.
		if len(m.holder) > 0 {
			mustNotReceive(m.t, m.closeErr, "Close returned while a key was held")
		} else {
			if err := recv(m.t, m.closeErr); err != nil {
				m.t.Fatalf("Close after the last Unlock: %v", err)
			}
			m.closeReturned = true
		}
	}
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
