package etcdlock

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/internal/ctxerr"
	"github.com/fairlock/fairlock/internal/registry"
	"github.com/fairlock/fairlock/owner"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var errClosed = fairlock.ErrClosed

// errRequeue is run's internal signal that a queued call lost its key
// (deleted by someone else, or its lease was abandoned) and must queue
// again.
var errRequeue = errors.New("etcdlock: queue again")

// kind is what a call does once it is its turn.
type kind uint8

const (
	kindLock kind = iota // queue and hold
	kindTry              // hold only if nothing is held or queued
	kindWait             // queue, and leave the queue when it is its turn
)

// Lock locks key for the owner of ctx (owner.Of) and returns the Guard
// that unlocks it. If the key is held or has queued calls, in this
// process or any other on the same prefix, Lock queues behind them and
// blocks until every call that queued before it has been granted and
// released, or has left the queue; it never overtakes. Its place in the
// queue is its key's creation revision in etcd.
//
// Lock returns an error (a *fairlock.LockError naming the key and owner)
// wrapping:
//   - the context's error if ctx is done before the lock is granted, even
//     when the key is free; the caller then holds nothing and its key has
//     been deleted (on a detached context: see Guard.Unlock);
//   - fairlock.ErrReentrant at once if the owner already holds key through
//     this Locker (checked locally, without a round trip; another Locker or
//     process is another owner);
//   - fairlock.ErrClosed if the Locker is closed, or closes while Lock
//     waits;
//   - etcd's error if the enqueueing transaction fails (etcd unreachable
//     until ctx's end, for instance).
//
// If the call's key is lost while it waits (its lease expired or was
// revoked, or someone deleted it), Lock queues again, at the back, under
// the Locker's next lease. An uncontended Lock is one round trip (a
// transaction that writes the call's key and reads the keys ahead of it);
// a waiter is granted without another round trip when it knew every key
// ahead (at most eight), else with one read when the nearest are gone.
func (l *Locker) Lock(ctx context.Context, key string) (*Guard, error) {
	return l.acquire(ctx, "Lock", kindLock, key)
}

// TryLock locks key if nothing holds it and nothing is queued on it, in
// any process: it never overtakes a queued call, even one whose holder
// has just released. Otherwise it returns an error wrapping
// fairlock.ErrWouldBlock, and it wrote nothing. It also fails like Lock
// on a done ctx, a reentrant owner, a closed Locker, or an etcd error. It
// is one round trip: a transaction that writes the call's key only if the
// key's range is empty. While the Locker's watch is restarting (after an
// outage or a compaction) a TryLock whose write succeeded waits, as Lock
// does, until the watch is live again, ctx ends or the Locker closes: a
// grant is handed out only once the loss of its key can be seen.
func (l *Locker) TryLock(ctx context.Context, key string) (*Guard, error) {
	return l.acquire(ctx, "TryLock", kindTry, key)
}

// Wait waits for its turn on key and returns holding nothing: it queues
// like a Lock (calls that come later queue behind it) and returns nil the
// instant every grant of the key that was held or queued before it has
// been released, deleting its own key then so that those behind it go on.
// A key that is free returns at once, with one round trip and nothing
// written. It fails like Lock: on a done ctx, if the owner holds key
// (ErrReentrant), on a closed Locker, on an etcd error. Wait is not
// reported to the Observer: it acquires nothing.
func (l *Locker) Wait(ctx context.Context, key string) error {
	_, err := l.acquire(ctx, "Wait", kindWait, key)
	return err
}

// acquire runs one Lock, TryLock or Wait call, or one key of LockMany.
func (l *Locker) acquire(ctx context.Context, op string, k kind, key string) (*Guard, error) {
	if ctx == nil {
		panic("etcdlock: " + op + " with a nil context")
	}
	id := owner.Of(ctx)
	mode := registry.Exclusive
	if k == kindWait {
		mode = registry.Wait
	}
	g, err := l.begin(ctx, key, id, mode)
	if err == nil {
		err = l.run(ctx, g, k)
	}
	if g != nil {
		l.finish(g, k, err)
	}
	if l.obs != nil && k != kindWait {
		var waited time.Duration
		if g != nil && k == kindLock {
			waited = time.Since(g.since)
		}
		l.obsMu.RLock()
		if !l.obsGone {
			l.obs.Acquire(resultOf(err), waited)
		}
		l.obsMu.RUnlock()
	}
	if err != nil {
		return nil, lockError(op, key, id, err)
	}
	if k == kindWait {
		return nil, nil
	}
	return g, nil
}

// begin checks a call against the Locker's local state and records it:
// a done ctx, a closed Locker and a reentrant owner fail at once.
func (l *Locker) begin(ctx context.Context, key string, id owner.ID, mode string) (*Guard, error) {
	if ctx.Err() != nil {
		return nil, ctxerr.Of(ctx)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.isClosed {
		return nil, errClosed
	}
	for _, o := range l.keys[key] {
		if o.owner == id && o.state == held {
			l.reentry++
			return nil, fairlock.ErrReentrant
		}
	}
	g := &Guard{
		l: l, key: key, owner: id, mode: mode, since: time.Now(),
		lost: make(chan struct{}), sem: make(chan struct{}, 1), wake: make(chan struct{}, 1),
	}
	l.keys[key] = append(l.keys[key], g)
	l.calls++
	return g, nil
}

// finish ends a call: a failed call, or a Wait, forgets its Guard; a Wait
// that queued and got its turn deletes its key.
func (l *Locker) finish(g *Guard, k kind, err error) {
	l.mu.Lock()
	l.calls--
	remove := false
	if err == nil && k == kindWait && g.state == held {
		l.unwatchLocked(g)
		delete(l.live, g)
		g.state = released
		l.held--
		remove = true
	}
	if err != nil || k == kindWait {
		l.forgetLocked(g)
	}
	l.signalIdle()
	l.mu.Unlock()
	if remove {
		l.remove(g.name, g.rev)
	}
}

// forgetLocked removes g from the local view of its key. l.mu is held.
func (l *Locker) forgetLocked(g *Guard) {
	gs := l.keys[g.key]
	if i := slices.Index(gs, g); i >= 0 {
		gs = slices.Delete(gs, i, i+1)
	}
	if len(gs) == 0 {
		delete(l.keys, g.key)
	} else {
		l.keys[g.key] = gs
	}
}

// run queues the call in etcd and waits for its turn: it returns nil once
// g holds the key (for TryLock and a queued Wait too; a Wait on a free
// key returns nil with nothing written), or the error the call fails
// with, having deleted the call's key.
func (l *Locker) run(ctx context.Context, g *Guard, k kind) error {
	r := l.rangeOf(g.key)
	free := clientv3.Compare(clientv3.CreateRevision(r), "=", 0).WithPrefix()
	list := clientv3.OpGet(r, clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(aheadLimit+1))
	for {
		ls, err := l.leaseFor(ctx)
		if err != nil {
			return err
		}
		name := l.newName(g.key, ls.id)
		put := clientv3.OpPut(name, l.value+g.owner.String(), clientv3.WithLease(ls.id))
		var txn func(context.Context) (*clientv3.TxnResponse, error)
		var wrote func(*clientv3.TxnResponse) bool
		switch k {
		case kindTry:
			txn = func(c context.Context) (*clientv3.TxnResponse, error) {
				return l.client.Txn(c).If(free).Then(put).Commit()
			}
			wrote = func(r *clientv3.TxnResponse) bool { return r.Succeeded }
		case kindWait:
			txn = func(c context.Context) (*clientv3.TxnResponse, error) {
				return l.client.Txn(c).If(free).Else(put, list).Commit()
			}
			wrote = func(r *clientv3.TxnResponse) bool { return !r.Succeeded }
		default:
			txn = func(c context.Context) (*clientv3.TxnResponse, error) {
				return l.client.Txn(c).Then(put, list).Commit()
			}
			wrote = func(*clientv3.TxnResponse) bool { return true }
		}
		resp, err := l.commit(ctx, name, txn, wrote)
		if err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				l.leaseFailed(ls)
				continue
			}
			return l.callError(ctx, err)
		}
		if k == kindTry && !resp.Succeeded {
			return fairlock.ErrWouldBlock
		}
		if k == kindWait && resp.Succeeded {
			return nil
		}
		rev := resp.Header.Revision
		var ahead []string
		complete := true
		if k != kindTry {
			rr := resp.Responses[len(resp.Responses)-1].GetResponseRange()
			for _, kv := range rr.Kvs {
				if kv.CreateRevision < rev {
					ahead = append(ahead, string(kv.Key))
				}
			}
			complete = !rr.More
		}
		l.mu.Lock()
		g.name, g.rev, g.lease = name, rev, ls
		g.gone = l.lease != ls // abandoned while the key was written
		l.live[g] = struct{}{}
		l.mu.Unlock()
		err = l.wait(ctx, g, ahead, complete, rev)
		if err != errRequeue {
			return err
		}
	}
}

// wait waits until every key ahead of g's, as read at revision at, is
// gone. It returns nil with g held, errRequeue if g's key was lost, or
// the call's error once g's key is deleted.
func (l *Locker) wait(ctx context.Context, g *Guard, ahead []string, complete bool, at int64) error {
	retry := newBackoff()
	for {
		l.mu.Lock()
		ok, ready := true, (<-chan struct{})(nil)
		if !g.gone {
			ok, ready = l.subscribeLocked(g, ahead, complete, at)
		}
		l.mu.Unlock()
		for ok {
			l.mu.Lock()
			switch {
			case g.gone:
				l.mu.Unlock()
				return l.requeue(g)
			case g.ahead == 0 && g.complete:
				// Every key ahead is gone: g's key is the oldest.
				g.state = held
				g.granted = time.Now()
				l.held++
				l.mu.Unlock()
				return nil
			case g.ahead == 0:
				ok = false // the nearest are gone: read the range again
			}
			l.mu.Unlock()
			if !ok {
				break
			}
			select {
			case <-g.wake:
			case <-ctx.Done():
				return l.cancel(g, ctxerr.Of(ctx))
			case <-l.closing:
				return l.cancel(g, errClosed)
			}
		}
		if ready != nil {
			select {
			case <-ready:
			case <-ctx.Done():
				return l.cancel(g, ctxerr.Of(ctx))
			case <-l.closing:
				return l.cancel(g, errClosed)
			}
		}
		if err := l.recheck(ctx, g, retry, &ahead, &complete, &at); err != nil {
			return err
		}
	}
}

// recheck reads g's queue again (check) into ahead, complete and at,
// retrying with backoff while etcd fails. The reads and the backoff end
// when ctx ends or the Locker closes, whichever is first: a Close must not
// wait for a read that an unreachable etcd never answers. It returns nil,
// or the call's result: requeued, or cancelled with ctx's error, ErrClosed
// or the client's.
func (l *Locker) recheck(ctx context.Context, g *Guard, retry *backoff, ahead *[]string, complete *bool, at *int64) error {
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	defer context.AfterFunc(l.shut, stop)()
	for {
		var err error
		*ahead, *complete, *at, err = l.check(rctx, g)
		if err == nil {
			retry.reset()
			return nil
		}
		switch {
		case err == errRequeue:
			return l.requeue(g)
		case ctx.Err() != nil:
			return l.cancel(g, ctxerr.Of(ctx))
		case l.shut.Err() != nil:
			return l.cancel(g, errClosed)
		case l.client.Ctx().Err() != nil:
			return l.cancel(g, err)
		}
		l.logger.Warn("etcdlock: reading a queue failed; retrying", "locker", l.name, "key", g.name, "error", err)
		if !retry.wait(rctx) {
			if ctx.Err() != nil {
				return l.cancel(g, ctxerr.Of(ctx))
			}
			return l.cancel(g, errClosed)
		}
	}
}

// check reads g's queue: whether its key still exists, and the keys
// ahead of it (the nearest aheadLimit, and whether that is all of them),
// at the revision it returns. It returns errRequeue if the key is gone.
func (l *Locker) check(ctx context.Context, g *Guard) (ahead []string, complete bool, at int64, err error) {
	resp, err := l.client.Txn(ctx).If(g.IsOwner()).Then(clientv3.OpGet(l.rangeOf(g.key),
		clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(g.rev-1),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(aheadLimit))).Commit()
	if err != nil {
		return nil, false, 0, err
	}
	if !resp.Succeeded {
		return nil, false, 0, errRequeue
	}
	rr := resp.Responses[0].GetResponseRange()
	for _, kv := range rr.Kvs {
		ahead = append(ahead, string(kv.Key))
	}
	return ahead, !rr.More, resp.Header.Revision, nil
}

// requeue retires g's lost key before the call queues again; the janitor
// deletes it if it is still there (its lease abandoned but alive).
func (l *Locker) requeue(g *Guard) error {
	l.mu.Lock()
	l.unwatchLocked(g)
	delete(l.live, g)
	name, rev := g.name, g.rev
	g.gone = false
	l.mu.Unlock()
	l.janitorAdd(name, rev)
	return errRequeue
}

// cancel takes g out of the queue: it deletes g's key on a detached
// context and returns err. If g's turn came meanwhile, the deletion hands
// the key to the next call: the grant is never lost.
func (l *Locker) cancel(g *Guard, err error) error {
	l.mu.Lock()
	l.unwatchLocked(g)
	delete(l.live, g)
	g.state = released
	l.mu.Unlock()
	// The key goes before the call returns (the prefix is empty once every
	// call has returned and every grant is released), on a context of its
	// own bounded by cleanupTimeout: with etcd down a cancelled call
	// returns after that bound, not at its ctx's end.
	l.remove(g.name, g.rev)
	return err
}

// MultiGuard holds the grants of one LockMany call.
type MultiGuard struct {
	guards []*Guard // in the order taken: sorted by key
}

// LockMany locks every key in keys for the owner of ctx, all or nothing:
// fairlock.LockMany across processes. Duplicate keys are locked once. Keys
// are locked one at a time in ascending order, each with Lock, so that two
// LockMany calls (in any processes) can never deadlock each other: the
// resource-ordering rule (Havender, 1968). Each key is waited for in FIFO
// order as with Lock.
//
// If any Lock fails, every key already taken is unlocked, in reverse
// order, on a detached context, before LockMany returns the error: a
// *fairlock.LockError with Op "LockMany" naming the key that failed,
// wrapping what Lock returned. With no keys LockMany takes nothing, and
// fails only on a done ctx or a closed Locker. It makes one round trip
// per key when uncontended.
func LockMany(ctx context.Context, l *Locker, keys ...string) (*MultiGuard, error) {
	if ctx == nil {
		panic("etcdlock: LockMany with a nil context")
	}
	if len(keys) == 0 {
		var err error
		switch {
		case ctx.Err() != nil:
			err = ctxerr.Of(ctx)
		default:
			l.mu.Lock()
			if l.isClosed {
				err = errClosed
			}
			l.mu.Unlock()
		}
		if err != nil {
			return nil, &fairlock.LockError{Op: "LockMany", Owner: owner.Of(ctx), Err: err}
		}
		return &MultiGuard{}, nil
	}
	sorted := slices.Clone(keys)
	slices.SortFunc(sorted, cmp.Compare[string])
	sorted = slices.Compact(sorted)
	m := &MultiGuard{guards: make([]*Guard, 0, len(sorted))}
	for _, k := range sorted {
		g, err := l.acquire(ctx, "LockMany", kindLock, k)
		if err != nil {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			_ = m.Unlock(uctx)
			cancel()
			return nil, err
		}
		m.guards = append(m.guards, g)
	}
	return m, nil
}

// Unlock unlocks every key, in the reverse of the order LockMany took
// them, each with Guard.Unlock and ctx, and returns their errors joined
// (errors.Join): ErrLost for a grant that was lost. Like Guard.Unlock it
// is idempotent. A nil MultiGuard holds nothing.
func (m *MultiGuard) Unlock(ctx context.Context) error {
	if m == nil {
		return nil
	}
	var errs []error
	for i := len(m.guards) - 1; i >= 0; i-- {
		if err := m.guards[i].Unlock(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Guards returns the grants in the order they were taken (sorted by key),
// for their tokens, Lost channels and IsOwner comparisons; a write that
// depends on several keys can require all of them in one transaction.
// The slice is a copy.
func (m *MultiGuard) Guards() []*Guard {
	if m == nil {
		return nil
	}
	return slices.Clone(m.guards)
}
