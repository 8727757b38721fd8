package redislock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/redis/go-redis/v9"
)

// Sessions. A Locker's session on a key is the marker {…}s:<sid> (keys.go),
// set with the TTL by each enqueue and renewed with PEXPIRE every third of
// the TTL while the Locker has calls on the key; Redis's clock alone
// decides when it expires. The kit (package backend) keeps one session per
// key, its deadline, and the renewal loop; Renew below is one round: the
// renewal script on every key due, pipelined per server (a Redis Cluster
// master, or the one server), the servers concurrently, so that a server
// that does not answer costs the renewals of its own keys only. The
// renewal reports the entries that are gone (removed by someone else, or
// purged after the session expired): their grants are lost and their
// queued calls queue again.
//
// The renewal also removes the session's entries that hold the key but
// that no call of the Locker knows any more (a restore or a failover
// brought them back: stale.go).
//
// Check re-reads, every third of the TTL, the queue of every key on which
// this Locker has a waiting call (the check script, which also purges the
// dead entries at its head): this is how a waiter learns that a holder
// died, and what covers a lost notice.

// renewal is one key's part of a renewal round.
type renewal struct {
	s       *backend.Session
	key     string
	members []string // the session's entries the Locker believes present
	cutoff  uint64   // the highest entry number it may remove unlisted (stale.go)
	cmd     *redis.Cmd
}

// Renew renews the sessions ss: one pipeline per server, concurrently,
// each bounded by ctx; a server that has not answered when ctx ends
// leaves its sessions out of the result (failed).
func (e *engine) Renew(ctx context.Context, ss []*backend.Session, _ int) []backend.Renewal {
	jobs := make(map[*backend.Session]*renewal, len(ss))
	byKey := make(map[string]*renewal, len(ss))
	mu := e.k.Mu()
	mu.Lock()
	cut := e.seq.Load()
	for _, s := range ss {
		j := &renewal{s: s, key: s.ID(), cutoff: cut}
		jobs[s], byKey[j.key] = j, j
	}
	e.k.WrittenLocked(func(c *backend.Call) bool {
		switch {
		case c.Confirmed():
			if j := jobs[c.Session()]; j != nil {
				j.members = append(j.members, c.ID())
			}
		case c.InFlight():
			if j := byKey[c.Key()]; j != nil {
				j.cutoff = inFlight(j.cutoff, c.ID())
			}
		}
		return true
	})
	mu.Unlock()
	groups := make(map[redis.Cmdable][]*renewal)
	var out []backend.Renewal
	for _, j := range jobs {
		if len(j.members) == 0 {
			continue // every call on it left since the round began
		}
		srv, err := e.serverOf(ctx, j.key)
		if err != nil {
			out = append(out, backend.Renewal{Session: j.s, Err: err})
			continue
		}
		groups[srv] = append(groups[srv], j)
	}
	results := make(chan []backend.Renewal, len(groups))
	for srv, js := range groups {
		e.stray.Add(1)
		go func() {
			defer e.stray.Done()
			results <- e.renewOn(ctx, srv, js)
		}()
	}
	for range groups {
		select {
		case rs := <-results:
			out = append(out, rs...)
		case <-ctx.Done():
			return out
		}
	}
	return out
}

// renewOn runs the renewal script of every job in one pipeline on srv,
// loading the script once if the server lacks it (a restart, SCRIPT
// FLUSH), and reports each job's outcome.
func (e *engine) renewOn(ctx context.Context, srv redis.Cmdable, js []*renewal) []backend.Renewal {
	// Each job's command holds its own outcome (its error included); the
	// pipeline's error only says whether the script must be loaded.
	sent, err := e.pipeRenew(ctx, srv, js)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") && renewScript.Load(ctx, srv).Err() == nil {
		sent, _ = e.pipeRenew(ctx, srv, js)
	}
	out := make([]backend.Renewal, 0, len(js))
	for _, j := range js {
		r := backend.Renewal{Session: j.s, Sent: sent}
		v, cerr := j.cmd.Slice()
		switch {
		case cerr != nil:
			r.Err = cerr
		case len(v) > 0 && v[0] == int64(-1):
			// The marker had expired: every entry of the session on the
			// key is dead, and it is not brought back.
			r.Lapsed, r.Gone = true, j.members
		default:
			// The Waits below the bound had their turn: their entries
			// went with it (scripts.go), so they are ended before their
			// absence could count as a loss.
			if len(v) > 1 {
				if b, _ := v[1].(int64); b > 0 {
					e.k.GrantTurns(j.key, uint64(b))
				}
			}
			for _, m := range v[min(2, len(v)):] {
				if s, ok := m.(string); ok {
					r.Gone = append(r.Gone, s)
				}
			}
		}
		out = append(out, r)
	}
	return out
}

// pipeRenew sends the renewal scripts of js in one pipeline and returns
// when it was sent; each job's cmd holds its reply.
func (e *engine) pipeRenew(ctx context.Context, srv redis.Cmdable, js []*renewal) (sent time.Time, err error) {
	p := srv.Pipeline()
	for _, j := range js {
		n := namesOf(e.esc, j.key)
		j.cmd = renewScript.EvalSha(ctx, p, []string{n.queue, n.markers + e.sid}, e.renewArgs(n, j.cutoff, j.members)...)
	}
	var wait *redis.Cmd
	if e.replicas.n > 0 {
		wait = p.Do(ctx, "WAIT", e.replicas.n, e.replicas.timeout.Milliseconds())
	}
	sent = time.Now()
	_, err = p.Exec(ctx)
	if errors.Is(err, redis.Nil) {
		err = nil
	}
	if wait != nil && err == nil {
		if acks, werr := wait.Int64(); werr != nil || acks < int64(e.replicas.n) {
			// Not acknowledged: the renewals do not count (the kit keeps
			// the old deadlines), as if they had failed.
			failed := fmt.Errorf("%w: a renewal reached %d of %d replicas within %v", ErrNotReplicated, acks, e.replicas.n, e.replicas.timeout)
			for _, j := range js {
				j.cmd.SetErr(failed)
			}
		}
	}
	return sent, err
}

// Check re-reads the queues of the waiting calls: it grants the entries
// the check script finds holding the key and the Waits below its bound
// (a notice may have been lost), and loses a call whose entry is gone
// (but a Wait below the bound, whose turn came whatever became of its
// entry).
func (e *engine) Check(ctx context.Context, waiting []*backend.Call) {
	type todo struct{ key, member string }
	list := make([]todo, 0, len(waiting))
	mu := e.k.Mu()
	mu.Lock()
	for _, c := range waiting {
		list = append(list, todo{c.Key(), c.ID()})
	}
	mu.Unlock()
	for _, td := range list {
		present, _, bound, holders, err := e.check(ctx, td.key, td.member)
		if err != nil {
			if e.k.Background().Err() == nil {
				e.k.Logger().Warn("redislock: reading a queue failed; retrying", "locker", e.k.Name(), "key", backend.LogKey(td.key), "error", err)
			}
			continue
		}
		e.k.Granted(holders...)
		if bound > 0 {
			e.k.GrantTurns(td.key, bound)
		}
		if !present {
			e.k.Lose(td.member)
		}
	}
}

// renewArgs returns the renewal script's arguments (renewScript) for a
// key whose names are n: the cutoff, then the entries the Locker knows.
func (e *engine) renewArgs(n names, cutoff uint64, members []string) []any {
	args := make([]any, 0, 4+len(members))
	args = append(args, n.markers, e.channel, e.ttlMs, strconv.FormatUint(cutoff, 10))
	for _, m := range members {
		args = append(args, m)
	}
	return args
}
