package etcdlock

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairlock/fairlock/backend"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
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
// A waiter is granted when the keys ahead of it that are left leave room
// for it (claim.weigh: for a Lock, when every key ahead is gone; for an
// RLock, every key ahead that is not a reader's; for w units, enough
// units) and it knew them all: no key with a smaller creation revision can
// appear later, so at the revision of the deletion that made room its own
// key's turn had come. An exclusive call subscribes to the nearest keys
// only; when they are gone and there were more, it reads the range once
// more. Shared calls and units read every key ahead: a reader's turn
// depends on every call ahead of it, not only the nearest.
//
// A Wait's turn depends on every call ahead of it that is not a Wait,
// so it would read every key ahead, and n Waits queued together behind
// one holder would read n²/2 keys. A Wait reads the nearest
// waitAheadLimit keys ahead when it queues. If there were more, it looks
// among the keys it read for a Wait of this Locker on the same key that
// knows the rest of the queue (its base, inheritLocked): one whose
// subscription is that of a complete view, or whose turn has come (turnCame: once no key
// ahead of a call is left but Waits, none can come, since a key created
// later is behind it). The keys it read hold every key created between
// the base's and its own, so the base's subscriptions complete its view:
// it subscribes to the keys it read that are newer than the base's, and
// to the base's keys ahead (aheadKeys: those that keep a Wait waiting and
// whose deletion the hub has not dispatched; none if the base's turn has
// come). Deletions the hub dispatches after that reach it as a subscriber
// of each, so its view stays complete. With no base, it reads its whole
// queue (Refresh) in a read shared with the other Waits of this Locker
// reading the same queue at the time (reads.go).
//
// If the watch ends (compaction, lost leader, an error, or silence: see
// serveWatch), the loop starts a new one at the then current revision W' and rebuilds the hub from one
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

// waitAheadLimit is how many of the keys ahead of it a Wait reads when it
// queues: more than aheadLimit, so that among Waits queued together
// through this Locker one usually finds, among the keys it read, a Wait
// of this Locker that already knows the rest of the queue
// (inheritLocked), and needs no second read.
const waitAheadLimit = 32

// recentCap bounds the deletions the hub remembers.
const recentCap = 4096

// deletion is one dispatched deletion.
type deletion struct {
	key string
	rev int64
}

// hub keeps the Locker's watch (watchLoop) and dispatches its deletions
// to the calls subscribed to them. New sets the fields that come from the
// Locker; they do not change after. The dispatch state below them is
// guarded by mu.
type hub struct {
	mu     *sync.Mutex // the Locker's mu
	client *clientv3.Client
	root   string        // the Locker's rootOf(prefix): the prefix watched
	k      *backend.Core // the Locker's core: its calls, and their grants and losses
	// judge grants a call whose keys ahead leave room for it, or has it
	// read its queue again (engine.judgeLocked).
	judge func(*backend.Call, *waiter)

	started bool                       // the first watch was created
	live    bool                       // the watch is established and dispatching
	ready   chan struct{}              // closed while live; replaced when the watch ends
	from    int64                      // see the comment above
	recent  map[string]int64           // deleted key → revision, for revisions > from
	order   []deletion                 // recent, oldest first, for eviction
	watched map[string][]*backend.Call // etcd key → calls that wait for its deletion or own it

	watchCancel context.CancelFunc // ends the current watch (tests: PauseWatch)
	watchGate   chan struct{}      // tests: the next watch starts once it is closed
}

func (h *hub) init() {
	h.ready = make(chan struct{})
	h.recent = make(map[string]int64)
	h.watched = make(map[string][]*backend.Call)
}

// waiter is a call's view of its queue, kept with it (backend.Call.Data):
// what the last read of the keys ahead found, and what the call is
// subscribed to. It is guarded by mu.
type waiter struct {
	claim claim  // what the call asks for
	key   string // the call's key (Call.Key)
	rev   int64  // the creation revision of the call's etcd key (its token)
	// The last read of the queue, for subscribeLocked: the keys ahead,
	// newest first (all of them if complete), at revision at.
	ahead    []string
	complete bool
	at       int64
	// turnCame: judgeLocked granted the call: no key ahead of it that
	// keeps it waiting was left, and none can come.
	turnCame bool
	// The subscription.
	weight     total    // the weight (claim.weigh) of aheadKeys
	aheadKeys  []string // the subscribed keys ahead not yet deleted, oldest first
	turns      int      // the Waits among aheadKeys (a shared call's)
	ownWatched bool     // subscribed to its own key's deletion
	// subscribed: aheadKeys are the subscription of the last read (ahead,
	// complete, at), kept since by the deletions dispatched. A read
	// whose subscription the hub refused leaves it false.
	subscribed bool
}

// waiterOf returns c's waiter. mu is held.
func waiterOf(c *backend.Call) *waiter {
	w, _ := c.Data().(*waiter)
	if w == nil {
		w = &waiter{}
		c.SetData(w)
	}
	return w
}

// ready reports whether the subscribed keys ahead that are left leave
// room for the call: with complete, its turn has come. A shared call
// behind a Wait waits until no reader is ahead of that Wait (its turn
// has come); any other call counts a Wait ahead as transparent (weigh).
// mu is held.
func (w *waiter) ready() bool {
	if !w.weight.atMost(w.claim.room()) {
		return false
	}
	if w.turns == 0 {
		return true
	}
	reader := false
	for _, k := range w.aheadKeys {
		switch a := claimOf(k); {
		case a.turn && reader:
			return false
		case a.shared:
			reader = true
		}
	}
	return true
}

// readyCh returns the channel closed once the watch is live.
func (h *hub) readyCh() <-chan struct{} { return h.ready }

// subscribeLocked subscribes c to the deletion of the keys ahead of it
// that w's last read found (all of them if complete) and of its own key,
// as read at revision w.at. It reports false, with the channel to wait on
// before reading again, if the hub cannot judge deletions after w.at. A
// key ahead that was deleted after w.at counts as gone; so does c's own,
// which loses c. h.mu is held.
func (h *hub) subscribeLocked(c *backend.Call, w *waiter) (bool, <-chan struct{}) {
	if !h.live || w.at < h.from {
		w.subscribed = false
		return false, h.ready
	}
	h.unwatchAheadLocked(c, w)
	h.inheritLocked(c, w)
	h.watchAheadLocked(c, w)
	w.subscribed = true
	if !w.ownWatched {
		if r, ok := h.recent[c.ID()]; ok && r > w.at {
			h.k.LoseLocked(c)
		} else {
			h.watched[c.ID()] = append(h.watched[c.ID()], c)
			w.ownWatched = true
		}
	}
	return true, nil
}

// inheritLocked completes the view of c, a Wait whose read stopped short
// of the front of its queue, with a base's (see above), if one is among
// the keys it read: it subscribes c to the base's keys ahead, leaves in
// w.ahead only the keys newer than the base's, and marks the view
// complete. It changes nothing if there is no base. h.mu is held.
func (h *hub) inheritLocked(c *backend.Call, w *waiter) {
	if w.complete || !w.claim.turn {
		return
	}
	for i, k := range w.ahead { // newest first
		bc := h.k.CallLocked(k)
		if bc == nil {
			continue
		}
		b, ok := bc.Data().(*waiter)
		if !ok || !b.claim.turn || b.key != w.key || b.rev != int64(bc.Token()) || !(b.turnCame || b.subscribed && b.complete) {
			continue // not a Wait, not subscribed yet, or not knowing all ahead of it
		}
		if !b.turnCame {
			for _, k := range b.aheadKeys { // oldest first
				h.watched[k] = append(h.watched[k], c)
				w.aheadKeys = append(w.aheadKeys, k)
				w.weight.add(w.claim.weigh(k))
			}
		}
		w.ahead = w.ahead[:i]
		w.complete = true
		return
	}
}

// watchAheadLocked subscribes c to the keys ahead in w.ahead that keep it
// waiting, skipping those deleted after w.at. h.mu is held.
func (h *hub) watchAheadLocked(c *backend.Call, w *waiter) {
	// A shared call behind a Wait must know the readers ahead of that
	// Wait too (ready).
	all := false
	if w.claim.shared {
		for _, k := range w.ahead {
			all = all || claimOf(k).turn
		}
	}
	for i := len(w.ahead) - 1; i >= 0; i-- { // oldest first
		k := w.ahead[i]
		if r, ok := h.recent[k]; ok && r > w.at {
			continue
		}
		weight := w.claim.weigh(k)
		a := claimOf(k)
		if weight == 0 && !(all && (a.shared || a.turn)) {
			continue // never keeps the call waiting
		}
		h.watched[k] = append(h.watched[k], c)
		w.aheadKeys = append(w.aheadKeys, k)
		w.weight.add(weight)
		if a.turn && w.claim.shared {
			w.turns++
		}
	}
}

// unwatchAheadLocked removes c's subscriptions to keys ahead. h.mu is held.
func (h *hub) unwatchAheadLocked(c *backend.Call, w *waiter) {
	for _, k := range w.aheadKeys {
		h.drop(k, c)
	}
	w.aheadKeys = w.aheadKeys[:0]
	w.weight = total{}
	w.turns = 0
}

// unwatchLocked removes every subscription of c. h.mu is held.
func (h *hub) unwatchLocked(c *backend.Call, w *waiter) {
	h.unwatchAheadLocked(c, w)
	w.subscribed = false
	if w.ownWatched {
		h.drop(c.ID(), c)
		w.ownWatched = false
	}
}

// drop removes c from the subscribers of k.
func (h *hub) drop(k string, c *backend.Call) {
	cs := h.watched[k]
	if i := slices.Index(cs, c); i >= 0 {
		cs = slices.Delete(cs, i, i+1)
	}
	if len(cs) == 0 {
		delete(h.watched, k)
	} else {
		h.watched[k] = cs
	}
}

// deletedLocked dispatches the deletion of key at revision rev: it loses
// the call whose own key it is, and judges again each call that waited
// for it (judge: grant it, or have it read its queue again). h.mu is
// held.
func (h *hub) deletedLocked(key string, rev int64) {
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
	cs := h.watched[key]
	if cs == nil {
		return
	}
	delete(h.watched, key)
	for _, c := range cs {
		w := waiterOf(c)
		if key == c.ID() {
			w.ownWatched = false
			h.k.LoseLocked(c)
			continue
		}
		if i := slices.Index(w.aheadKeys, key); i >= 0 {
			was := w.ready()
			w.aheadKeys = slices.Delete(w.aheadKeys, i, i+1)
			w.weight.sub(w.claim.weigh(key))
			if claimOf(key).turn && w.claim.shared {
				w.turns--
			}
			if !was && w.ready() {
				h.judge(c, w)
			}
		}
	}
}

// A watch that stops delivering. A watch's gRPC stream runs over one of
// the client's connections; if the member behind it stops answering
// without resetting the connection (a host gone from the network, a
// blackholed path), nothing fails and nothing arrives: the Locker would
// never learn of a release again. So the watch loop checks that its watch
// answers while this process has calls queued or held: when the watch has
// been silent for probe (probeBound of the TTL), it asks the server for a
// progress notification (clientv3's RequestProgress: the server answers
// on the same stream with its current revision, etcd's progress notify),
// and if nothing at all arrives within probe of the request, it gives the
// watch up as stalled and starts a new one, as after any other end of the
// watch. Each watch has its own gRPC stream (a metadata pair of its own:
// clientv3 shares one stream between the watches of equal metadata), so
// a new watch opens a new stream, which the client's round-robin balancer
// puts on one of its connections. The new watch is opened twice at once
// (openWatch) and the listing that rebuilds the hub read twice at once
// (list), so that they go out on two connections, the first answer wins,
// and one silent member cannot hold up either; both are given probe, and
// tried again at once if neither answers.
//
// A stalled watch is so noticed within 2.5·probe of its last message
// (the silence, then the unanswered request; the ticker checks every
// probe/4), and replaced within about 2·probe more. Each time the bound
// runs out without an answer it grows by probe for the next try, up to
// backend.CleanupTimeout, so that a slow server that answers, late, is not given
// up on again and again; an answered progress request resets it.

// probeBound is the silence, and the wait for an answer, after which a
// watch is given up, for a Locker of TTL ttl: a tenth of the TTL, at
// least 300 ms and at most 1 s.
func probeBound(ttl time.Duration) time.Duration {
	return min(max(ttl/10, 300*time.Millisecond), time.Second)
}

// errWatchStalled ends a watch that did not answer within its bound.
var errWatchStalled = errors.New("etcdlock: the watch did not answer in time")

// watchSeq numbers watches, to give each its own gRPC stream.
var watchSeq atomic.Uint64

// watchLoop keeps the Locker's watch on its prefix and dispatches
// deletions until h.bg ends. It runs in its own goroutine.
func (h *hub) watchLoop() {
	retry := backend.NewBackoff()
	base := probeBound(h.k.TTL())
	bound := base
	for h.k.Background().Err() == nil {
		h.mu.Lock()
		gate := h.watchGate
		h.watchGate = nil
		h.mu.Unlock()
		if gate != nil {
			select {
			case <-gate:
			case <-h.k.Background().Done():
				return
			}
		}
		parent, cancel := context.WithCancel(h.k.Background())
		h.mu.Lock()
		h.watchCancel = cancel
		h.mu.Unlock()
		ctx, wch, ok := h.openWatch(parent, bound)
		err := parent.Err()
		switch {
		case ok:
			err = h.serveWatch(ctx, wch, retry, &bound, base)
		case err == nil:
			err = errWatchStalled // not created within bound
		}
		cancel()
		if ok {
			for range wch { // drain, so the watcher's goroutines can exit
			}
		}
		h.mu.Lock()
		if h.live {
			h.live = false
			h.ready = make(chan struct{})
		}
		h.mu.Unlock()
		if h.k.Background().Err() != nil {
			return
		}
		stalled := errors.Is(err, errWatchStalled)
		if stalled {
			bound = min(bound+base, backend.CleanupTimeout)
		}
		if err != nil {
			h.k.Logger().Warn("etcdlock: watch ended; restarting it", "locker", h.k.Name(), "prefix", h.root, "error", err)
		} else {
			h.k.Logger().Info("etcdlock: watch closed; restarting it", "locker", h.k.Name(), "prefix", h.root)
		}
		// A watch that did not answer has had its wait: the next goes
		// out at once, on another connection.
		if !stalled && !retry.Wait(h.k.Background()) {
			return
		}
	}
}

// watchHedge is how many watches openWatch starts at once.
const watchHedge = 2

// openWatch starts watchHedge watches of the prefix at once under parent,
// each on a gRPC stream of its own (a metadata pair of its own), and
// returns the first the server creates within bound, and true; it ends
// and drains the others before it returns. Two streams opened together
// go out on two connections of a client that has several (round-robin),
// so one member that does not answer cannot hold up the new watch. It
// returns false if none was created in time or parent ended.
func (h *hub) openWatch(parent context.Context, bound time.Duration) (context.Context, clientv3.WatchChan, bool) {
	type attempt struct {
		i   int
		ctx context.Context
		wch clientv3.WatchChan
	}
	opened := make(chan attempt, watchHedge)
	cancels := make([]context.CancelFunc, watchHedge)
	for i := range watchHedge {
		md := metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(parent),
			"etcdlock-watch", strconv.FormatUint(watchSeq.Add(1), 10))
		ctx, cancel := context.WithCancel(md)
		cancels[i] = cancel
		go func() {
			// Watch returns once the server has created the watch, or
			// at once when ctx ends.
			opened <- attempt{i, ctx, h.client.Watch(ctx, h.root, clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())}
		}()
	}
	endAll := func(except int) {
		for j, c := range cancels {
			if j != except {
				c()
			}
		}
	}
	timer := time.NewTimer(bound)
	defer timer.Stop()
	var win *attempt
	for range watchHedge {
		var a attempt
		select {
		case a = <-opened:
		case <-timer.C:
			endAll(-1)
			a = <-opened
		}
		if win == nil && a.ctx.Err() == nil {
			win = &a
			endAll(a.i)
			continue
		}
		cancels[a.i]()
		for range a.wch {
		}
	}
	if win == nil {
		return nil, nil, false
	}
	// The winner's cancel is parent's: parent ends it.
	return win.ctx, win.wch, true
}

// serveWatch dispatches what the watch wch delivers until it ends, or
// fails to answer within *bound (see above), and returns why: nil if the
// channel closed, else the watch's error or errWatchStalled. An answered
// progress request resets *bound to base.
func (h *hub) serveWatch(ctx context.Context, wch clientv3.WatchChan, retry *backend.Backoff, bound *time.Duration, base time.Duration) error {
	tick := time.NewTicker(*bound / 4)
	defer tick.Stop()
	heard := time.Now()
	asked := heard // the creation is awaited as an answer
	for {
		select {
		case resp, ok := <-wch:
			if !ok {
				return nil
			}
			if !asked.IsZero() && resp.IsProgressNotify() {
				*bound = base
			}
			heard, asked = time.Now(), time.Time{}
			if err := resp.Err(); err != nil {
				return err
			}
			if resp.Created {
				if err := h.goLive(ctx, resp.Header.Revision, bound, base); err != nil {
					return err
				}
				retry.Reset()
				heard = time.Now()
				continue
			}
			h.mu.Lock()
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					h.deletedLocked(string(ev.Kv.Key), ev.Kv.ModRevision)
				}
			}
			h.mu.Unlock()
		case now := <-tick.C:
			switch {
			case !asked.IsZero():
				if now.Sub(asked) >= *bound {
					return errWatchStalled
				}
			case now.Sub(heard) >= *bound && h.busy():
				// The request goes out on the watch's own stream; it
				// only waits for the stream's sender, bounded all the
				// same.
				rctx, cancel := context.WithTimeout(ctx, *bound)
				err := h.client.RequestProgress(rctx)
				cancel()
				if err != nil && ctx.Err() == nil {
					return errWatchStalled
				}
				asked = now
			}
		}
	}
}

// busy reports whether this process has a call queued or held: whether a
// silent watch could be keeping one from its turn or its Lost.
func (h *hub) busy() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	busy := false
	h.k.WrittenLocked(func(*backend.Call) bool {
		busy = true
		return false
	})
	return busy
}

// goLive makes the hub live on a watch created at revision w. The first
// time, nothing was subscribed; later, it rebuilds the subscriptions that
// the ended watch served from a listing of the prefix read after w (see
// list).
func (h *hub) goLive(ctx context.Context, w int64, bound *time.Duration, base time.Duration) error {
	h.mu.Lock()
	first := !h.started
	h.mu.Unlock()
	var kvs []*mvccpb.KeyValue
	if !first {
		// Listed while the watch is not read: no deletion is dispatched
		// before the subscriptions it concerns are rebuilt.
		var err error
		if kvs, err = h.list(ctx, bound, base); err != nil {
			return err
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.started = true
	h.from = w
	clear(h.recent)
	h.order = h.order[:0]
	if !first {
		h.rebuildLocked(kvs)
	}
	h.live = true
	close(h.ready)
	return nil
}

// list reads the keys under the prefix for goLive: watchHedge reads at
// once (on as many of the client's connections), the first answer wins.
// The reads are bounded by *bound, which grows by base after a round
// that ran out of it; it tries three rounds.
func (h *hub) list(ctx context.Context, bound *time.Duration, base time.Duration) ([]*mvccpb.KeyValue, error) {
	type result struct {
		resp *clientv3.GetResponse
		err  error
	}
	var err error
	for range 3 {
		lctx, cancel := context.WithTimeout(ctx, *bound)
		got := make(chan result, watchHedge)
		for range watchHedge {
			go func() {
				resp, err := h.client.Get(lctx, h.root, clientv3.WithPrefix(), clientv3.WithKeysOnly())
				got <- result{resp, err}
			}()
		}
		var kvs []*mvccpb.KeyValue
		ok := false
		for range watchHedge {
			r := <-got
			if r.err == nil && !ok {
				kvs, ok = r.resp.Kvs, true
				cancel() // the other read
			} else if r.err != nil {
				err = r.err
			}
		}
		cancel()
		if ok {
			return kvs, nil
		}
		if ctx.Err() != nil || !errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		*bound = min(*bound+base, backend.CleanupTimeout)
	}
	return nil, err
}

// rebuildLocked resubscribes, from a listing of the prefix, every call
// that was subscribed when the previous watch ended (its own key is
// watched). Calls that subscribe later read etcd themselves: the hub
// refuses them until it is live again. h.mu is held.
func (h *hub) rebuildLocked(kvs []*mvccpb.KeyValue) {
	var subscribed []*backend.Call
	h.k.WrittenLocked(func(c *backend.Call) bool {
		w, ok := c.Data().(*waiter)
		if !ok {
			return true
		}
		if w.ownWatched {
			subscribed = append(subscribed, c)
		}
		w.aheadKeys = w.aheadKeys[:0]
		w.weight = total{}
		w.turns = 0
		w.ownWatched = false
		w.subscribed = false
		return true
	})
	clear(h.watched)
	created := make(map[string]int64, len(kvs))
	for _, kv := range kvs {
		created[string(kv.Key)] = kv.CreateRevision
	}
	// Oldest first, as a read sorted by creation revision returns them
	// (newest first) read backwards: the order waiter.ready walks.
	sorted := slices.Clone(kvs)
	slices.SortFunc(sorted, func(a, b *mvccpb.KeyValue) int { return cmp.Compare(b.CreateRevision, a.CreateRevision) })
	for _, c := range subscribed {
		w := waiterOf(c)
		if created[c.ID()] != int64(c.Token()) {
			h.k.LoseLocked(c)
			continue
		}
		h.watched[c.ID()] = append(h.watched[c.ID()], c)
		w.ownWatched = true
		if c.Held() {
			continue
		}
		r := rangeOf(h.root, c.Key())
		w.ahead = w.ahead[:0]
		for _, kv := range sorted {
			if kv.CreateRevision < int64(c.Token()) && strings.HasPrefix(string(kv.Key), r) {
				w.ahead = append(w.ahead, string(kv.Key))
			}
		}
		w.complete = true
		h.watchAheadLocked(c, w)
		w.subscribed = true
		if w.ready() {
			h.judge(c, w)
		}
	}
}
