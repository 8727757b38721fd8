package etcdlock

import (
	"context"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Dispatch of deletions: how a waiter learns, without a round trip and
// without the server's 100 ms catch-up, that the keys ahead of it are gone.
//
// The watch loop keeps one watch on the Locker's whole prefix, deletions
// only, started at the current revision W (so the server keeps it in its
// synced group and sends each deletion as it is committed). It hands each
// deletion to the hub, which wakes the calls that wait for that key.
//
// A call subscribes with what it read in etcd at revision G: the keys
// ahead of it (all of them when few, else the nearest aheadLimit) and its
// own key. Any of those may be deleted after G, and the watch may deliver
// that deletion before or after the subscription: the hub keeps the
// recent deletions (key → revision, every deletion with a revision above
// hub.from) and counts a key as already gone if it was deleted after G.
// A subscription with G < hub.from cannot be judged and is refused: the
// call reads its state again (a fresh G) and subscribes again.
//
// A waiter is granted when every key ahead of it is gone and it knew them
// all: no key with a smaller creation revision can appear later, so at the
// revision of the last deletion its own key was the oldest in its range.
// If it watched only the nearest keys, it reads the range once more when
// they are gone.
//
// If the watch ends (compaction, lost leader, an error), the loop starts a
// new one at the then current revision W' and rebuilds the hub from one
// listing of the prefix read after W': each call's own key present or not
// (a held grant whose key is gone is lost), and each waiter's complete set
// of keys ahead. Deletions up to the listing are reflected in it; later
// ones arrive through the new watch.

// aheadLimit is how many of the keys ahead of it a waiter subscribes to.
// With at most this many ahead it knows them all and is granted with no
// round trip once they are gone; with more, it reads the range again when
// the nearest are gone. A release wakes at most this many local waiters,
// and only to count down.
const aheadLimit = 8

// recentCap bounds the deletions the hub remembers.
const recentCap = 4096

// deletion is one dispatched deletion.
type deletion struct {
	key string
	rev int64
}

// hub is the dispatch state. It is guarded by Locker.mu.
type hub struct {
	started bool                // the first watch was created
	live    bool                // the watch is established and dispatching
	ready   chan struct{}       // closed while live; replaced when the watch ends
	from    int64               // see the comment above
	recent  map[string]int64    // deleted key → revision, for revisions > from
	order   []deletion          // recent, oldest first, for eviction
	watched map[string][]*Guard // etcd key → calls that wait for its deletion or own it
}

func (h *hub) init() {
	h.ready = make(chan struct{})
	h.recent = make(map[string]int64)
	h.watched = make(map[string][]*Guard)
}

// readyCh returns the channel closed once the watch is live.
func (h *hub) readyCh() <-chan struct{} { return h.ready }

// subscribeLocked subscribes g to the deletion of the keys ahead of it
// (all of them if complete) and of its own key, as read at revision at.
// It reports false, with the channel to wait on before reading again, if
// the hub cannot judge deletions after at. It wakes g at once if every
// key ahead is already gone or its own key is. l.mu is held.
func (l *Locker) subscribeLocked(g *Guard, ahead []string, complete bool, at int64) (bool, <-chan struct{}) {
	h := &l.hub
	if !h.live || at < h.from {
		return false, h.ready
	}
	l.unwatchAheadLocked(g)
	g.complete = complete
	for _, k := range ahead {
		if r, ok := h.recent[k]; ok && r > at {
			continue
		}
		h.watched[k] = append(h.watched[k], g)
		g.aheadKeys = append(g.aheadKeys, k)
	}
	g.ahead = len(g.aheadKeys)
	if !g.ownWatched {
		if r, ok := h.recent[g.name]; ok && r > at {
			l.loseLocked(g)
		} else {
			h.watched[g.name] = append(h.watched[g.name], g)
			g.ownWatched = true
		}
	}
	if g.ahead == 0 {
		g.signal()
	}
	return true, nil
}

// unwatchAheadLocked removes g's subscriptions to keys ahead. l.mu is held.
func (l *Locker) unwatchAheadLocked(g *Guard) {
	for _, k := range g.aheadKeys {
		l.hub.drop(k, g)
	}
	g.aheadKeys = g.aheadKeys[:0]
	g.ahead = 0
}

// unwatchLocked removes every subscription of g. l.mu is held.
func (l *Locker) unwatchLocked(g *Guard) {
	l.unwatchAheadLocked(g)
	if g.ownWatched {
		l.hub.drop(g.name, g)
		g.ownWatched = false
	}
}

// drop removes g from the subscribers of k.
func (h *hub) drop(k string, g *Guard) {
	gs := h.watched[k]
	if i := slices.Index(gs, g); i >= 0 {
		gs = slices.Delete(gs, i, i+1)
	}
	if len(gs) == 0 {
		delete(h.watched, k)
	} else {
		h.watched[k] = gs
	}
}

// deletedLocked dispatches the deletion of key at revision rev. l.mu is
// held.
func (l *Locker) deletedLocked(key string, rev int64) {
	h := &l.hub
	h.recent[key] = rev
	h.order = append(h.order, deletion{key, rev})
	if len(h.order) > recentCap {
		old := h.order[0]
		h.order = h.order[1:]
		if h.recent[old.key] == old.rev {
			delete(h.recent, old.key)
		}
		h.from = max(h.from, old.rev)
		if cap(h.order) > 4*recentCap {
			h.order = slices.Clone(h.order)
		}
	}
	gs := h.watched[key]
	if gs == nil {
		return
	}
	delete(h.watched, key)
	for _, g := range gs {
		if key == g.name {
			g.ownWatched = false
			l.loseLocked(g)
			continue
		}
		if i := slices.Index(g.aheadKeys, key); i >= 0 {
			g.aheadKeys = slices.Delete(g.aheadKeys, i, i+1)
			g.ahead--
			if g.ahead == 0 {
				g.signal()
			}
		}
	}
}

// watchLoop keeps the Locker's watch on its prefix and dispatches
// deletions until l.bg ends. It runs in its own goroutine.
func (l *Locker) watchLoop() {
	defer l.wg.Done()
	retry := newBackoff()
	for l.bg.Err() == nil {
		l.mu.Lock()
		gate := l.watchGate
		l.watchGate = nil
		l.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-l.bg.Done():
				return
			}
		}
		ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(l.bg))
		l.mu.Lock()
		l.watchCancel = cancel
		l.mu.Unlock()
		wch := l.client.Watch(ctx, l.root, clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
		var err error
		for resp := range wch {
			if err = resp.Err(); err != nil {
				break
			}
			if resp.Created {
				if err = l.started(ctx, resp.Header.Revision); err != nil {
					break
				}
				retry.reset()
				continue
			}
			l.mu.Lock()
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					l.deletedLocked(string(ev.Kv.Key), ev.Kv.ModRevision)
				}
			}
			l.mu.Unlock()
		}
		cancel()
		for range wch { // drain, so the watcher's goroutines can exit
		}
		l.mu.Lock()
		if l.hub.live {
			l.hub.live = false
			l.hub.ready = make(chan struct{})
		}
		l.mu.Unlock()
		if l.bg.Err() != nil {
			return
		}
		if err != nil {
			l.logger.Warn("etcdlock: watch ended; restarting it", "locker", l.name, "prefix", l.root, "error", err)
		} else {
			l.logger.Info("etcdlock: watch closed; restarting it", "locker", l.name, "prefix", l.root)
		}
		if !retry.wait(l.bg) {
			return
		}
	}
}

// started makes the hub live on a watch created at revision w. The first
// time, nothing was subscribed; later, it rebuilds the subscriptions that
// the ended watch served from a listing of the prefix read after w.
func (l *Locker) started(ctx context.Context, w int64) error {
	l.mu.Lock()
	first := !l.hub.started
	l.mu.Unlock()
	var kvs []*mvccpb.KeyValue
	if !first {
		// Listed while the watch is not read: no deletion is dispatched
		// before the subscriptions it concerns are rebuilt.
		lctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
		resp, err := l.client.Get(lctx, l.root, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			return err
		}
		kvs = resp.Kvs
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	h := &l.hub
	h.started = true
	h.from = w
	clear(h.recent)
	h.order = h.order[:0]
	if !first {
		l.rebuildLocked(kvs)
	}
	h.live = true
	close(h.ready)
	return nil
}

// rebuildLocked resubscribes, from a listing of the prefix, every call
// that was subscribed when the previous watch ended (its own key is
// watched). Calls that subscribe later read etcd themselves: the hub
// refuses them until it is live again. l.mu is held.
func (l *Locker) rebuildLocked(kvs []*mvccpb.KeyValue) {
	h := &l.hub
	var subscribed []*Guard
	for g := range l.live {
		if g.ownWatched {
			subscribed = append(subscribed, g)
		}
		g.aheadKeys = g.aheadKeys[:0]
		g.ahead = 0
		g.ownWatched = false
	}
	clear(h.watched)
	created := make(map[string]int64, len(kvs))
	for _, kv := range kvs {
		created[string(kv.Key)] = kv.CreateRevision
	}
	for _, g := range subscribed {
		if created[g.name] != g.rev {
			l.loseLocked(g)
			continue
		}
		h.watched[g.name] = append(h.watched[g.name], g)
		g.ownWatched = true
		if g.state != queued {
			continue
		}
		r := l.rangeOf(g.key)
		for _, kv := range kvs {
			if kv.CreateRevision < g.rev && strings.HasPrefix(string(kv.Key), r) {
				k := string(kv.Key)
				h.watched[k] = append(h.watched[k], g)
				g.aheadKeys = append(g.aheadKeys, k)
			}
		}
		g.ahead = len(g.aheadKeys)
		g.complete = true
		if g.ahead == 0 {
			g.signal()
		}
	}
}

// backoff paces retries: 50 ms doubling to 1 s.
type backoff struct{ d time.Duration }

func newBackoff() *backoff { return &backoff{d: 50 * time.Millisecond} }

func (b *backoff) reset() { b.d = 50 * time.Millisecond }

// wait sleeps for the current delay and doubles it; it reports false if
// ctx ended first.
func (b *backoff) wait(ctx context.Context) bool {
	t := time.NewTimer(b.d)
	defer t.Stop()
	b.d = min(2*b.d, time.Second)
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
