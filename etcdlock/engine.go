package etcdlock

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/fairlock"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The engine: etcd's protocol under the kit (package backend). A call's
// entry is its own etcd key under the prefix (keys.go), attached to the
// Locker's lease (lease.go: the session), and its place in the queue is
// the key's creation revision; a waiter is granted when the watch of the
// prefix (hub.go) has delivered the deletion of every key ahead of it
// that keeps it waiting. This file holds the engine's state and the round
// trips on one call's key: the enqueueing transaction, the re-read of a
// call's queue, the deletion.

// engine is a Locker's etcd protocol.
type engine struct {
	k      *backend.Core
	client *clientv3.Client
	prefix string // as given to New
	root   string // rootOf(prefix): every etcd key of the Locker starts with it
	size   int64  // a Semaphore's units per key; 0 for a Locker
	value  string // valuePrefix: the start of every key's value (list.go)
	seq    atomic.Uint64
	reads  waitReads    // key → its Waits' shared read in flight (reads.go); guarded by the Core's mutex
	leases *leaseKeeper // the lease: its grant, renewal and replacement (lease.go)
	hub    hub          // the watch and its dispatch (hub.go)
}

// tryRounds bounds the ranges a Try form judges
// before it fails with ErrWouldBlock: each round that finds room is
// refused only if another call joined the key meanwhile.
const tryRounds = 8

// Enqueue writes c's key under the current lease in one transaction that
// also reads the keys ahead of it (limitOf: the nearest aheadLimit for an
// exclusive call, the nearest waitAheadLimit for a Wait, every one for
// shared calls and units), and leaves them in c's waiter state for
// WatchLocked. A Try form writes only if the key's range is empty, or
// if no call joined the range since it judged that the call would be
// granted there (up to tryRounds ranges); a Wait writes
// only if the range is not empty. A write that finds the lease gone ends
// its session and tries again under the next lease.
func (e *engine) Enqueue(ctx context.Context, c *backend.Call) (backend.Enqueued, error) {
	want := e.claimOf(c)
	r := rangeOf(e.root, c.Key())
	free := clientv3.Compare(clientv3.CreateRevision(r), "=", 0).WithPrefix()
	listOpts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend)}
	whole := clientv3.OpGet(r, listOpts...) // the range's keys, newest first
	list := whole
	if n := limitOf(want); n > 0 {
		list = clientv3.OpGet(r, append(listOpts, clientv3.WithLimit(n+1))...) // and the call's own key
	}
	tryList := list // what a Try form reads of a range it is refused
	var seen int64  // a Try form: the revision of the range it judged
	rounds := 0     // and how many ranges it has judged
	bound := attemptBound(e.k.TTL())
	for {
		s, err := e.leases.Current(ctx)
		if err != nil {
			return backend.Enqueued{}, backend.Unwritten(err)
		}
		lease := leaseID(s)
		name := newName(e.root, c.Key(), lease, e.seq.Add(1), want)
		c.Name(name)
		put := clientv3.OpPut(name, valueOf(e.value, c.Owner().Name(), c.Label(), time.Now()), clientv3.WithLease(lease))
		build := func(tctx context.Context) clientv3.Txn {
			txn := e.client.Txn(tctx)
			switch {
			case c.Try():
				// Written only if no call joined the range after the
				// revision it was judged at (seen; 0: only if it is
				// empty); else the range comes back to be judged again.
				unchanged := clientv3.Compare(clientv3.CreateRevision(r), "<", seen+1).WithPrefix()
				return txn.If(unchanged).Then(put).Else(tryList)
			case want.turn:
				return txn.If(free).Else(put, list)
			}
			return txn.Then(put, list)
		}
		wrote := true
		// One bounded try: a try that runs out of its bound (a member that
		// stopped answering) has an unknown outcome, so its key goes to
		// the janitor and the call queues again under a fresh name, on
		// the connection the client's balancer picks next.
		actx, cancel := context.WithTimeout(ctx, bound)
		resp, err := build(actx).Commit()
		hung := err != nil && actx.Err() != nil && ctx.Err() == nil
		cancel()
		if hung {
			e.k.Cleanup(backend.Entry{Key: c.Key(), ID: name}, true)
			bound = min(2*bound, backend.CleanupTimeout)
			continue
		}
		if err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				e.leases.Failed(s)
				continue
			}
			if refused(err) {
				return backend.Enqueued{}, backend.Unwritten(err)
			}
			return backend.Enqueued{}, err
		}
		switch {
		case want.turn:
			wrote = !resp.Succeeded
		case c.Try():
			wrote = resp.Succeeded
		}
		if !wrote && want.turn {
			return backend.Enqueued{Free: true}, nil
		}
		if !wrote {
			// Judge the range: would c be granted now, behind every
			// call on it? Oldest first (the read is newest first): the
			// Waits at the head have had their turn and are
			// transparent; a Wait behind another call waits, and a Try
			// form never goes beside it; the others weigh as they
			// would on c once it is queued (weigh).
			rr := resp.Responses[0].GetResponseRange()
			if rr.More {
				// An exclusive call's read, the newest keys only: busy,
				// unless they are all Waits', whose older keys may be
				// too. That is judged from the whole range, read next.
				if !onlyWaits(rr.Kvs) {
					return backend.Enqueued{}, fairlock.ErrWouldBlock
				}
				tryList = whole
				if rounds++; rounds > tryRounds {
					return backend.Enqueued{}, fairlock.ErrWouldBlock
				}
				continue
			}
			var weight total
			var oldest int64 // the size of the oldest Semaphore call
			blocked, lead := false, true
			for i := len(rr.Kvs) - 1; i >= 0; i-- {
				name := string(rr.Kvs[i].Key)
				switch a := claimOf(name); {
				case a.turn && lead:
				case a.turn:
					blocked = true
				default:
					lead = false
					weight.add(want.weigh(name))
					if a.size > 0 && oldest == 0 {
						oldest = a.size
					}
				}
			}
			if other := want.otherSize(oldest); other != 0 {
				return backend.Enqueued{}, backend.SizeError(want.size, other)
			}
			// A key that calls keep joining between the two
			// transactions is busy: after tryRounds judged ranges the
			// call fails as blocked rather than spin until ctx ends.
			if rounds++; blocked || !weight.atMost(want.room()) || rounds > tryRounds {
				return backend.Enqueued{}, fairlock.ErrWouldBlock
			}
			seen = resp.Header.Revision
			continue
		}
		rev := resp.Header.Revision
		var ahead []string
		complete := true
		var oldest int64 // the size of the oldest Semaphore call ahead
		if !c.Try() {
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
		if other := want.otherSize(oldest); other != 0 {
			// A Semaphore of another size keeps the key: take the key
			// back out before failing.
			if err := e.deleteKey(ctx, name, rev); err != nil {
				e.k.Cleanup(backend.Entry{Key: c.Key(), ID: name, Token: uint64(rev)}, false)
			}
			return backend.Enqueued{}, backend.SizeError(want.size, other)
		}
		mu := e.k.Mu()
		mu.Lock()
		c.SetData(&waiter{claim: want, key: c.Key(), rev: rev, ahead: ahead, complete: complete, at: rev})
		mu.Unlock()
		return backend.Enqueued{Token: uint64(rev), Session: s}, nil
	}
}

// limitOf is how many of the keys ahead a call of claim c reads when it
// queues: the nearest aheadLimit for an exclusive call, which waits for
// all of them anyway; the nearest waitAheadLimit for a Wait, which reads
// the rest only if none of those keeps it waiting and no Wait of this
// Locker among them vouches for the rest (hub.inheritLocked; Refresh,
// reads.go); every one (0, no limit) for a shared call or units, whose
// turn depends on what every call ahead asks for.
func limitOf(c claim) int64 {
	switch {
	case c == (claim{}):
		return aheadLimit
	case c.turn:
		return waitAheadLimit
	}
	return 0
}

// WatchLocked subscribes c to the deletions of the keys ahead of it that
// Enqueue or Refresh read, and grants it at once if none keeps it
// waiting. It returns the hub's ready channel if the hub cannot judge
// deletions since that read (its watch is restarting).
func (e *engine) WatchLocked(c *backend.Call) <-chan struct{} {
	w := waiterOf(c)
	ok, news := e.hub.subscribeLocked(c, w)
	if !ok {
		return news
	}
	e.judgeLocked(c, w)
	return nil
}

// judgeLocked grants c if the keys ahead of it that are left leave room
// for it and it knew them all, or asks for a re-read if they leave room
// and there were more. The Core's mutex is held.
func (e *engine) judgeLocked(c *backend.Call, w *waiter) {
	if !w.ready() {
		return
	}
	if w.complete {
		w.turnCame = true
		if !w.claim.turn || !e.k.EndTurnLocked(c) {
			e.k.GrantLocked(c)
		}
	} else {
		e.k.RefreshLocked(c)
	}
}

// Refresh reads c's queue again (whether its key still exists, and the
// keys ahead of it) and subscribes from there, as WatchLocked. A Wait
// reads all of it, in a read shared with the Waits of this Locker that
// read the same key's queue at the same time (reads.go); another call,
// as many keys as it reads when it queues (limitOf), reading on past
// keys of Waits, which do not keep it waiting.
func (e *engine) Refresh(ctx context.Context, c *backend.Call) (<-chan struct{}, error) {
	mu := e.k.Mu()
	mu.Lock()
	name, rev, want := c.ID(), int64(c.Token()), waiterOf(c).claim
	mu.Unlock()
	// The read ends when ctx ends or the Locker closes, whichever is
	// first: a Close must not wait for a read that an unreachable etcd
	// never answers.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	defer context.AfterFunc(e.k.Closing(), stop)()
	if want.turn {
		if rd := e.reads.join(ctx, e.k.Mu(), c.Key(), rev, e.readQueue(c.Key())); rd != nil {
			if rd.created[name] != rev { // read at or after its creation: gone
				return nil, backend.ErrGone
			}
			// The Waits ahead are left out: none keeps a Wait waiting.
			return e.resubscribe(c, rd.aheadOf(rev), true, rd.rev)
		}
	}
	limit := limitOf(want)
	if want.turn {
		limit = 0
	}
	// An exclusive call reads the nearest limit keys ahead of it. If none
	// of them keeps it waiting (they are all Waits', which weigh nothing
	// for it) and there are more, it reads on past them, four times as
	// many each time, until it finds one that does or reaches the front:
	// judged on those alone it would be ready but not complete, and read
	// the same keys again for as long as the calls further ahead hold.
	// The subscription is judged from the first read's revision: a key
	// that a later read no longer finds was deleted after it.
	var ahead []string
	var at int64
	complete := false
	for below := rev - 1; ; {
		var resp *clientv3.TxnResponse
		err := e.attempts(ctx, func(actx context.Context) (err error) {
			resp, err = e.client.Txn(actx).If(isOwner(name, rev)).Then(clientv3.OpGet(rangeOf(e.root, c.Key()),
				clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(below),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(limit))).Commit()
			return err
		})
		switch {
		case err != nil && e.client.Ctx().Err() != nil:
			return nil, backend.Final(err)
		case err != nil:
			return nil, err
		case !resp.Succeeded:
			return nil, backend.ErrGone
		}
		if at == 0 {
			at = resp.Header.Revision
		}
		rr := resp.Responses[0].GetResponseRange()
		waiting := false // a key read keeps c waiting
		for _, kv := range rr.Kvs {
			ahead = append(ahead, string(kv.Key))
			waiting = waiting || want.weigh(string(kv.Key)) > 0
		}
		complete = !rr.More
		if complete || waiting || limit == 0 || len(rr.Kvs) == 0 {
			break
		}
		below = rr.Kvs[len(rr.Kvs)-1].CreateRevision - 1
		limit *= 4
	}
	return e.resubscribe(c, ahead, complete, at)
}

// resubscribe subscribes c from a read of its queue at revision at: the
// keys ahead of it, newest first (all of them if complete), and grants it
// if none keeps it waiting, as WatchLocked.
func (e *engine) resubscribe(c *backend.Call, ahead []string, complete bool, at int64) (<-chan struct{}, error) {
	mu := e.k.Mu()
	mu.Lock()
	defer mu.Unlock()
	if !c.Queued() {
		// Granted, lost, or a Wait ended (EndTurnLocked) while it read:
		// its call sees that in wait, and subscribing now would watch
		// again for a call that has no turn to wait for.
		return nil, nil
	}
	w := waiterOf(c)
	w.ahead, w.complete, w.at = ahead, complete, at
	ok, news := e.hub.subscribeLocked(c, w)
	if !ok {
		return news, nil
	}
	e.judgeLocked(c, w)
	return nil, nil
}

// UnwatchLocked drops c's subscriptions.
func (e *engine) UnwatchLocked(c *backend.Call) {
	if w, ok := c.Data().(*waiter); ok {
		e.hub.unwatchLocked(c, w)
	}
}

// Release deletes c's key in one transaction that compares the key's
// creation revision with the grant's, so it deletes only this grant's
// key, never a later grant's, even if retried late (the failure of
// etcd-io/etcd#22082).
//
// Each try is bounded and a try that runs out of its bound is retried
// (attempts); a retry that finds the key gone while the grant's lease is
// alive reports it removed: the try whose reply never came deleted it.
func (e *engine) Release(ctx context.Context, c *backend.Call) (bool, error) {
	name, rev := c.ID(), int64(c.Token())
	var removed, retried bool
	err := e.attempts(ctx, func(actx context.Context) error {
		resp, err := e.client.Txn(actx).If(isOwner(name, rev)).Then(clientv3.OpDelete(name)).Commit()
		if err != nil {
			retried = true
			return err
		}
		removed = resp.Succeeded
		return nil
	})
	if err != nil {
		return false, err
	}
	if !removed && retried {
		mu := e.k.Mu()
		mu.Lock()
		s := c.Session()
		removed = s != nil && !s.Ended()
		mu.Unlock()
	}
	return removed, nil
}

// Remove deletes an entry's key if its creation revision is the entry's
// token (any, for token 0), bounded by ctx and by CleanupTimeout.
func (e *engine) Remove(ctx context.Context, en backend.Entry) error {
	return e.deleteKey(ctx, en.ID, int64(en.Token))
}

// RemoveAll deletes the keys of es in one transaction per 64 (the
// janitor's batch, the finished Waits of a release among them): by name
// alone, since a name is never used twice (keys.go: the lease and the
// Locker's call number), so a name that is gone needs no comparison.
func (e *engine) RemoveAll(ctx context.Context, _ string, es []backend.Entry) error {
	for len(es) > 0 {
		n := min(len(es), 64)
		ops := make([]clientv3.Op, n)
		for i, en := range es[:n] {
			ops[i] = clientv3.OpDelete(en.ID)
		}
		err := e.attempts(ctx, func(actx context.Context) error {
			_, err := e.client.Txn(actx).Then(ops...).Commit()
			return err
		})
		if err != nil {
			return err
		}
		es = es[n:]
	}
	return nil
}

// deleteKey deletes name if its creation revision is rev (any, for rev
// 0), bounded by ctx and by CleanupTimeout. A key that is already gone is
// not an error.
func (e *engine) deleteKey(ctx context.Context, name string, rev int64) error {
	dctx, cancel := context.WithTimeout(ctx, backend.CleanupTimeout)
	defer cancel()
	cmp := clientv3.Compare(clientv3.CreateRevision(name), "=", rev)
	if rev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(name), ">", 0)
	}
	return e.attempts(dctx, func(actx context.Context) error {
		_, err := e.client.Txn(actx).If(cmp).Then(clientv3.OpDelete(name)).Commit()
		return err
	})
}

// Shutdown revokes the current lease and those given up and not revoked
// yet (Keeper.Shutdown), which deletes every key still attached to them,
// and returns the entries of the others for the kit's last removals.
func (e *engine) Shutdown(ctx context.Context, left []backend.Entry) ([]backend.Entry, error) {
	done, err := e.leases.Shutdown(ctx)
	revoked := make(map[string]bool, len(done))
	for _, s := range done {
		revoked[s.ID()] = true
	}
	var rest []backend.Entry
	for _, en := range left {
		if !revoked[leaseOf(en.ID)] {
			rest = append(rest, en)
		}
	}
	return rest, err
}

// refused reports whether err says that a request was not applied: the
// lease it names is gone, the request is larger than the server takes
// (or the client sends: gRPC's ResourceExhausted, raised before a byte
// goes out), or the server turned it away as too many. Nothing then
// needs deleting; any other error leaves the outcome unknown.
func refused(err error) bool {
	return errors.Is(err, rpctypes.ErrLeaseNotFound) || errors.Is(err, rpctypes.ErrRequestTooLarge) ||
		status.Code(err) == codes.ResourceExhausted
}

// attemptBound is how long one try of a request (an enqueueing
// transaction, a release, a read, a deletion) may take at first before it
// is given up and retried: a request routed to a member that stopped
// answering (a blackholed path: nothing fails, nothing arrives) would
// otherwise wait for the caller's context. It is the renewals' bound
// (renewBound), doubled after each try that ran out of it, up to
// CleanupTimeout, so that a slow quorum that answers is not given up on
// again and again.
func attemptBound(ttl time.Duration) time.Duration { return renewBound(ttl) }

// attempts runs try with a context bounded by attemptBound, and runs it
// again, at once and with twice the bound, while a try ran out of its
// bound and ctx has not ended: the client's round-robin balancer sends the
// next try on its next connection. It returns the first try's result that
// did not run out of its bound, or the last error once ctx ends. try must
// be safe to repeat.
func (e *engine) attempts(ctx context.Context, try func(context.Context) error) error {
	bound := attemptBound(e.k.TTL())
	for {
		actx, cancel := context.WithTimeout(ctx, bound)
		err := try(actx)
		hung := err != nil && actx.Err() != nil && ctx.Err() == nil
		cancel()
		if !hung {
			return err
		}
		bound = min(2*bound, backend.CleanupTimeout)
	}
}

// claimOf is what c asks for, as its key's name records it (keys.go).
func (e *engine) claimOf(c *backend.Call) claim {
	switch c.Mode() {
	case backend.Shared:
		return claim{shared: true}
	case backend.Units:
		return claim{w: c.Weight(), size: e.size}
	case backend.Turn:
		return claim{turn: true}
	}
	return claim{}
}

var _ backend.Watcher = (*engine)(nil)
var _ backend.Lister = (*engine)(nil)
var _ backend.BatchRemover = (*engine)(nil)

// Renew sends the renewal of each session's lease: one KeepAliveOnce, or,
// in a round after one that ran out of its bound, two at once (each on
// the connection the client's balancer picks next); the first answer
// that settles it wins.
func (e *engine) Renew(ctx context.Context, ss []*backend.Session, attempt int) []backend.Renewal {
	out := make([]backend.Renewal, 0, len(ss))
	for _, s := range ss {
		n := 1
		if attempt > 0 {
			n = 2
		}
		sent := time.Now()
		resp, err := e.leases.renew(ctx, leaseID(s), n)
		r := backend.Renewal{Session: s, Sent: sent}
		switch {
		case err == nil && resp.TTL > 0:
			r.TTL = time.Duration(resp.TTL) * time.Second
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && resp.TTL <= 0):
			r.Expired = true
		default:
			r.Err = err
		}
		out = append(out, r)
	}
	return out
}

// readQueue returns a read of key's whole queue, its keys only, newest
// first, and the revision it was read at, for the Waits' shared reads
// (reads.go).
func (e *engine) readQueue(key string) func(context.Context) ([]*mvccpb.KeyValue, int64, error) {
	return func(ctx context.Context) (kvs []*mvccpb.KeyValue, rev int64, err error) {
		err = e.attempts(ctx, func(actx context.Context) error {
			resp, err := e.client.Get(actx, rangeOf(e.root, key), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
				clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend))
			if err == nil {
				kvs, rev = resp.Kvs, resp.Header.Revision
			}
			return err
		})
		return kvs, rev, err
	}
}
