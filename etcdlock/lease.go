package etcdlock

import (
	"context"
	"errors"
	"time"

	"github.com/fairlock/fairlock/internal/ctxerr"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Lease renewal. A Locker has one lease at a time; every key it writes is
// attached to it. The lease loop renews it with one KeepAliveOnce every
// third of its TTL (retrying every tenth of the TTL after a failure) and
// keeps the lease's deadline: the send time of the last successful renewal
// plus the TTL the server granted, less a tenth. The server cannot have
// expired the lease before that instant, as long as the two clocks run at
// rates within 10% of each other; the renewal's send time, not its reply's
// arrival, starts the count.
//
// The lease is abandoned when the server says it is gone (revoked or
// expired: ErrLeaseNotFound), when a write with it fails that way, or when
// its deadline passes without a renewal. Then every grant on it is lost
// (Lost closes), every queued call on it queues again under the next
// lease (its place is gone with its key), the old lease is revoked in the
// background (retried for up to twice the TTL: its keys go as soon as the
// server is reachable, else when it expires), and the loop grants a new
// lease for later calls: the Locker does not die with its session.

// lease is one etcd lease of a Locker.
type lease struct {
	id   clientv3.LeaseID
	ttl  time.Duration // as granted by the server
	sent time.Time     // when the Grant was sent: the first deadline's start
	kill chan struct{} // closed by leaseFailed: abandon the lease now
	dead bool          // guarded by Locker.mu: kill is closed
}

// grant asks the server for a new lease.
func (l *Locker) grant(ctx context.Context) (*lease, error) {
	sent := time.Now()
	resp, err := l.client.Grant(ctx, int64(l.ttl/time.Second))
	if err != nil {
		return nil, err
	}
	return &lease{id: resp.ID, ttl: time.Duration(resp.TTL) * time.Second, sent: sent, kill: make(chan struct{})}, nil
}

// leaseFor returns the lease a call should write with, waiting for a new
// one while the last is being replaced. It fails with the context's error
// or ErrClosed.
func (l *Locker) leaseFor(ctx context.Context) (*lease, error) {
	for {
		l.mu.Lock()
		if l.isClosed {
			l.mu.Unlock()
			return nil, errClosed
		}
		ls, ch := l.lease, l.leaseCh
		l.mu.Unlock()
		if ls != nil {
			return ls, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctxerr.Of(ctx)
		case <-l.closing:
			return nil, errClosed
		}
	}
}

// leaseFailed makes the lease loop abandon ls now: a write with it found
// it gone. Calls wait for the next lease from here on.
func (l *Locker) leaseFailed(ls *lease) {
	l.mu.Lock()
	if !ls.dead {
		ls.dead = true
		close(ls.kill)
	}
	if l.lease == ls {
		l.lease = nil
		l.leaseCh = make(chan struct{})
	}
	l.mu.Unlock()
}

// leaseLoop renews the Locker's lease and replaces it when it is lost,
// until l.bg ends. It runs in its own goroutine.
func (l *Locker) leaseLoop() {
	defer l.wg.Done()
	l.mu.Lock()
	ls := l.lease
	l.mu.Unlock()
	for {
		why := l.keepAlive(ls)
		if l.bg.Err() != nil {
			return
		}
		l.logger.Warn("etcdlock: lease lost; its grants are lost, its queued calls queue again under a new lease",
			"locker", l.name, "lease", int64(ls.id), "reason", why)
		l.mu.Lock()
		if l.lease == ls {
			l.lease = nil
			l.leaseCh = make(chan struct{})
		}
		for g := range l.live {
			if g.lease == ls {
				l.loseLocked(g)
			}
		}
		l.mu.Unlock()
		old := ls
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.revokeAbandoned(old)
		}()
		retry := newBackoff()
		for {
			ctx, cancel := context.WithTimeout(l.bg, cleanupTimeout)
			next, err := l.grant(ctx)
			cancel()
			if err == nil {
				ls = next
				break
			}
			if l.bg.Err() != nil {
				return
			}
			l.logger.Warn("etcdlock: lease grant failed; retrying", "locker", l.name, "error", err)
			if !retry.wait(l.bg) {
				return
			}
		}
		l.mu.Lock()
		l.lease = ls
		close(l.leaseCh)
		l.mu.Unlock()
	}
}

// keepAlive renews ls until it is lost, and says why; or until l.bg ends.
// It wakes for the next renewal or for the deadline, whichever is first,
// so that the lease is given up at its deadline, not a retry later.
func (l *Locker) keepAlive(ls *lease) string {
	deadline := ls.sent.Add(ls.ttl - ls.ttl/10)
	next := ls.sent.Add(ls.ttl / 3)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		t.Reset(min(time.Until(next), time.Until(deadline)))
		select {
		case <-t.C:
		case <-ls.kill:
			return "a write found it gone"
		case <-l.bg.Done():
			return ""
		}
		now := time.Now()
		if !now.Before(deadline) {
			return "not renewed for its TTL"
		}
		if now.Before(next) {
			continue
		}
		ctx, cancel := context.WithDeadline(l.bg, deadline)
		resp, err := l.client.KeepAliveOnce(ctx, ls.id)
		cancel()
		switch {
		case err == nil && resp.TTL > 0:
			ttl := time.Duration(resp.TTL) * time.Second
			deadline = now.Add(ttl - ttl/10)
			next = now.Add(ttl / 3)
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && resp.TTL <= 0):
			return "expired or revoked"
		default:
			next = time.Now().Add(ls.ttl / 10)
		}
	}
}

// revokeAbandoned revokes a lease the Locker gave up, so that the keys
// still attached to it (grants lost to a renewal deadline while etcd was
// unreachable, say) do not keep others waiting until it expires. It
// retries until the revoke succeeds, for at most twice the TTL (by then
// the lease has expired on the server, unless a new leader extended it),
// or until the Locker closes.
func (l *Locker) revokeAbandoned(ls *lease) {
	giveUp := time.Now().Add(2 * ls.ttl)
	retry := newBackoff()
	for {
		// On the background context: Close ends a try in progress (it
		// waits for this goroutine), and its own revoke takes over.
		ctx, cancel := context.WithTimeout(l.bg, cleanupTimeout)
		err := l.revokeWith(ctx, ls)
		cancel()
		if err == nil || !time.Now().Before(giveUp) || !retry.wait(l.bg) {
			return
		}
	}
}

// revoke revokes ls on a detached context bounded by cleanupTimeout,
// deleting every key attached to it.
func (l *Locker) revoke(ls *lease) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(l.client.Ctx()), cleanupTimeout)
	defer cancel()
	return l.revokeWith(ctx, ls)
}

// revokeWith revokes ls on ctx; a lease already gone is not an error.
func (l *Locker) revokeWith(ctx context.Context, ls *lease) error {
	_, err := l.client.Revoke(ctx, ls.id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil
	}
	return err
}

// The janitor. A key that must go but could not be deleted at once (etcd
// unreachable, or a write whose outcome is unknown) is recorded and its
// deletion retried every second until it succeeds, or, for a write whose
// outcome is unknown, until a grace period passes after which the write
// can no longer be applied. Close makes a last attempt and then revokes
// the lease, which deletes whatever is left; if etcd is unreachable even
// then, the lease expires within its TTL since nobody renews it.

// cleanup is a key the janitor deletes.
type cleanup struct {
	rev   int64     // delete only if its creation revision is rev; 0: whatever it is
	until time.Time // keep deleting until then (a write that may still land); zero: once
}

// unknownGrace is how long after a write with an unknown outcome the
// janitor keeps deleting its key, in case the write is applied late.
const unknownGrace = time.Minute

// janitorAdd records that name must be deleted (if its creation revision
// is rev, or whatever it is for rev 0) and wakes the janitor.
func (l *Locker) janitorAdd(name string, rev int64) {
	c := cleanup{rev: rev}
	if rev == 0 {
		c.until = time.Now().Add(unknownGrace)
	}
	l.mu.Lock()
	l.janitor[name] = c
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// janitorLoop retries recorded deletions every second while there are
// some, until l.bg ends. It runs in its own goroutine.
func (l *Locker) janitorLoop() {
	defer l.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-l.kick:
		case <-t.C:
		case <-l.bg.Done():
			return
		}
		l.sweep(l.bg)
	}
}

// sweep tries every recorded deletion once, until ctx ends: Close's
// stopping of the janitor ends a sweep in progress, and its own last
// sweep shares one bound with the lease's revoke.
func (l *Locker) sweep(ctx context.Context) {
	l.mu.Lock()
	todo := make(map[string]cleanup, len(l.janitor))
	for k, c := range l.janitor {
		todo[k] = c
	}
	l.mu.Unlock()
	for name, c := range todo {
		if ctx.Err() != nil {
			return
		}
		if err := l.deleteKey(ctx, name, c.rev); err != nil {
			continue
		}
		if c.until.IsZero() || time.Now().After(c.until) {
			l.mu.Lock()
			if l.janitor[name] == c {
				delete(l.janitor, name)
			}
			l.mu.Unlock()
		}
	}
}

// deleteKey deletes name if its creation revision is rev (any, for rev
// 0), bounded by ctx and by cleanupTimeout. A key that is already gone is
// not an error.
func (l *Locker) deleteKey(ctx context.Context, name string, rev int64) error {
	dctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
	defer cancel()
	cmp := clientv3.Compare(clientv3.CreateRevision(name), "=", rev)
	if rev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(name), ">", 0)
	}
	_, err := l.client.Txn(dctx).If(cmp).Then(clientv3.OpDelete(name)).Commit()
	return err
}

// remove deletes a call's key now, on the Locker's background context,
// not the call's (a cancelled call's context must not stop its cleanup:
// the failure mode of etcd-io/etcd#18082), and hands it to the janitor if
// that fails. Close ends the background context once calls have ended;
// its revoke and last sweep then take over.
func (l *Locker) remove(name string, rev int64) {
	if err := l.deleteKey(l.bg, name, rev); err != nil {
		if l.bg.Err() == nil {
			l.logger.Warn("etcdlock: could not delete a key; retrying in the background",
				"locker", l.name, "key", name, "error", err)
		}
		l.janitorAdd(name, rev)
	}
}

// txnResult is the outcome of a transaction.
type txnResult struct {
	resp *clientv3.TxnResponse
	err  error
}

// pendingTxn is an enqueueing transaction in flight.
type pendingTxn struct {
	done      chan txnResult // cap 1
	abandoned bool           // guarded by Locker.mu: its call returned
}

// commit runs txn, which may write the etcd key name, on a context that
// ctx's cancellation does not reach, so that its outcome is always known.
// If ctx ends (or the Locker closes) first, commit returns the context's
// error (or ErrClosed) at once and the transaction finishes in the
// background, given at most cleanupTimeout more; wrote then says whether
// it wrote name, and if so the key is deleted. A transaction that fails
// leaves an unknown outcome: the janitor deletes name if it shows up.
// Close waits for background transactions.
func (l *Locker) commit(ctx context.Context, name string, txn func(context.Context) (*clientv3.TxnResponse, error), wrote func(*clientv3.TxnResponse) bool) (*clientv3.TxnResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, ctxerr.Of(ctx)
	}
	p := &pendingTxn{done: make(chan txnResult, 1)}
	tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l.mu.Lock()
	l.pending++
	l.mu.Unlock()
	go func() {
		resp, err := txn(tctx)
		cancel()
		r := txnResult{resp, err}
		l.mu.Lock()
		abandoned := p.abandoned
		if !abandoned {
			p.done <- r
		}
		l.mu.Unlock()
		if abandoned {
			l.undo(name, r, wrote)
		}
		l.mu.Lock()
		l.pending--
		l.signalIdle()
		l.mu.Unlock()
	}()
	var r txnResult
	var stop error
	select {
	case r = <-p.done:
	case <-ctx.Done():
		stop = ctxerr.Of(ctx)
	case <-l.closing:
		stop = errClosed
	}
	if stop != nil {
		l.mu.Lock()
		select {
		case r = <-p.done:
			l.mu.Unlock()
			l.undo(name, r, wrote)
		default:
			p.abandoned = true
			l.mu.Unlock()
			time.AfterFunc(cleanupTimeout, cancel)
		}
		return nil, stop
	}
	if r.err != nil && !errors.Is(r.err, rpctypes.ErrLeaseNotFound) {
		// Unknown outcome: the write may have been applied.
		l.janitorAdd(name, 0)
	}
	return r.resp, r.err
}

// undo deletes what an abandoned transaction wrote.
func (l *Locker) undo(name string, r txnResult, wrote func(*clientv3.TxnResponse) bool) {
	switch {
	case r.err == nil && wrote(r.resp):
		l.remove(name, r.resp.Header.Revision)
	case r.err != nil && !errors.Is(r.err, rpctypes.ErrLeaseNotFound):
		l.janitorAdd(name, 0)
	}
}
