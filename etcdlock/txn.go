package etcdlock

import (
	"context"
	"errors"
	"time"

	"github.com/fairlock/fairlock/etcdlock/internal/ctxerr"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Enqueueing transactions. The transaction that writes a call's key must
// have a known outcome, or the key could stay behind a call that
// returned: commit runs it apart from the call's context and,
// if the call gives up first, lets it finish and undoes what it wrote.
// Keys whose fate stays unknown go to the janitor (janitor.go).

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
	case <-l.closing.Done():
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
	if r.err != nil && !refused(r.err) {
		// Unknown outcome: the write may have been applied.
		l.janitor.add(name, 0)
	}
	return r.resp, r.err
}

// undo deletes what an abandoned transaction wrote.
func (l *Locker) undo(name string, r txnResult, wrote func(*clientv3.TxnResponse) bool) {
	switch {
	case r.err == nil && wrote(r.resp):
		l.janitor.remove(name, r.resp.Header.Revision)
	case r.err != nil && !refused(r.err):
		l.janitor.add(name, 0)
	}
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
