package keylocktest_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
)

// toy is a small keyed lock written for this package's tests: a second
// backend beside the in-process one, with a Lose, and with a policy that
// can be broken on purpose. With policy fifo it keeps every promise the
// suite checks for an exclusive Locker (it is the control: the suite
// passes on it); lifo hands a released key to the newest waiter; barge
// frees the key on Unlock and lets the woken head waiter race for it,
// while Lock and TryLock take a free key whoever is queued (sync.Mutex's
// normal mode); forgetLoss is fifo whose Unlock of a lost grant returns
// nil instead of ErrLost; zeroDeadline is fifo whose Deadline stays zero
// after Unlock or a loss; fakeHandOff is fifo whose HandOff says yes and
// moves nothing.
type toy struct {
	policy policy

	mu     sync.Mutex // protects everything below and the toyLockers' and toyLeases' fields
	keys   map[string]*toyKey
	tokens map[string]uint64 // the last token granted per key; never deleted
}

type policy string

const (
	fifo  policy = "fifo"
	lifo  policy = "lifo"
	barge policy = "barge"

	forgetLoss   policy = "forgetloss"
	zeroDeadline policy = "zerodeadline"
	fakeHandOff  policy = "fakehandoff"
)

// toyKey is a key's state: its holder and its queue, oldest first.
type toyKey struct {
	holder *toyLease
	queue  []*toyWaiter
}

// toyWaiter is a queued Lock or Wait. ready is closed when it is granted
// (lease set), its turn came (a Wait), it was woken to race for the key
// (barge), or Close woke it (err set).
type toyWaiter struct {
	l     *toyLocker
	owner owner.ID
	turn  bool // a Wait
	ready chan struct{}
	lease *toyLease
	err   error
}

// toyLocker is one Locker of a toy: Close and reentrancy are per Locker.
type toyLocker struct {
	b      *toy
	closed bool
	held   int // grants through this Locker not yet released or lost
}

// toyLease is one grant.
type toyLease struct {
	l        *toyLocker
	key      string
	owner    owner.ID
	token    uint64
	lost     chan struct{}
	released bool      // Unlock ran
	gone     bool      // released or lost: the key is no longer its
	ended    time.Time // when it was released or lost
	isLost   bool
}

func newToy(p policy) *toy {
	return &toy{policy: p, keys: map[string]*toyKey{}, tokens: map[string]uint64{}}
}

func (b *toy) locker() *toyLocker { return &toyLocker{b: b} }

// waiters counts the calls queued on key.
func (b *toy) waiters(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if k := b.keys[key]; k != nil {
		return len(k.queue)
	}
	return 0
}

// grantLocked makes w the holder of key; b.mu is held.
func (b *toy) grantLocked(l *toyLocker, k *toyKey, key string, id owner.ID) *toyLease {
	b.tokens[key]++
	g := &toyLease{l: l, key: key, owner: id, token: b.tokens[key], lost: make(chan struct{})}
	k.holder = g
	l.held++
	return g
}

// handOffLocked passes a free key on as the policy says; b.mu is held.
func (b *toy) handOffLocked(key string) {
	k := b.keys[key]
	for k.holder == nil && len(k.queue) > 0 {
		i := 0
		if b.policy == lifo {
			i = len(k.queue) - 1
		}
		w := k.queue[i]
		if b.policy == barge {
			select {
			case <-w.ready: // already woken, racing
			default:
				close(w.ready)
			}
			return
		}
		k.queue = slices.Delete(k.queue, i, i+1)
		if !w.turn {
			w.lease = b.grantLocked(w.l, k, key, w.owner)
		}
		close(w.ready)
	}
	if k.holder == nil && len(k.queue) == 0 {
		delete(b.keys, key)
	}
}

func (b *toy) keyLocked(key string) *toyKey {
	k := b.keys[key]
	if k == nil {
		k = &toyKey{}
		b.keys[key] = k
	}
	return k
}

func toyError(op, key string, ctx context.Context, err error) error {
	return &fairlock.LockError{Op: op, Key: key, Owner: owner.Of(ctx), Err: err}
}

func (l *toyLocker) Lock(ctx context.Context, key string) (keylock.Lease, error) {
	g, err := l.acquire(ctx, "Lock", key, false, false)
	if err != nil {
		return nil, err
	}
	return g, nil
}

func (l *toyLocker) TryLock(ctx context.Context, key string) (keylock.Lease, error) {
	g, err := l.acquire(ctx, "TryLock", key, true, false)
	if err != nil {
		return nil, err
	}
	return g, nil
}

func (l *toyLocker) Wait(ctx context.Context, key string) error {
	_, err := l.acquire(ctx, "Wait", key, false, true)
	return err
}

func (l *toyLocker) acquire(ctx context.Context, op, key string, try, turn bool) (*toyLease, error) {
	if ctx.Err() != nil {
		return nil, toyError(op, key, ctx, ctx.Err())
	}
	b, id := l.b, owner.Of(ctx)
	b.mu.Lock()
	if l.closed {
		b.mu.Unlock()
		return nil, toyError(op, key, ctx, fairlock.ErrClosed)
	}
	k := b.keyLocked(key)
	if h := k.holder; h != nil && h.l == l && h.owner == id {
		b.mu.Unlock()
		return nil, toyError(op, key, ctx, fairlock.ErrReentrant)
	}
	if k.holder == nil && (len(k.queue) == 0 || b.policy == barge) {
		if turn {
			b.handOffLocked(key) // deletes the key's state if it is idle
			b.mu.Unlock()
			return nil, nil
		}
		g := b.grantLocked(l, k, key, id)
		b.mu.Unlock()
		return g, nil
	}
	if try {
		b.handOffLocked(key)
		b.mu.Unlock()
		return nil, toyError(op, key, ctx, fairlock.ErrWouldBlock)
	}
	w := &toyWaiter{l: l, owner: id, turn: turn, ready: make(chan struct{})}
	k.queue = append(k.queue, w)
	b.mu.Unlock()
	for {
		select {
		case <-w.ready:
		case <-ctx.Done():
		}
		b.mu.Lock()
		select {
		case <-w.ready:
		default: // ctx ended while queued: leave the queue
			k.queue = slices.DeleteFunc(k.queue, func(o *toyWaiter) bool { return o == w })
			b.handOffLocked(key)
			b.mu.Unlock()
			return nil, toyError(op, key, ctx, ctx.Err())
		}
		switch {
		case w.err != nil:
			b.mu.Unlock()
			return nil, toyError(op, key, ctx, w.err)
		case b.policy == barge:
			if k.holder != nil { // someone barged in: wait for the next wake-up
				w.ready = make(chan struct{})
				b.mu.Unlock()
				continue
			}
			k.queue = slices.DeleteFunc(k.queue, func(o *toyWaiter) bool { return o == w })
			if !turn {
				w.lease = b.grantLocked(l, k, key, id)
			}
			b.handOffLocked(key)
		}
		b.mu.Unlock()
		return w.lease, nil
	}
}

func (l *toyLocker) Close(ctx context.Context) error {
	b := l.b
	b.mu.Lock()
	if !l.closed {
		l.closed = true
		for key, k := range b.keys {
			kept := k.queue[:0]
			for _, w := range k.queue {
				if w.l == l {
					w.err = fairlock.ErrClosed
					close(w.ready)
				} else {
					kept = append(kept, w)
				}
			}
			k.queue = kept
			b.handOffLocked(key)
		}
	}
	b.mu.Unlock()
	for {
		b.mu.Lock()
		held := l.held
		b.mu.Unlock()
		if held == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("toy: Close: %d grants held: %w", held, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

func (g *toyLease) Unlock(context.Context) error {
	b := g.l.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if g.released {
		return nil
	}
	g.released = true
	if g.ended.IsZero() {
		g.ended = time.Now()
	}
	if g.isLost {
		if b.policy == forgetLoss {
			return nil
		}
		return &fairlock.LockError{Op: "Unlock", Key: g.key, Owner: g.owner, Err: fairlock.ErrLost}
	}
	g.leaveLocked()
	return nil
}

// leaveLocked gives the key up; b.mu is held.
func (g *toyLease) leaveLocked() {
	g.gone = true
	if g.ended.IsZero() {
		g.ended = time.Now()
	}
	g.l.held--
	b := g.l.b
	b.keys[g.key].holder = nil
	b.handOffLocked(g.key)
}

// lose loses the grant, as an expired lease would.
func (g *toyLease) lose() {
	b := g.l.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if g.gone {
		return
	}
	g.isLost = true
	close(g.lost)
	g.leaveLocked()
}

func (g *toyLease) Key() string           { return g.key }
func (g *toyLease) Token() uint64         { return g.token }
func (g *toyLease) Lost() <-chan struct{} { return g.lost }

// Deadline is zero while the grant is held (the toy loses grants only
// when told to), and the instant it ended after.
func (g *toyLease) Deadline() time.Time {
	b := g.l.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.policy == zeroDeadline {
		return time.Time{}
	}
	return g.ended
}

// HandOff gives the grant to to, unless it ended, to is 0, or to is
// queued on the key.
func (g *toyLease) HandOff(to owner.ID) bool {
	b := g.l.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if g.gone || to == 0 {
		return false
	}
	for _, w := range b.keys[g.key].queue {
		if w.owner == to {
			return false
		}
	}
	if b.policy != fakeHandOff {
		g.owner = to
	}
	return true
}
