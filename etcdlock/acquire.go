package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/etcdlock/internal/ctxerr"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The calls that ask for a key (Lock, TryLock, RLock, TryRLock, Wait,
// and the Semaphore's Acquire and TryAcquire through acquire), from their
// start to their grant: enqueue the call's key (run), wait for its turn
// (wait), or leave the queue (cancel).

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

// Lock locks key exclusively for the owner of ctx (owner.Of) and returns
// its grant, a *Guard (see Guard for IsOwner). If the key is held or has queued calls, in this
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
// A call that fails returns a nil Lease (a nil interface).
func (l *Locker) Lock(ctx context.Context, key string) (keylock.Lease, error) {
	return asLease(l.acquire(ctx, "Lock", kindLock, claim{}, key))
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
func (l *Locker) TryLock(ctx context.Context, key string) (keylock.Lease, error) {
	return asLease(l.acquire(ctx, "TryLock", kindTry, claim{}, key))
}

// RLock locks key shared for the owner of ctx and returns its grant, a
// *Guard: any number of readers, in any processes, hold a key together.
// It is task-fair, like fairlock's RLock: a reader is granted when every
// call ahead of it in the key's queue is a reader, so a reader behind a
// queued Lock (or Wait) waits for it even while readers hold the key,
// and writers never starve. Readers queued together behind a writer are
// granted together when it releases.
//
// It fails like Lock, with ErrReentrant for an owner that holds the key
// in any mode through this Locker (an upgrade would deadlock). Its key's
// name marks it shared (see keys.go), which is how every process tells
// readers from writers; a reader reads every key ahead of it, not only
// the nearest eight, in the same one round trip, and is granted without
// another once the writers ahead are gone.
func (l *Locker) RLock(ctx context.Context, key string) (keylock.Lease, error) {
	return asLease(l.acquire(ctx, "RLock", kindLock, claim{shared: true}, key))
}

// TryRLock locks key shared if every call on it, held or queued, in any
// process, is a reader; otherwise it returns an error wrapping
// fairlock.ErrWouldBlock and has written nothing. It never overtakes: a
// queued writer makes it fail even while readers hold the key. On a free
// key it is one round trip; beside readers, two: a transaction that
// writes only if the key's range is empty returns the range, and a second
// writes only if no call has joined it since (retried with the new range
// if one has, up to eight ranges, then ErrWouldBlock: a key that calls
// keep joining is busy). Otherwise it fails like RLock.
func (l *Locker) TryRLock(ctx context.Context, key string) (keylock.Lease, error) {
	return asLease(l.acquire(ctx, "TryRLock", kindTry, claim{shared: true}, key))
}

// tryRounds bounds the ranges a shared TryRLock or TryAcquire judges
// before it fails with ErrWouldBlock: each round that finds room is
// refused only if another call joined the key meanwhile.
const tryRounds = 8

// asLease returns a call's result as a keylock.Lease: nil (a nil interface,
// never a typed nil inside one) with an error.
func asLease(g *Guard, err error) (keylock.Lease, error) {
	if err != nil {
		return nil, err
	}
	return g, nil
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
	_, err := l.acquire(ctx, "Wait", kindWait, claim{}, key)
	return err
}

// acquire runs one call of kind k asking for want: Lock, TryLock, RLock,
// TryRLock, Wait, Acquire or TryAcquire. It returns the Guard of a
// granted call; nil for a Wait.
func (l *Locker) acquire(ctx context.Context, op string, k kind, want claim, key string) (*Guard, error) {
	if ctx == nil {
		panic("etcdlock: " + op + " with a nil context")
	}
	id := owner.Of(ctx)
	mode := registry.Exclusive
	switch {
	case k == kindWait:
		mode = registry.Wait
	case want.size > 0:
		mode = registry.Units
	case want.shared:
		mode = registry.Shared
	}
	c, err := l.begin(ctx, key, id, mode, want)
	if err == nil {
		err = l.run(ctx, c, k)
	}
	if c != nil {
		l.finish(c, k, err)
	}
	if l.obs != nil && k != kindWait {
		var waited time.Duration
		if c != nil && k == kindLock {
			waited = time.Since(c.since)
		}
		l.report(err, waited)
	}
	if err != nil {
		return nil, lockError(op, key, id, err)
	}
	if k == kindWait {
		return nil, nil
	}
	return &Guard{l: l, c: c, sem: make(chan struct{}, 1)}, nil
}

// report tells the Observer, if there is one, how a call that asks for a
// key ended and how long it waited.
func (l *Locker) report(err error, waited time.Duration) {
	if l.obs == nil {
		return
	}
	l.obsMu.RLock()
	if !l.obsGone {
		l.obs.Acquire(resultOf(err), waited)
	}
	l.obsMu.RUnlock()
}

// begin checks a call against the Locker's local state and records it:
// a done ctx, a closed Locker and a reentrant owner fail at once.
func (l *Locker) begin(ctx context.Context, key string, id owner.ID, mode string, want claim) (*call, error) {
	if ctx.Err() != nil {
		return nil, ctxerr.Of(ctx)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closing.Err() != nil {
		return nil, errClosed
	}
	for _, o := range l.keys[key] {
		if o.owner == id && o.state == held {
			l.reentry++
			return nil, fairlock.ErrReentrant
		}
	}
	c := &call{
		key: key, owner: id, mode: mode, claim: want, since: time.Now(),
		lost: make(chan struct{}), wake: make(chan struct{}, 1),
	}
	l.keys[key] = append(l.keys[key], c)
	l.calls++
	return c, nil
}

// finish ends a call: a failed call, or a Wait, is forgotten; a Wait
// that queued and got its turn deletes its key.
func (l *Locker) finish(c *call, k kind, err error) {
	l.mu.Lock()
	l.calls--
	remove := false
	if err == nil && k == kindWait && c.state == held {
		l.hub.unwatchLocked(c)
		delete(l.written, c)
		c.state = released
		l.grants--
		remove = true
	}
	if err != nil || k == kindWait {
		l.forgetLocked(c)
	}
	l.signalIdle()
	l.mu.Unlock()
	if remove {
		l.janitor.remove(c.name, c.rev)
	}
}

// run queues the call in etcd and waits for its turn: it returns nil once
// c holds the key (for TryLock and a queued Wait too; a Wait on a free
// key returns nil with nothing written), or the error the call fails
// with, having deleted the call's key.
func (l *Locker) run(ctx context.Context, c *call, k kind) error {
	r := rangeOf(l.root, c.key)
	free := clientv3.Compare(clientv3.CreateRevision(r), "=", 0).WithPrefix()
	listOpts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend)}
	if n := limitOf(c.claim); n > 0 {
		listOpts = append(listOpts, clientv3.WithLimit(n+1)) // and the call's own key
	}
	list := clientv3.OpGet(r, listOpts...)
	exclusive := c.claim == claim{}
	var seen int64 // a shared TryRLock or TryAcquire: the revision of the range it judged
	rounds := 0    // and how many ranges it has judged
	for {
		ls, err := l.leases.current(ctx)
		if err != nil {
			return err
		}
		name := newName(l.root, c.key, ls.id, l.seq.Add(1), c.claim)
		put := clientv3.OpPut(name, l.value+c.owner.String(), clientv3.WithLease(ls.id))
		var txn func(context.Context) (*clientv3.TxnResponse, error)
		wrote := func(r *clientv3.TxnResponse) bool { return r.Succeeded }
		switch {
		case k == kindTry && exclusive:
			txn = func(tctx context.Context) (*clientv3.TxnResponse, error) {
				return l.client.Txn(tctx).If(free).Then(put).Commit()
			}
		case k == kindTry:
			// Written only if no call joined the range after the
			// revision it was judged at (seen; 0: only if it is empty);
			// else the range comes back to be judged again.
			unchanged := clientv3.Compare(clientv3.CreateRevision(r), "<", seen+1).WithPrefix()
			txn = func(tctx context.Context) (*clientv3.TxnResponse, error) {
				return l.client.Txn(tctx).If(unchanged).Then(put).Else(list).Commit()
			}
		case k == kindWait:
			txn = func(tctx context.Context) (*clientv3.TxnResponse, error) {
				return l.client.Txn(tctx).If(free).Else(put, list).Commit()
			}
			wrote = func(r *clientv3.TxnResponse) bool { return !r.Succeeded }
		default:
			txn = func(tctx context.Context) (*clientv3.TxnResponse, error) {
				return l.client.Txn(tctx).Then(put, list).Commit()
			}
			wrote = func(*clientv3.TxnResponse) bool { return true }
		}
		resp, err := l.commit(ctx, name, txn, wrote)
		if err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				l.leases.failed(ls)
				continue
			}
			return callError(ctx, err)
		}
		if k == kindTry && !resp.Succeeded {
			if exclusive {
				return fairlock.ErrWouldBlock
			}
			// Judge the range: room now for c beside every call on it?
			// (Newest first: oldest ends as the oldest Semaphore call's
			// size.)
			var weight total
			var oldest int64
			for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
				weight.add(c.claim.weigh(string(kv.Key)))
				if a := claimOf(string(kv.Key)); a.size > 0 {
					oldest = a.size
				}
			}
			if other := c.claim.otherSize(oldest); other != 0 {
				return l.sizeError(c.claim, other)
			}
			// A key that calls keep joining between the two
			// transactions is busy: after tryRounds judged ranges the
			// call fails as blocked rather than spin until ctx ends.
			if rounds++; !weight.atMost(c.claim.room()) || rounds > tryRounds {
				return fairlock.ErrWouldBlock
			}
			seen = resp.Header.Revision
			continue
		}
		if k == kindWait && resp.Succeeded {
			return nil
		}
		rev := resp.Header.Revision
		var ahead []string
		complete := true
		var oldest int64 // the size of the oldest Semaphore call ahead
		if k != kindTry {
			// Newest first: the last Semaphore call seen is the oldest.
			rr := resp.Responses[len(resp.Responses)-1].GetResponseRange()
			for _, kv := range rr.Kvs {
				if kv.CreateRevision < rev {
					ahead = append(ahead, string(kv.Key))
					if a := claimOf(string(kv.Key)); a.size > 0 {
						oldest = a.size
					}
				}
			}
			complete = !rr.More
		}
		other := c.claim.otherSize(oldest) // a Semaphore of another size keeps the key
		l.mu.Lock()
		c.name, c.rev, c.lease = name, rev, ls
		c.gone = l.leases.cur != ls // abandoned while the key was written
		l.written[c] = struct{}{}
		l.mu.Unlock()
		if other != 0 {
			return l.cancel(c, l.sizeError(c.claim, other))
		}
		err = l.wait(ctx, c, ahead, complete, rev)
		if err != errRequeue {
			return err
		}
	}
}

// limitOf is how many of the keys ahead a call of claim c reads: the
// nearest aheadLimit for an exclusive call, which waits for all of them
// anyway; every one (0, no limit) for a shared call or units, whose turn
// depends on what every call ahead asks for.
func limitOf(c claim) int64 {
	if c == (claim{}) {
		return aheadLimit
	}
	return 0
}

// sizeError is the error of a Semaphore call of claim c that found, on
// its key, a call of a Semaphore of size other on the same prefix: it
// fails rather than count units of two sizes together (which could grant
// more than either size).
func (l *Locker) sizeError(c claim, other int64) error {
	return fmt.Errorf("%w: this Semaphore has %d units per key, and a call on the key came from one of %d: every Semaphore on prefix %q must have the same size",
		fairlock.ErrInvalidWeight, c.size, other, l.prefix)
}

// The steps of a waiting call (wait).
type waitStep uint8

const (
	subscribe waitStep = iota // subscribe with a fresh read of the keys ahead, then judge
	judge                     // the hub has news: has the call's turn come?
	reread                    // read the call's queue again
)

// wait waits until the keys ahead of c's, as read at revision at, leave
// room for it. It returns nil with c held, errRequeue if c's key was lost,
// or the call's error once c's key is deleted. Each step either decides
// the call or names what to wait for before the next; the one select
// below waits for it, for ctx and for Close. A read of the queue that
// fails is retried with backoff while ctx lasts and the Locker is open.
func (l *Locker) wait(ctx context.Context, c *call, ahead []string, complete bool, at int64) error {
	retry := newBackoff()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	step := subscribe
	for {
		var news <-chan struct{}   // the hub's news for the next step
		var pause <-chan time.Time // the backoff before reading again
		if step != reread {
			l.mu.Lock()
			ok := true
			if step == subscribe && !c.gone {
				// !ok: the hub cannot judge deletions after at; read
				// again once news (its ready channel) says it is live.
				ok, news = l.hub.subscribeLocked(c, ahead, complete, at)
			}
			step = reread
			if ok {
				switch {
				case c.gone:
					l.mu.Unlock()
					return l.requeue(c)
				case c.ready() && c.complete:
					// The keys ahead that are left leave room for c: for
					// a Lock, none is left and c's key is the oldest.
					c.state = held
					c.granted = time.Now()
					l.grants++
					l.mu.Unlock()
					return nil
				case !c.ready():
					news, step = c.wake, judge
				}
				// Else the nearest keys ahead are gone and there were
				// more: read the range again, now.
			}
			l.mu.Unlock()
		}
		if news == nil {
			var err error
			ahead, complete, at, err = l.check(ctx, c)
			switch {
			case err == nil:
				retry.reset()
				step = subscribe
				continue
			case err == errRequeue:
				return l.requeue(c)
			case ctx.Err() != nil:
				return l.cancel(c, ctxerr.Of(ctx))
			case l.closing.Err() != nil:
				return l.cancel(c, errClosed)
			case l.client.Ctx().Err() != nil:
				return l.cancel(c, err)
			}
			l.logger.Warn("etcdlock: reading a queue failed; retrying", "locker", l.name, "key", logName(c.name), "error", err)
			timer.Reset(retry.next())
			pause = timer.C
		}
		select {
		case <-news:
		case <-pause:
		case <-ctx.Done():
			return l.cancel(c, ctxerr.Of(ctx))
		case <-l.closing.Done():
			return l.cancel(c, errClosed)
		}
	}
}

// check reads c's queue: whether its key still exists, and the keys
// ahead of it (the nearest aheadLimit for an exclusive call, and whether
// that is all of them), at the revision it returns. It returns errRequeue
// if the key is gone. The read ends when ctx ends or the Locker closes,
// whichever is first: a Close must not wait for a read that an
// unreachable etcd never answers.
func (l *Locker) check(ctx context.Context, c *call) (ahead []string, complete bool, at int64, err error) {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	defer context.AfterFunc(l.closing, stop)()
	resp, err := l.client.Txn(ctx).If(c.isOwner()).Then(clientv3.OpGet(rangeOf(l.root, c.key),
		clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(c.rev-1),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(limitOf(c.claim)))).Commit()
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

// requeue retires c's lost key before the call queues again; the janitor
// deletes it if it is still there (its lease abandoned but alive).
func (l *Locker) requeue(c *call) error {
	l.mu.Lock()
	l.hub.unwatchLocked(c)
	delete(l.written, c)
	name, rev := c.name, c.rev
	c.gone = false
	l.mu.Unlock()
	l.janitor.add(name, rev)
	return errRequeue
}

// cancel takes c out of the queue: it deletes c's key on a detached
// context and returns err. If c's turn came meanwhile, the deletion hands
// the key to the next call: the grant is never lost.
func (l *Locker) cancel(c *call, err error) error {
	l.mu.Lock()
	l.hub.unwatchLocked(c)
	delete(l.written, c)
	c.state = released
	l.mu.Unlock()
	// The key goes before the call returns (the prefix is empty once every
	// call has returned and every grant is released), on a context of its
	// own bounded by cleanupTimeout: with etcd down a cancelled call
	// returns after that bound, not at its ctx's end.
	l.janitor.remove(c.name, c.rev)
	return err
}
