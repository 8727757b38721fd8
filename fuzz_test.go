package fairlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/fairlock/fairlock/fairlock"
	"go.uber.org/goleak"
)

// FuzzLocker drives random sequences of calls from several goroutines
// (actors) against a reference model, on a Locker (Lock, RLock, Wait and
// the Try forms) or on a Semaphore of 3 units (Acquire and TryAcquire of 1
// to 3): cancellations, Unlocks, stale Unlocks, an Unlock racing the
// head waiter's cancellation, and Close (alone or racing an Unlock).
//
// The model keeps, per key, its holders and its FIFO queue, and grants by
// the rule of docs/guarantees.md: from the head, every request that fits beside
// the holders, up to the first that does not (a writer fits only alone, a
// reader beside readers, a Wait passes when nothing is held, a weight
// when the units are free). After every step the Locker must agree with
// the model: exactly the actors the model grants are woken, in no other
// order than the model's, their tokens grow in grant order, no reader is
// granted beside a writer and no key has more than its units out, and
// Locked, Waiters and Len match. At the end Len()==0, an observer heard of
// every call and release the model counted, and no goroutine is left.
//
// The first byte picks the configuration (lockerConfigs) and the face.
func FuzzLocker(f *testing.F) {
	for c := range byte(2 * len(lockerConfigs)) {
		f.Add([]byte{c, 0x00, 0x01, 0x02, 0x10, 0x19, 0x22, 0x31, 0x28})
		f.Add([]byte{c, 0x00, 0x01, 0x02, 0x03, 0x28, 0x19, 0x10, 0x11, 0x12})
		f.Add([]byte{c, 0x04, 0x05, 0x06, 0x2c, 0x1d, 0x34, 0x14, 0x20})
		// Readers together, a writer queued behind them, a reader behind
		// the writer, a Wait: 0x08.. RLock, 0x00.. Lock, 0x10.. Wait.
		f.Add([]byte{c, 0x08, 0x09, 0x02, 0x0b, 0x20, 0x21, 0x30, 0x31})
		f.Add([]byte{c, 0x08, 0x11, 0x0a, 0x03, 0x20, 0x29, 0x2a, 0x38, 0x21})
		// Keys locked again after they went idle.
		f.Add([]byte{c, 0x00, 0x20, 0x05, 0x00, 0x21, 0x20, 0x30, 0x0d, 0x20})
		// Close racing the Unlock of a key with two waiters; Close while
		// two keys are held; Close of an idle Locker.
		f.Add([]byte{c, 0x00, 0x01, 0x0a, 0xf8, 0x09, 0x21, 0x22, 0x07})
		f.Add([]byte{c, 0x00, 0x05, 0xf9, 0x20, 0x0c, 0x21})
		f.Add([]byte{c, 0xfb, 0x00, 0x0d})
	}
	f.Fuzz(func(t *testing.T, ops []byte) {
		defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
		if len(ops) == 0 {
			return
		}
		c := lockerConfigs[int(ops[0])%len(lockerConfigs)]
		semaphore := int(ops[0])/len(lockerConfigs)%2 == 1
		ops = ops[1:]
		if len(ops) > 64 {
			ops = ops[:64]
		}
		newModelRun(t, c, semaphore).run(ops)
	})
}

const (
	fuzzActors = 4
	fuzzUnits  = 3 // the Semaphore's units per key
)

var fuzzKeys = [2]string{"a", "b"}

// reqKind is what a call asks for.
type reqKind uint8

const (
	exclusive reqKind = iota // Lock
	shared                   // RLock
	turn                     // Wait
	weighted                 // Semaphore.Acquire
)

// modelReq is one call as the model sees it.
type modelReq struct {
	actor int
	kind  reqKind
	units int64 // weighted only
	try   bool
}

func (r modelReq) String() string {
	name := [...]string{"Lock", "RLock", "Wait", "Acquire"}[r.kind]
	if r.try {
		name = "Try" + name
	}
	if r.kind == weighted {
		return fmt.Sprintf("%s(%d)", name, r.units)
	}
	return name
}

type actorState uint8

const (
	idle actorState = iota
	holding
	waitingFor
)

type fuzzCmd struct {
	req modelReq
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
	req    modelReq // of the grant held or the call queued
	guard  fairlock.Guard[string]
	stale  fairlock.Guard[string] // a released guard, for stale Unlocks
	cancel context.CancelFunc
}

// modelKey is the model's state of one key.
type modelKey struct {
	holders   map[int]modelReq // actor -> its grant
	queue     []modelReq       // oldest first
	lastToken uint64           // of the last grant
}

type modelRun struct {
	t         *testing.T
	l         *fairlock.Locker[string]    // the Locker face, or nil
	s         *fairlock.Semaphore[string] // the Semaphore face, or nil
	obs       *tally
	semaphore bool
	// What the model expects the observer to have heard: calls per
	// result, and releases.
	results  map[fairlock.Result]int
	releases int
	actors   [fuzzActors]*fuzzActor
	keys     map[string]*modelKey
	// closed is set once Close was called; closeErr then receives its
	// result, and closeReturned is set once the model has taken it.
	closed        bool
	closeErr      chan error
	closeReturned bool
	wg            sync.WaitGroup
}

func newModelRun(t *testing.T, c lockerConfig, semaphore bool) *modelRun {
	m := &modelRun{t: t, semaphore: semaphore, results: map[fairlock.Result]int{}, keys: map[string]*modelKey{}}
	if semaphore {
		m.s, m.obs = newSemaphore(t, c, fuzzUnits, fairlock.WithShards(2))
	} else {
		m.l, m.obs = newLocker[string](t, c, fairlock.WithShards(2))
	}
	for _, k := range fuzzKeys {
		m.keys[k] = &modelKey{holders: map[int]modelReq{}}
	}
	for i := range m.actors {
		a := &fuzzActor{cmds: make(chan fuzzCmd), res: make(chan fuzzResult, 1)}
		m.actors[i] = a
		m.wg.Add(1)
		go func() { // each actor is its own owner (goroutine id)
			defer m.wg.Done()
			for c := range a.cmds {
				a.res <- m.call(c)
			}
		}()
	}
	return m
}

// call makes c's call on the face under test.
func (m *modelRun) call(c fuzzCmd) (r fuzzResult) {
	switch {
	case c.req.kind == weighted && c.req.try:
		r.g, r.err = m.s.TryAcquire(c.ctx, c.key, c.req.units)
	case c.req.kind == weighted:
		r.g, r.err = m.s.Acquire(c.ctx, c.key, c.req.units)
	case c.req.kind == turn:
		r.err = m.l.Wait(c.ctx, c.key)
	case c.req.kind == shared && c.req.try:
		r.g, r.err = m.l.TryRLock(c.ctx, c.key)
	case c.req.kind == shared:
		r.g, r.err = m.l.RLock(c.ctx, c.key)
	case c.req.try:
		r.g, r.err = m.l.TryLock(c.ctx, c.key)
	default:
		r.g, r.err = m.l.Lock(c.ctx, c.key)
	}
	return r
}

// request decodes a call from op's top bits.
func (m *modelRun) request(i int, op byte, try bool) modelReq {
	sel := op >> 3 // 0-7 here
	if m.semaphore {
		return modelReq{actor: i, kind: weighted, units: int64(sel%fuzzUnits) + 1, try: try}
	}
	switch sel % 3 {
	case 0:
		return modelReq{actor: i, kind: exclusive, try: try}
	case 1:
		return modelReq{actor: i, kind: shared, try: try}
	default:
		if try {
			return modelReq{actor: i, kind: shared, try: true} // there is no TryWait
		}
		return modelReq{actor: i, kind: turn}
	}
}

func (m *modelRun) run(ops []byte) {
	for _, op := range ops {
		i, key := int(op)%fuzzActors, fuzzKeys[(op>>2)&1]
		a := m.actors[i]
		if op>>3 == 31 { // 0xf8-0xff only: every call after it is refused
			m.close(i)
			m.check()
			continue
		}
		switch (op >> 3) % 8 {
		case 0, 1, 2:
			m.ask(key, m.request(i, op, false))
		case 3:
			m.ask(key, m.request(i, op>>2, true))
		case 4, 5:
			if a.state == holding {
				m.unlock(i)
			} else if a.state == waitingFor {
				m.cancelWaiter(i)
			}
		case 6:
			if a.stale == (fairlock.Guard[string]{}) {
				break
			}
			before := m.locked(a.stale.Key()) // stale Unlock changes nothing
			a.stale.Unlock()
			if m.locked(a.stale.Key()) != before {
				m.t.Fatalf("stale Unlock by actor %d changed key %q", i, a.stale.Key())
			}
		case 7:
			if a.state == holding && len(m.keys[a.key].queue) > 0 {
				m.unlockRacingCancel(i)
			}
		}
		m.check()
	}
	// Wind down: cancel every waiter, then release every holder.
	for i, a := range m.actors {
		if a.state == waitingFor {
			m.cancelWaiter(i)
		}
	}
	for i, a := range m.actors {
		if a.state == holding {
			m.unlock(i)
		}
	}
	m.check()
	if n := m.len(); n != 0 {
		m.t.Fatalf("Len = %d when idle", n)
	}
	checkTally(m.t, m.obs, m.results, m.releases)
	if err := m.closeFace(); err != nil { // the first, or a second
		m.t.Fatal(err)
	}
	for _, a := range m.actors {
		close(a.cmds)
	}
	m.wg.Wait()
}

// fits reports whether r can be granted beside k's holders.
func (m *modelRun) fits(k *modelKey, r modelReq) bool {
	switch r.kind {
	case exclusive, turn:
		return len(k.holders) == 0
	case shared:
		for _, h := range k.holders {
			if h.kind == exclusive {
				return false
			}
		}
		return true
	default:
		used := r.units
		for _, h := range k.holders {
			used += h.units
		}
		return used <= fuzzUnits
	}
}

// grantPass pops and returns, in order, the waiters the model grants now.
func (m *modelRun) grantPass(key string) []modelReq {
	k := m.keys[key]
	var decided []modelReq
	for len(k.queue) > 0 && m.fits(k, k.queue[0]) {
		r := k.queue[0]
		k.queue = k.queue[1:]
		if r.kind != turn {
			k.holders[r.actor] = r
		}
		decided = append(decided, r)
	}
	return decided
}

// ask makes actor r.actor ask for key.
func (m *modelRun) ask(key string, r modelReq) {
	a := m.actors[r.actor]
	if a.state == waitingFor || (a.state == holding && a.key != key) {
		return // one call per actor keeps the model small
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.cmds <- fuzzCmd{req: r, key: key, ctx: ctx}
	k := m.keys[key]
	_, holds := k.holders[r.actor]
	switch {
	case m.closed:
		m.refused(r, key, fairlock.ErrClosed, fairlock.Closed)
		cancel()
	case holds:
		m.refused(r, key, fairlock.ErrReentrant, fairlock.Reentrant)
		cancel()
	case len(k.queue) == 0 && m.fits(k, r):
		if r.kind != turn {
			k.holders[r.actor] = r
		}
		a.cancel = cancel
		m.decided(key, r, recv(m.t, a.res))
	case r.try:
		m.refused(r, key, fairlock.ErrWouldBlock, fairlock.WouldBlock)
		cancel()
	default:
		a.state, a.key, a.req, a.cancel = waitingFor, key, r, cancel
		k.queue = append(k.queue, r)
		waitFor(m.t, "the call is queued", func() bool { return m.waiters(key) == len(k.queue) })
	}
}

// refused checks that r's call, whose result is on its way, failed with
// want.
func (m *modelRun) refused(r modelReq, key string, want error, result fairlock.Result) {
	got := recv(m.t, m.actors[r.actor].res)
	if !errors.Is(got.err, want) || got.g != (fairlock.Guard[string]{}) {
		m.t.Fatalf("actor %d: %s of %q got (%v, %v), want %v", r.actor, r, key, got.g, got.err, want)
	}
	if r.kind != turn {
		m.results[result]++
	}
}

// decided checks got, the result of r's call, which the model granted (or
// whose turn came, for a Wait), and records it.
func (m *modelRun) decided(key string, r modelReq, got fuzzResult) {
	a := m.actors[r.actor]
	if got.err != nil {
		m.t.Fatalf("actor %d: %s of %q, granted by the model: %v", r.actor, r, key, got.err)
	}
	if r.kind == turn {
		if got.g != (fairlock.Guard[string]{}) {
			m.t.Fatalf("actor %d: Wait returned a grant", r.actor)
		}
		a.state, a.cancel = idle, nil
		return
	}
	k := m.keys[key]
	if got.g.Token() <= k.lastToken {
		m.t.Fatalf("actor %d: %s of %q got token %d, not above the last grant's %d", r.actor, r, key, got.g.Token(), k.lastToken)
	}
	k.lastToken = got.g.Token()
	a.state, a.key, a.req, a.guard = holding, key, r, got.g
	if a.cancel == nil {
		a.cancel = func() {}
	}
	m.results[fairlock.Acquired]++
}

// expectDecided receives the results of the waiters the model decided, in
// the model's order, and checks that no other actor woke.
func (m *modelRun) expectDecided(key string, decided []modelReq) {
	for _, r := range decided {
		m.decided(key, r, recv(m.t, m.actors[r.actor].res))
	}
	for j, other := range m.actors {
		if other.state == waitingFor {
			mustNotReceive(m.t, other.res, fmt.Sprintf("actor %d, not granted by the model, woke", j))
		}
	}
}

// unlock releases actor i's grant; the model's grant pass must follow.
func (m *modelRun) unlock(i int) {
	a := m.actors[i]
	key := a.key
	a.guard.Unlock()
	m.released(i)
	m.expectDecided(key, m.grantPass(key))
}

func (m *modelRun) released(i int) {
	a := m.actors[i]
	delete(m.keys[a.key].holders, i)
	m.releases++
	a.cancel()
	a.stale, a.guard, a.state = a.guard, fairlock.Guard[string]{}, idle
}

// cancelWaiter cancels waiting actor i: it leaves the queue with the
// context's error, and the grant pass re-runs for those it blocked.
func (m *modelRun) cancelWaiter(i int) {
	a := m.actors[i]
	a.cancel()
	if r := recv(m.t, a.res); !errors.Is(r.err, context.Canceled) {
		m.t.Fatalf("cancelled actor %d (%s) got %v", i, a.req, r.err)
	}
	if a.req.kind != turn {
		m.results[fairlock.Canceled]++
	}
	key := a.key
	m.dequeue(i)
	m.expectDecided(key, m.grantPass(key))
}

// locked reports Locked(key) on a Locker, or whether the model has a
// holder (a Semaphore has no Locked).
func (m *modelRun) locked(key string) bool {
	if m.l != nil {
		return m.l.Locked(key)
	}
	return len(m.keys[key].holders) > 0
}

func (m *modelRun) waiters(key string) int {
	if m.l != nil {
		return m.l.Waiters(key)
	}
	return m.s.Waiters(key)
}

func (m *modelRun) len() int {
	if m.l != nil {
		return m.l.Len()
	}
	return m.s.Len()
}

func (m *modelRun) closeFace() error {
	if m.l != nil {
		return m.l.Close(context.Background())
	}
	return m.s.Close(context.Background())
}

func (m *modelRun) dequeue(i int) {
	a := m.actors[i]
	k := m.keys[a.key]
	j := slices.IndexFunc(k.queue, func(r modelReq) bool { return r.actor == i })
	if j < 0 {
		m.t.Fatalf("actor %d not queued on %q", i, a.key)
	}
	k.queue = slices.Delete(k.queue, j, j+1)
	a.state = idle
}

// unlockRacingCancel releases actor i's grant while the head waiter's
// context is cancelled at the same time. The head either goes on (nil:
// granted, or its Wait's turn came) or gets the context's error; then it
// held nothing, or gave its grant back, and the grant passes on. Either
// way the others end as if the head had left first.
func (m *modelRun) unlockRacingCancel(i int) {
	key := m.actors[i].key
	k := m.keys[key]
	head := k.queue[0]
	h := m.actors[head.actor]
	var wg sync.WaitGroup
	wg.Add(2)
	g := m.actors[i].guard
	go func() { defer wg.Done(); g.Unlock() }()
	go func() { defer wg.Done(); h.cancel() }()
	wg.Wait()
	m.released(i)
	r := recv(m.t, h.res)
	if r.err == nil {
		decided := m.grantPass(key)
		if len(decided) == 0 || decided[0].actor != head.actor {
			m.t.Fatalf("racing head %d (%s) went on, but the model's grant pass does not grant it", head.actor, head)
		}
		m.decided(key, head, r)
		m.expectDecided(key, decided[1:])
		return
	}
	if !errors.Is(r.err, context.Canceled) || r.g != (fairlock.Guard[string]{}) {
		m.t.Fatalf("racing head %d (%s) got (%v, %v)", head.actor, head, r.g, r.err)
	}
	if head.kind != turn {
		m.results[fairlock.Canceled]++ // no release: a grant given back unused is not one
	}
	m.dequeue(head.actor)
	m.expectDecided(key, m.grantPass(key))
}

// close calls Close. If actor i holds a key with waiters, its Unlock races
// the Close: the waiters its grant pass decides are either all granted or
// all closed (Close and the pass each take the shard mutex). Every other
// waiter gets ErrClosed.
func (m *modelRun) close(i int) {
	if m.closed {
		return
	}
	m.closed, m.closeErr = true, make(chan error, 1)
	a := m.actors[i]
	var raced []modelReq // the waiters the racing Unlock's pass would decide
	if a.state == holding && len(m.keys[a.key].queue) > 0 {
		key := a.key
		g := a.guard
		unlocked := make(chan struct{})
		go func() { defer close(unlocked); g.Unlock() }()
		go func() { m.closeErr <- m.closeFace() }()
		recv(m.t, unlocked)
		m.released(i)
		raced = m.grantPass(key)
		m.keys[key].queue = append(slices.Clone(raced), m.keys[key].queue...) // undo: taken below
		for _, r := range raced {
			if r.kind != turn {
				delete(m.keys[key].holders, r.actor)
			}
		}
	} else {
		go func() { m.closeErr <- m.closeFace() }()
	}
	// The raced waiters first, in the pass's order (their tokens grow in
	// it), then every other waiter.
	racedGranted := -1 // unknown until the first raced result
	for _, req := range raced {
		w := m.actors[req.actor]
		key := w.key
		r := recv(m.t, w.res)
		m.dequeue(req.actor)
		got := 0
		if r.err == nil {
			got = 1
		}
		if racedGranted >= 0 && got != racedGranted {
			m.t.Fatalf("the waiters of one grant pass racing Close were not all granted or all closed")
		}
		racedGranted = got
		if r.err == nil {
			if req.kind != turn {
				m.keys[key].holders[req.actor] = req
			}
			m.decided(key, req, r)
			continue
		}
		m.closedOut(req.actor, key, req, r)
	}
	for j, w := range m.actors {
		if w.state != waitingFor {
			continue
		}
		key, req := w.key, w.req
		r := recv(m.t, w.res)
		m.dequeue(j)
		m.closedOut(j, key, req, r)
	}
	m.awaitClosed()
}

// closedOut checks that actor j's call req on key got ErrClosed.
func (m *modelRun) closedOut(j int, key string, req modelReq, r fuzzResult) {
	if !errors.Is(r.err, fairlock.ErrClosed) || r.g != (fairlock.Guard[string]{}) {
		m.t.Fatalf("actor %d (%s) waiting for %q when closed got (%v, %v), want ErrClosed", j, req, key, r.g, r.err)
	}
	if req.kind != turn {
		m.results[fairlock.Closed]++
	}
}

// awaitClosed returns once Close has closed the shards of both keys: it
// runs in a goroutine of its own and closes one shard after another. It
// probes with a Try call from the test's goroutine, an owner apart from
// the actors, and counts what each probe reports.
func (m *modelRun) awaitClosed() {
	for _, k := range fuzzKeys {
		waitFor(m.t, "Close has reached key "+k, func() bool {
			var g fairlock.Guard[string]
			var err error
			if m.l != nil {
				g, err = m.l.TryLock(context.Background(), k)
			} else {
				g, err = m.s.TryAcquire(context.Background(), k, 1)
			}
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
				m.t.Fatalf("probe of %q while closing: %v", k, err)
			}
			return false
		})
	}
}

// check compares the face with the model, and the model with the rules.
func (m *modelRun) check() {
	m.t.Helper()
	if m.closed && !m.closeReturned {
		// Close returns once no key is held, and not before.
		held := false
		for _, k := range m.keys {
			held = held || len(k.holders) > 0
		}
		if held {
			mustNotReceive(m.t, m.closeErr, "Close returned while a key was held")
		} else {
			if err := recv(m.t, m.closeErr); err != nil {
				m.t.Fatalf("Close after the last Unlock: %v", err)
			}
			m.closeReturned = true
		}
	}
	live := 0
	for _, key := range fuzzKeys {
		k := m.keys[key]
		writers, readers, units := 0, 0, int64(0)
		for _, h := range k.holders {
			switch h.kind {
			case exclusive:
				writers++
			case shared:
				readers++
			default:
				units += h.units
			}
		}
		if writers > 1 || (writers == 1 && readers > 0) || units > fuzzUnits {
			m.t.Fatalf("model broke exclusion on %q: %d writers, %d readers, %d units", key, writers, readers, units)
		}
		if len(k.queue) > 0 && len(k.holders) == 0 {
			m.t.Fatalf("model has waiters on %q behind no holder", key)
		}
		if got, want := m.locked(key), len(k.holders) > 0; got != want {
			m.t.Fatalf("Locked(%q) = %v, model %v", key, got, want)
		}
		// Exact at once: a grant dequeues inside Unlock, a cancelled
		// waiter leaves the queue before its call returns.
		if got, want := m.waiters(key), len(k.queue); got != want {
			m.t.Fatalf("Waiters(%q) = %d, model %d", key, got, want)
		}
		if len(k.holders) > 0 || len(k.queue) > 0 {
			live++
		}
	}
	if got := m.len(); got != live {
		m.t.Fatalf("Len = %d, model %d", got, live)
	}
}
