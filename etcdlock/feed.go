package etcdlock

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/etcdlock/internal/testhook"
	"github.com/fairlock/fairlock/keylock"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Every change of a key's holders (keylock.Follower). A feed reads the
// key's range once, linearizably, values included, and watches the range
// from the revision after that read's: it then holds the whole queue of
// the key in this process (each call's etcd key with its creation
// revision and value) and applies each revision's events to it (a put
// adds a call, a delete removes one; a lease's expiry deletes all its
// keys at one revision). After each revision it judges which calls hold
// the key by the rule every Locker grants by (holds, keys.go), and sends
// a Change if the holders' tokens (their creation revisions) differ from
// those it sent last. So every grant and every release is seen, in
// revision order, and a hand-over from a holder to the call queued behind
// it is one Change (the deletion that ends one grant begins the next),
// with no vacancy between. This is how etcd's concurrency.Election.Observe
// follows a leader (a watch on the election's prefix from a read's
// revision), applied to the whole queue so that it also serves shared
// holds and units.
//
// A watch that ends (a lost leader, a broken connection, the client's own
// reconnection) is opened again from the revision after the last one the
// feed applied: etcd keeps every revision since, so nothing is lost. Only
// when etcd has compacted a revision the feed had not read
// (rpctypes.ErrCompacted, the response's CompactRevision) is its history
// gone: the feed reads the range afresh, sends what it read as a Change
// with Gap set, and watches from there.

// Follow streams key's changes (keylock.Follower): first the key's
// holders as one linearizable read finds them, before Follow returns,
// then one Change per revision that changes them, in revision order,
// every grant and release included; a Change with Gap set where etcd had
// compacted revisions not yet read, carrying the holders read afresh.
// Each holder is listed as Calls lists it (label, process, mode or
// units, token, and an age on the writer's clock); At is when this
// process received the revision. The channel closes when ctx ends or
// Close begins; a reader must keep receiving until then (the watch's
// events wait in the etcd client meanwhile, unbounded).
//
// Follow fails with a *fairlock.LockError naming the key: wrapping the
// context's error, fairlock.ErrClosed once Close has begun, or etcd's
// error if the first read fails. It starts one goroutine, which Close
// waits for, and one watch of the key's range on the client, each with
// the etcd client's own; while the engine cannot be reached, the stream
// is silent, and it goes on from where it was once a watch opens again.
// A watch on a member that stops answering without closing its
// connection delays the stream until the client notices (its keepalive).
func (l *Locker) Follow(ctx context.Context, key string) (<-chan keylock.Change, error) {
	return l.e.follow(ctx, key)
}

// Follow streams key's changes as Locker.Follow does, each holder with
// its units.
func (s *Semaphore) Follow(ctx context.Context, key string) (<-chan keylock.Change, error) {
	return s.e.follow(ctx, key)
}

var (
	_ keylock.Follower = (*Locker)(nil)
	_ keylock.Follower = (*Semaphore)(nil)
)

// queued is one call in a feed's copy of a key's queue: its etcd key's
// name, creation revision and value.
type queued struct {
	name   string
	create int64
	value  []byte
}

// feed is one Follow: its copy of the key's queue, the revision it has
// applied up to, and the tokens of the holders it sent last.
type feed struct {
	e      *engine
	key    string
	rng    string // rangeOf the key
	ch     chan<- keylock.Change
	queue  []queued // oldest first (by creation revision)
	rev    int64    // the last revision applied to queue
	tokens []uint64 // the holders' tokens in the last Change sent
}

// follow implements Follow for a Locker or Semaphore on e: the kit runs
// the feed's life (backend.Core.Follow) around one read of the key's
// queue and the watch from its revision.
func (e *engine) follow(ctx context.Context, key string) (<-chan keylock.Change, error) {
	return e.k.Follow(ctx, key, func(fctx context.Context, ch chan<- keylock.Change) (func(), error) {
		f := &feed{e: e, key: key, rng: rangeOf(e.root, key), ch: ch}
		if err := f.read(fctx); err != nil {
			return nil, err
		}
		first := f.change(false)
		return func() {
			if f.send(fctx, first) {
				f.run(fctx)
			}
		}, nil
	})
}

// read replaces the feed's queue with the key's range as one
// linearizable read finds it, and its revision with the read's.
func (f *feed) read(ctx context.Context) error {
	var resp *clientv3.GetResponse
	err := f.e.attempts(ctx, func(actx context.Context) (err error) {
		resp, err = f.e.client.Get(actx, f.rng, clientv3.WithPrefix(),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
		return err
	})
	if err != nil {
		return err
	}
	f.queue = f.queue[:0]
	for _, kv := range resp.Kvs {
		f.queue = append(f.queue, queued{string(kv.Key), kv.CreateRevision, kv.Value})
	}
	f.rev = resp.Header.Revision
	return nil
}

// run watches the key's range from the revision after f.rev and sends
// each change of the holders, opening the watch again when it ends and
// reading the range afresh when etcd compacted revisions not yet read,
// until ctx ends.
func (f *feed) run(ctx context.Context) {
	retry := backend.NewBackoff()
	for ctx.Err() == nil {
		wctx, wcancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		if !feedHooks.opening(f.e, wctx, wcancel) {
			wcancel()
			return
		}
		wch := f.e.client.Watch(wctx, f.rng, clientv3.WithPrefix(), clientv3.WithRev(f.rev+1))
		compacted, ok := f.serve(ctx, wch)
		wcancel()
		for range wch { // drain, so the watcher's goroutines can exit
		}
		feedHooks.closed(f.e, wctx)
		if !ok {
			return
		}
		if compacted {
			for {
				err := f.read(ctx)
				if err == nil {
					break
				}
				if !retry.Wait(ctx) {
					return
				}
			}
			retry.Reset()
			if !f.send(ctx, f.change(true)) {
				return
			}
			continue
		}
		if !retry.Wait(ctx) {
			return
		}
	}
}

// serve applies what wch delivers until it ends. It reports whether it
// ended on a compaction (the history from f.rev+1 is gone), and ok false
// if ctx ended, during a send included.
func (f *feed) serve(ctx context.Context, wch clientv3.WatchChan) (compacted, ok bool) {
	for resp := range wch {
		if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
			return true, ctx.Err() == nil
		}
		if err := resp.Err(); err != nil || resp.Canceled {
			return false, ctx.Err() == nil
		}
		evs := resp.Events
		for len(evs) > 0 {
			rev := evs[0].Kv.ModRevision
			n := 1
			for n < len(evs) && evs[n].Kv.ModRevision == rev {
				n++
			}
			for _, ev := range evs[:n] {
				f.apply(ev)
			}
			evs = evs[n:]
			f.rev = rev
			if c, changed := f.next(); changed && !f.send(ctx, c) {
				return false, false
			}
		}
	}
	return false, ctx.Err() == nil
}

// apply applies one event to the queue: a put adds its call (or updates
// its value), a delete removes it.
func (f *feed) apply(ev *clientv3.Event) {
	name := string(ev.Kv.Key)
	i := slices.IndexFunc(f.queue, func(q queued) bool { return q.name == name })
	switch {
	case ev.Type == mvccpb.DELETE:
		if i >= 0 {
			f.queue = slices.Delete(f.queue, i, i+1)
		}
	case i >= 0:
		f.queue[i].value = ev.Kv.Value
	default:
		q := queued{name, ev.Kv.CreateRevision, ev.Kv.Value}
		j, _ := slices.BinarySearchFunc(f.queue, q.create, func(q queued, rev int64) int {
			switch {
			case q.create < rev:
				return -1
			case q.create > rev:
				return 1
			}
			return 0
		})
		f.queue = slices.Insert(f.queue, j, q)
	}
}

// next returns the Change the queue's holders make now, and whether they
// differ from those last sent.
func (f *feed) next() (keylock.Change, bool) {
	claims := make([]claim, len(f.queue))
	for i, q := range f.queue {
		claims[i] = claimOf(q.name)
	}
	held := holds(claims)
	i := 0
	for j, h := range held {
		if !h {
			continue
		}
		if i == len(f.tokens) || f.tokens[i] != uint64(f.queue[j].create) {
			return f.change(false), true
		}
		i++
	}
	if i != len(f.tokens) {
		return f.change(false), true
	}
	return keylock.Change{}, false
}

// change returns the Change the queue's holders make now, with gap, and
// records their tokens as the last sent.
func (f *feed) change(gap bool) keylock.Change {
	claims := make([]claim, len(f.queue))
	for i, q := range f.queue {
		claims[i] = claimOf(q.name)
	}
	held := holds(claims)
	now := time.Now()
	c := keylock.Change{At: now, Gap: gap}
	f.tokens = f.tokens[:0]
	for i, q := range f.queue {
		if !held[i] || claims[i].turn {
			continue // a Wait whose turn has come holds nothing, as in process and on Redis
		}
		cl := claims[i]
		p, at, label := parseValue(string(q.value))
		info := keylock.CallInfo{Label: label, Process: p, Mode: cl.mode(), Held: true, Token: uint64(q.create)}
		if cl.size > 0 {
			info.Units = cl.w
		}
		if !at.IsZero() {
			info.Age = max(now.Sub(at), 0)
		}
		c.Holders = append(c.Holders, info)
		f.tokens = append(f.tokens, uint64(q.create))
	}
	return c
}

// send sends c, and reports false if ctx ended first.
func (f *feed) send(ctx context.Context, c keylock.Change) bool {
	select {
	case f.ch <- c:
		return true
	case <-ctx.Done():
		return false
	}
}

// feedHooks lets etcdlock's tests hold a Locker's feeds between two
// watches (testhook.PauseFeeds): a gate per engine that a feed waits on
// before it opens its next watch, the cancels of the watches open, and
// the feeds waiting. Without a test it holds no gate: a feed takes its
// mutex twice per watch it opens.
var feedHooks = feedPauses{
	gates: map[*engine]chan struct{}{},
	open:  map[*engine]map[context.Context]context.CancelFunc{},
	held:  map[*engine]int{},
}

func init() {
	testhook.PauseFeeds = func(l any, n int) func() {
		if s, ok := l.(*Semaphore); ok {
			return feedHooks.pause(s.e, n)
		}
		return feedHooks.pause(l.(*Locker).e, n)
	}
}

// feedPauses is the type of feedHooks.
type feedPauses struct {
	mu    sync.Mutex // guards the maps
	gates map[*engine]chan struct{}
	open  map[*engine]map[context.Context]context.CancelFunc
	held  map[*engine]int // feeds waiting at their engine's gate
}

// opening waits at e's gate, if a test closed it, then records the watch
// about to open on wctx; it reports false if wctx ended first.
func (p *feedPauses) opening(e *engine, wctx context.Context, cancel context.CancelFunc) bool {
	p.mu.Lock()
	gate := p.gates[e]
	if gate != nil {
		p.held[e]++
		p.mu.Unlock()
		select {
		case <-gate:
		case <-wctx.Done():
		}
		p.mu.Lock()
		p.held[e]--
	}
	if wctx.Err() != nil {
		p.mu.Unlock()
		return false
	}
	if p.open[e] == nil {
		p.open[e] = map[context.Context]context.CancelFunc{}
	}
	p.open[e][wctx] = cancel
	p.mu.Unlock()
	return true
}

// closed forgets the watch on wctx.
func (p *feedPauses) closed(e *engine, wctx context.Context) {
	p.mu.Lock()
	delete(p.open[e], wctx)
	if len(p.open[e]) == 0 {
		delete(p.open, e)
	}
	p.mu.Unlock()
}

// pause is testhook.PauseFeeds: it closes e's gate, ends the watches of
// e's feeds, and returns once n feeds wait at the gate.
func (p *feedPauses) pause(e *engine, n int) (resume func()) {
	gate := make(chan struct{})
	p.mu.Lock()
	p.gates[e] = gate
	for _, cancel := range p.open[e] {
		cancel()
	}
	p.mu.Unlock()
	for {
		p.mu.Lock()
		held := p.held[e]
		p.mu.Unlock()
		if held >= n {
			break
		}
		time.Sleep(time.Millisecond)
	}
	return func() {
		p.mu.Lock()
		delete(p.gates, e)
		p.mu.Unlock()
		close(gate)
	}
}
