package pglock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The engine: PostgreSQL's protocol under the kit (package backend). A
// call's entry is its row in fairlock_calls, written by enqueue and
// deleted by release (queue.go, walk.go), named "session:seq" (callRef)
// before it is sent; its session is the Locker's row in fairlock_sessions
// (keeper.go), which the kit renews through Renew below. Grants reach the
// waiting calls through the Locker's listening connection (listen.go),
// whose notices name the calls they grant (a Wait named there ends at
// once, and its row goes a moment later with the other ended Waits' of
// its key, in one statement: granted, RemoveAll); Check re-reads, every third of
// the TTL and after that connection came back, each key on which the
// Locker has a waiting call: once per key, for all of the Locker's calls
// on it, never once per waiter.

// engine is a Locker's or Semaphore's PostgreSQL protocol.
type engine struct {
	k        *backend.Core
	pool     *pgxpool.Pool
	sp       space
	size     int64 // a Semaphore's units per key; 0 for a Locker
	seq      atomic.Int64
	sessions *keeper
}

// checkWidth is how many keys Check reads at once.
const checkWidth = 4

// refOf returns the call an entry id ("session:seq", callRef.String())
// names.
func refOf(id string) callRef {
	a, b, _ := strings.Cut(id, ":")
	s, _ := strconv.ParseInt(a, 10, 64)
	q, _ := strconv.ParseInt(b, 10, 64)
	return callRef{Session: s, Seq: q}
}

// callOf is what enqueue writes for c under ref.
func (e *engine) callOf(c *backend.Call, ref callRef) call {
	cl := call{ref: ref, mode: modeExclusive, label: c.Label()}
	switch c.Mode() {
	case backend.Shared:
		cl.mode = modeShared
	case backend.Units:
		cl.mode, cl.weight, cl.size = modeUnits, c.Weight(), e.size
	case backend.Turn:
		cl.mode = modeWait
	}
	return cl
}

// Enqueue writes c's row under the current session, numbered and named
// before it is sent: one round trip (enqueue), which also says whether
// the row holds the key. A try writes only a row that holds the key now;
// a Wait on a key with nothing to wait for writes nothing. A round trip
// whose outcome is unknown is sent again for the same name, which finds
// the row if the first wrote it (retried). An enqueue that finds the
// session expired on the server ends it and tries again under the next
// session.
func (e *engine) Enqueue(ctx context.Context, c *backend.Call) (backend.Enqueued, error) {
	for expiries := 0; ; expiries++ {
		if expiries > 1 && !backend.NewBackoff().Wait(ctx) {
			return backend.Enqueued{}, backend.Unwritten(ctx.Err())
		}
		s, sid, err := e.sessions.current(ctx)
		if err != nil {
			return backend.Enqueued{}, backend.Unwritten(err)
		}
		ref := callRef{Session: sid, Seq: e.seq.Add(1)}
		c.Name(ref.String())
		cl := e.callOf(c, ref)
		sent := time.Now()
		var out enqueued
		var token, other int64
		doubt, err := retried(ctx, func() (err error) {
			out, token, other, err = enqueue(ctx, e.pool, e.sp, c.Key(), cl, c.Try())
			return err
		})
		switch {
		case errors.Is(err, errSessionExpired) && !doubt:
			e.sessions.Failed(s)
			continue
		case err != nil && unwritten(doubt, err):
			return backend.Enqueued{}, backend.Unwritten(err)
		case err != nil:
			return backend.Enqueued{}, err
		}
		r := backend.Enqueued{Token: uint64(token), Session: s, Sent: sent}
		switch out {
		case granted:
			r.Granted = true
		case queued:
		case wouldBlock:
			return backend.Enqueued{}, backend.Unwritten(fairlock.ErrWouldBlock)
		case free:
			r = backend.Enqueued{Free: true}
		case otherSize:
			return backend.Enqueued{}, backend.SizeError(e.size, other)
		default:
			return backend.Enqueued{}, fmt.Errorf("pglock: enqueue: unknown outcome %d", out)
		}
		return r, nil
	}
}

// Release deletes c's row (release): by its name, so only this grant's
// row, even if retried late. The grant was current if the row was there
// and its session alive. A release whose outcome was unknown is sent
// again; if the second finds the row gone while the session is alive, the
// first one deleted it (nothing else deletes a live session's row but an
// administrator), and the grant counts as released, not lost.
func (e *engine) Release(ctx context.Context, c *backend.Call) (bool, error) {
	var removed, alive bool
	doubt, err := retried(ctx, func() (err error) {
		removed, alive, err = release(ctx, e.pool, e.sp, c.Key(), refOf(c.ID()))
		return err
	})
	if err != nil {
		return false, err
	}
	return (removed || doubt) && alive, nil
}

// Remove deletes an entry's row, wherever it is in its queue; a row
// already gone is not an error.
func (e *engine) Remove(ctx context.Context, en backend.Entry) error {
	_, err := retried(ctx, func() error {
		_, _, err := release(ctx, e.pool, e.sp, en.Key, refOf(en.ID))
		return err
	})
	return err
}

// Renew renews the sessions (one, the current, but for one replaced a
// moment ago), listing each one's calls the kit believes written: the
// server says which of them have no row any more (released or purged by
// someone else: their grants are lost, their queue places gone), and
// whether the session is alive. An expired session never comes back
// (renewSession does not revive it): the kit ends it and the keeper makes
// the next.
func (e *engine) Renew(ctx context.Context, ss []*backend.Session, attempt int) []backend.Renewal {
	out := make([]backend.Renewal, 0, len(ss))
	for _, s := range ss {
		sid := sessionID(s)
		var seqs []int64
		mu := e.k.Mu()
		mu.Lock()
		e.k.WrittenLocked(func(c *backend.Call) bool {
			if c.Confirmed() && c.Session() == s && !c.Releasing() {
				seqs = append(seqs, refOf(c.ID()).Seq)
			}
			return true
		})
		mu.Unlock()
		sent, alive, missing, err := e.sessions.renew(ctx, sid, seqs, attempt)
		r := backend.Renewal{Session: s, Sent: sent, TTL: e.sessions.ttl}
		switch {
		case err != nil:
			r.Err = err
		case !alive:
			r.Expired = true
		default:
			// The kit does not count a call whose Unlock began meanwhile.
			for _, q := range missing {
				r.Gone = append(r.Gone, callRef{Session: sid, Seq: q}.String())
			}
		}
		out = append(out, r)
	}
	return out
}

// Check re-reads the key of each waiting call (readKey: one round trip
// per key, which purges the key's dead rows and announces what that
// grants) and, for every call of this Locker on the key that was written
// before the read was sent, grants it if its row holds the key, or loses
// it if its row is gone. Keys are read checkWidth at a time.
func (e *engine) Check(ctx context.Context, waiting []*backend.Call) {
	type job struct {
		key     string
		session *backend.Session
		ids     map[int64]string // seq → entry id: the calls to judge
	}
	jobs := make(map[string]*job, len(waiting))
	mu := e.k.Mu()
	mu.Lock()
	for _, c := range waiting {
		jobs[c.Key()] = &job{key: c.Key(), session: c.Session(), ids: make(map[int64]string)}
	}
	e.k.WrittenLocked(func(c *backend.Call) bool {
		if j := jobs[c.Key()]; j != nil && c.Confirmed() && c.Session() == j.session {
			j.ids[refOf(c.ID()).Seq] = c.ID()
		}
		return true
	})
	mu.Unlock()
	todo := make(chan *job)
	var wg sync.WaitGroup
	for range min(checkWidth, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range todo {
				e.checkKey(ctx, j.key, j.session, j.ids)
			}
		}()
	}
	for _, j := range jobs {
		todo <- j
	}
	close(todo)
	wg.Wait()
}

// checkKey reads key for the calls ids (seq → entry id) of session s, and
// reports what it finds to the kit.
func (e *engine) checkKey(ctx context.Context, key string, s *backend.Session, ids map[int64]string) {
	if s == nil || len(ids) == 0 {
		return
	}
	var mine []callState
	_, err := retried(ctx, func() (err error) {
		_, mine, err = readKey(ctx, e.pool, e.sp, key, sessionID(s))
		return err
	})
	if err != nil {
		if e.k.Background().Err() == nil {
			e.k.Logger().Warn("pglock: reading a queue failed; retrying", "locker", e.k.Name(), "key", backend.LogKey(key), "error", err)
		}
		return
	}
	found := make(map[int64]bool, len(mine))
	var grants []string
	for _, st := range mine {
		found[st.Seq] = true
		if id, ok := ids[st.Seq]; ok && st.Granted {
			grants = append(grants, id)
		}
	}
	e.granted(grants)
	for seq, id := range ids {
		if !found[seq] {
			e.k.Lose(id)
		}
	}
}

// granted gives the calls ids (entry ids) what a notice or a read found:
// their rows hold the key. A Wait's turn has come: it ends there
// (EndTurnLocked), and its row goes to the janitor, which deletes it a
// moment later with the other ended Waits' rows of its key (RemoveAll);
// until then the grant rule reads it as transparent. Any other call is
// granted. It takes the Core's mutex once for all of them, so that the
// Waits one release frees (a notice names them all) return together.
func (e *engine) granted(ids []string) {
	mu := e.k.Mu()
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		if c := e.k.CallLocked(id); c != nil && !e.k.EndTurnLocked(c) {
			e.k.GrantLocked(c)
		}
	}
}

// RemoveAll deletes the rows of es, entries of key, in one round trip
// (releaseAll): the janitor's batch of the Waits one release ended, with
// whatever else it has to remove on the key. Rows already gone are not
// an error.
func (e *engine) RemoveAll(ctx context.Context, key string, es []backend.Entry) error {
	refs := make([]callRef, len(es))
	for i, en := range es {
		refs[i] = refOf(en.ID)
	}
	_, err := retried(ctx, func() error { return releaseAll(ctx, e.pool, e.sp, key, refs) })
	return err
}

// Shutdown releases the rows of the grants still held (so that the calls
// behind them are granted and told at once) and deletes the Locker's
// session rows, which makes any row left dead. It returns the entries it
// could not release, for the kit's last removals.
func (e *engine) Shutdown(ctx context.Context, left []backend.Entry) ([]backend.Entry, error) {
	var rest []backend.Entry
	for _, en := range left {
		if err := e.Remove(ctx, en); err != nil {
			rest = append(rest, en)
		}
	}
	if _, err := e.sessions.Shutdown(ctx); err != nil {
		return rest, err
	}
	return rest, nil
}

// List lists key's calls in every process (listCalls: one read, the rows
// in queue order with their sessions' process), as keylock.CallInfo: the
// granted ones first, by the grant rule, then the waiting ones; a row
// whose session has expired is not listed.
func (e *engine) List(ctx context.Context, key string) ([]keylock.CallInfo, error) {
	rows, err := listCalls(ctx, e.pool, e.sp, key)
	if err != nil {
		return nil, err
	}
	out := make([]keylock.CallInfo, 0, len(rows))
	for _, r := range rows {
		if !r.Alive {
			continue
		}
		ci := keylock.CallInfo{
			Label:   r.Label,
			Process: keylock.Process{Host: r.Host, PID: r.PID, Locker: r.Name},
			Mode:    r.Mode.listed(),
			Held:    r.Granted,
			Age:     r.Age,
		}
		if r.Mode == modeUnits {
			ci.Units = r.Weight
		}
		if r.Granted {
			ci.Token = uint64(r.Token)
		}
		out = append(out, ci)
	}
	return out, nil
}

var (
	_ backend.Checker      = (*engine)(nil)
	_ backend.Lister       = (*engine)(nil)
	_ backend.BatchRemover = (*engine)(nil)
)
