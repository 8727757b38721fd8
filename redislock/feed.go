package redislock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/keylock"
	"github.com/redis/go-redis/v9"
)

// Every change of a key's holders (keylock.Follower). Redis keeps no
// history of a sorted set, so the scripts keep one while someone asks
// for it: the key's change log, a stream {E(P)/E(k)}f in the key's hash
// slot, to which every script that can change which entries hold the key
// appends the holders after it, in the same script, so that the log's
// order is the order of the changes and none is left out (scripts.go:
// the enqueue and the release, their fast paths included, the removal
// of a batch, and the check, renewal and listing, which purge dead
// entries, so that a holder whose session expired leaves the log when a
// script purges it, as it leaves the queue). Waits hold nothing and are
// not logged.
//
// The scripts write to the log only while it exists, and only a Follow
// creates it: a key nobody follows pays one EXISTS per script that can
// change its holders. Follow runs followScript, which purges the head of
// the queue as a listing does, creates the log if it is missing (its
// first entry: the holders now), and returns the log's last entry with
// the server's clock: the holders when Follow was called, and where to
// read on from. A goroutine then reads the log from there with XREAD
// BLOCK, on a connection of its own (an XREAD BLOCK holds its
// connection, and go-redis does not end a read when its context ends:
// the feed's end sends CLIENT UNBLOCK for it), and sends one Change per
// entry whose tokens differ from those it sent last. It refreshes the log's expiry every third of the
// TTL (keepScript: PEXPIRE, to twice the TTL, never shortening another
// follower's), so that a log nobody follows any more expires and the
// scripts stop writing it.
//
// A loss is seen, never passed over. Each entry names the entry before
// it (p), and the feed checks that name against the last entry it read:
// an entry trimmed before it was read (a reader more than logLen changes
// behind), a log deleted and created again, or entries lost with a
// failover to a replica that had not received them, each breaks the
// chain. A log that is gone (expired while the follower could not reach
// the server, deleted, lost with a restart) or whose last entry is older
// than the last one read (a failover that lost the newest entries, with
// no change since) is seen by keepScript, every third of the TTL and
// after every error. In every such case the feed runs followScript
// again and sends the holders it returns as a Change with Gap set. This
// is etcd's watch with its compaction error (etcdlock's feed), on a
// stream the scripts write: every change in order while the log is
// kept, an explicit gap where it is not.

// Follow streams key's changes (keylock.Follower): first the key's
// holders as one script finds them, before Follow returns, then one
// Change per change of its holders, in the order the scripts made them,
// every grant, release and purge of a dead holder included; a Change
// with Gap set where the key's change log had lost entries not yet read
// (trimmed behind a reader more than about a thousand changes late,
// deleted, or lost with a restart or a failover), carrying the holders
// read afresh. Each holder is listed as Calls lists it (label, process,
// mode or units, token, and an age on the server's clock, at the change);
// At is when this process received the change. Waits, which hold
// nothing, are not among the holders. The channel closes when ctx ends
// or Close begins; a reader must keep receiving until then (unread
// changes wait in the log meanwhile, up to about a thousand).
//
// Follow fails with a *fairlock.LockError naming the key: wrapping the
// context's error, fairlock.ErrClosed once Close has begun, or Redis's
// error if the first script fails. It starts one goroutine, which Close
// waits for, and takes one connection from the client's pool (from the
// pool of the master that holds the key's slot, on a Cluster) for as long
// as the channel is open: a blocking read holds its connection. (A
// client that is neither a *redis.Client nor a *redis.ClusterClient, or
// a server whose ACL refuses the CLIENT command, gets reads of a second
// at most on the client's pool instead, and a channel that closes within
// one of them.) While the server cannot be reached the stream is
// silent, and it goes on from where it was once it can, or with a gap.
// While a key is followed, every script that can change its holders also
// compares them with the log's last entry and appends them if they
// changed: a few more commands, in the same round trip.
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

// followScript opens a key's change log for a Follow. KEYS: the queue.
// ARGV: marker prefix, channel, the log's expiry in ms. It purges the
// head of the queue as checkScript does (and logs what that changes),
// creates the log with the holders now if it is missing, sets its
// expiry (only lengthening it if the log existed: another follower may
// need longer), and returns the server's clock (seconds, microseconds),
// the log's last entry's ID and that entry's fields, in order: the
// holders now, since the script has just logged them.
var followScript = redis.NewScript(prelude + `
local before = walk(false)
local hb = head()
local after = walk(true)
notify(before, after, hb)
local existed = redis.call('EXISTS', flog) == 1
record(after, true)
if existed then
  redis.call('PEXPIRE', flog, ARGV[3], 'GT')
else
  redis.call('PEXPIRE', flog, ARGV[3])
end
local t = redis.call('TIME')
local last = redis.call('XREVRANGE', flog, '+', '-', 'COUNT', 1)[1]
local res = {t[1], t[2], last[1]}
for _, v in ipairs(last[2]) do res[#res + 1] = v end
return res
`)

// keepScript keeps a change log alive. KEYS: the log. ARGV: its expiry
// in ms. It lengthens the log's expiry to that (never shortens it), and
// returns the ID of its last entry; "" if it has none, nil if the log is
// gone.
var keepScript = redis.NewScript(`
if redis.call('PEXPIRE', KEYS[1], ARGV[1], 'GT') == 0 and redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)[1]
if last then return last[1] end
return ''
`)

// feedBatch is how many entries of the log one XREAD returns at most.
const feedBatch = 128

// feed is one Follow: where it has read the key's change log up to, the
// tokens of the holders it sent last, and the connection it blocks on.
type feed struct {
	e      *engine
	key    string
	n      names
	log    string        // the key's change log
	expiry string        // the log's expiry, ms: twice the TTL
	period time.Duration // how often the log's expiry is renewed: a third of the TTL
	ch     chan<- keylock.Change
	last   string    // the ID of the last entry read
	lastID streamID  // last, parsed
	tokens []uint64  // the holders' tokens in the last Change sent
	kept   time.Time // when keepScript last ran, or followScript
	lost   bool      // keepScript found entries not yet read gone
	pooled bool      // the server refused CLIENT ID: XREAD on the client's pool

	mu   sync.Mutex    // guards srv, conn and id
	srv  *redis.Client // the server conn is on, nil for none
	conn *redis.Conn   // the connection the XREAD blocks on
	id   int64         // conn's client id, for CLIENT UNBLOCK
}

// follow implements Follow for a Locker or Semaphore on e: the kit runs
// the feed's life (backend.Core.Follow) around followScript's read of
// the key's holders and the reads of its change log from there.
func (e *engine) follow(ctx context.Context, key string) (<-chan keylock.Change, error) {
	return e.k.Follow(ctx, key, func(fctx context.Context, ch chan<- keylock.Change) (func(), error) {
		ttl := e.k.TTL()
		n := namesOf(e.esc, key)
		f := &feed{
			e: e, key: key, n: n, ch: ch,
			log:    strings.TrimSuffix(n.queue, "q") + "f",
			expiry: strconv.FormatInt((2 * ttl).Milliseconds(), 10),
			period: max(ttl/3, time.Millisecond),
		}
		first, err := f.open(fctx, false)
		if err != nil {
			return nil, err
		}
		return func() { f.run(fctx, first) }, nil
	})
}

// open runs followScript: it returns the key's holders as a Change with
// gap, and reads on from the log's last entry.
func (f *feed) open(ctx context.Context, gap bool) (keylock.Change, error) {
	v, err := followScript.Run(ctx, f.e.client, []string{f.n.queue}, f.n.markers, f.e.channel, f.expiry).StringSlice()
	if err != nil {
		return keylock.Change{}, err
	}
	if len(v) < 3 || (len(v)-3)%2 != 0 {
		return keylock.Change{}, fmt.Errorf("redislock: unexpected reply of %d strings from the follow script", len(v))
	}
	sec, err1 := strconv.ParseInt(v[0], 10, 64)
	usec, err2 := strconv.ParseInt(v[1], 10, 64)
	id, ok := parseStreamID(v[2])
	if err1 != nil || err2 != nil || !ok {
		return keylock.Change{}, fmt.Errorf("redislock: unexpected reply %q from the follow script", v[:3])
	}
	fields := make(map[string]any, (len(v)-3)/2)
	for i := 3; i < len(v); i += 2 {
		fields[v[i]] = v[i+1]
	}
	holders, tokens, err := decodeHolders(fields, sec*1_000_000+usec)
	if err != nil {
		return keylock.Change{}, err
	}
	f.last, f.lastID, f.tokens, f.kept, f.lost = v[2], id, tokens, time.Now(), false
	return keylock.Change{Holders: holders, At: time.Now(), Gap: gap}, nil
}

// run sends first, then the changes the log records, until ctx ends.
func (f *feed) run(ctx context.Context, first keylock.Change) {
	done := make(chan struct{})
	unblocked := make(chan struct{})
	stopUnblock := context.AfterFunc(ctx, func() {
		defer close(unblocked)
		f.unblock(done)
	})
	defer func() {
		close(done)
		if !stopUnblock() {
			<-unblocked
		}
		f.drop()
	}()
	if !f.send(ctx, first) {
		return
	}
	retry := backend.NewBackoff()
	for ctx.Err() == nil {
		if !f.lost && time.Since(f.kept) >= f.period {
			if err := f.keep(ctx); err != nil {
				if !retry.Wait(ctx) {
					return
				}
				continue
			}
		}
		if f.lost {
			c, err := f.open(ctx, true)
			if err != nil {
				if !retry.Wait(ctx) {
					return
				}
				continue
			}
			retry.Reset()
			if !f.send(ctx, c) {
				return
			}
			continue
		}
		msgs, err := f.read(ctx)
		switch {
		case errors.Is(err, redis.Nil):
			continue // the block's time ran out, or Close's CLIENT UNBLOCK
		case err != nil:
			// A broken connection, a failover, a Cluster's MOVED: read
			// again on a new connection, once keepScript has said
			// whether the log is still whole.
			f.drop()
			f.kept = time.Time{}
			if !retry.Wait(ctx) {
				return
			}
			continue
		}
		retry.Reset()
		for _, m := range msgs {
			if p, _ := m.Values["p"].(string); p != f.last {
				f.lost = true // entries between f.last and m are gone
				break
			}
			id, ok := parseStreamID(m.ID)
			if !ok {
				f.lost = true
				break
			}
			f.last, f.lastID = m.ID, id
			holders, tokens, err := decodeHolders(m.Values, int64(id.ms)*1000)
			if err != nil {
				f.lost = true
				break
			}
			if slices.Equal(tokens, f.tokens) {
				continue
			}
			f.tokens = tokens
			if !f.send(ctx, keylock.Change{Holders: holders, At: time.Now()}) {
				return
			}
		}
	}
}

// keep runs keepScript: it lengthens the log's expiry, and sets f.lost
// if the log is gone or has lost entries not yet read (its last entry is
// older than the last one read, or it has none).
func (f *feed) keep(ctx context.Context) error {
	last, err := keepScript.Run(ctx, f.e.client, []string{f.log}, f.expiry).Text()
	switch {
	case errors.Is(err, redis.Nil):
		f.lost = true
	case err != nil:
		return err
	default:
		id, ok := parseStreamID(last)
		f.lost = f.lost || !ok || id.less(f.lastID)
	}
	f.kept = time.Now()
	return nil
}

// send sends c, renewing the log's expiry meanwhile every period (a
// reader that is slow to receive does not let the log expire); it
// reports false if ctx ended first.
func (f *feed) send(ctx context.Context, c keylock.Change) bool {
	for {
		t := time.NewTimer(max(time.Until(f.kept.Add(f.period)), 0))
		select {
		case f.ch <- c:
			t.Stop()
			return true
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
			if f.keep(ctx) != nil {
				f.kept = time.Now() // tried: again in a period
			}
		}
	}
}

// read reads the log after f.last: one XREAD BLOCK of up to a period,
// on the feed's own connection. It returns redis.Nil if no entry came.
func (f *feed) read(ctx context.Context) ([]redis.XMessage, error) {
	c, block, err := f.reader(ctx)
	if err != nil {
		return nil, err
	}
	streams, err := c.XRead(ctx, &redis.XReadArgs{Streams: []string{f.log, f.last}, Count: feedBatch, Block: block}).Result()
	if err != nil {
		return nil, err
	}
	var msgs []redis.XMessage
	for _, s := range streams {
		msgs = append(msgs, s.Messages...)
	}
	return msgs, nil
}

// reader returns what the XREAD runs on and how long it may block: a
// connection of its own, taken from the pool of the server that holds
// the key's slot, whose client id it reads (one round trip) so that
// Close can end the XREAD at once (CLIENT UNBLOCK), blocking a period;
// or, on a client of another kind (a Ring) or a server that refuses
// CLIENT ID (an ACL), the client itself, blocking a second at most, so
// that a feed notices within it that ctx ended.
func (f *feed) reader(ctx context.Context) (redis.Cmdable, time.Duration, error) {
	f.mu.Lock()
	conn := f.conn
	f.mu.Unlock()
	if conn != nil {
		return conn, f.period, nil
	}
	var srv *redis.Client
	switch c := f.e.client.(type) {
	case *redis.Client:
		srv = c
	case *redis.ClusterClient:
		m, err := c.MasterForKey(ctx, f.log)
		if err != nil {
			return nil, 0, err
		}
		srv = m
	}
	if srv == nil || f.pooled {
		return f.e.client, min(f.period, time.Second), nil
	}
	conn = srv.Conn()
	id, err := conn.ClientID(ctx).Result()
	if err != nil {
		conn.Close()
		var refused redis.Error
		if errors.As(err, &refused) {
			f.pooled = true
			return f.e.client, min(f.period, time.Second), nil
		}
		return nil, 0, err
	}
	f.mu.Lock()
	f.srv, f.conn, f.id = srv, conn, id
	f.mu.Unlock()
	return conn, f.period, nil
}

// drop closes the feed's connection, if it has one (returning it to its
// pool, or discarding it if it broke).
func (f *feed) drop() {
	f.mu.Lock()
	conn := f.conn
	f.srv, f.conn, f.id = nil, nil, 0
	f.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
}

// unblock ends the feed's XREAD, once ctx ended, by CLIENT UNBLOCK on
// another connection, until done is closed. The XREAD may reach the
// server after the first CLIENT UNBLOCK does (they travel on two
// connections), so it is sent again, at doubling intervals up to a
// period, until the feed returns.
func (f *feed) unblock(done <-chan struct{}) {
	for d := time.Millisecond; ; d = min(2*d, f.period) {
		f.mu.Lock()
		srv, id := f.srv, f.id
		f.mu.Unlock()
		if srv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			srv.ClientUnblock(ctx, id)
			cancel()
		}
		t := time.NewTimer(d)
		select {
		case <-done:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// decodeHolders reads the holders of a log entry (its fields t and h,
// scripts.go), with ages counted up to now (µs on the server's clock),
// and their tokens.
func decodeHolders(fields map[string]any, now int64) ([]keylock.CallInfo, []uint64, error) {
	t, _ := fields["t"].(string)
	h, _ := fields["h"].(string)
	toks := strings.Fields(t)
	if len(toks) == 0 {
		return nil, nil, nil
	}
	holders := make([]keylock.CallInfo, 0, len(toks))
	tokens := make([]uint64, 0, len(toks))
	for _, ts := range toks {
		token, err := strconv.ParseUint(ts, 10, 64)
		if err != nil {
			return nil, nil, fmt.Errorf("redislock: a change log entry's token %q", ts)
		}
		var s [3]string // entry, process, label
		for i := range s {
			var ok bool
			if s[i], h, ok = netstring(h); !ok {
				return nil, nil, errors.New("redislock: a change log entry's holders cannot be read")
			}
		}
		mode, units := modeOf(s[0])
		c := keylock.CallInfo{Label: s[2], Process: parseProc(s[1]), Mode: mode, Units: units, Held: true, Token: token}
		if d := now - int64(token); d > 0 {
			c.Age = time.Duration(d) * time.Microsecond
		}
		holders = append(holders, c)
		tokens = append(tokens, token)
	}
	return holders, tokens, nil
}

// netstring reads the netstring ("5:hello") at the start of s, and
// returns it and the rest of s.
func netstring(s string) (v, rest string, ok bool) {
	num, rest, found := strings.Cut(s, ":")
	n, err := strconv.Atoi(num)
	if !found || err != nil || n < 0 || n > len(rest) {
		return "", s, false
	}
	return rest[:n], rest[n:], true
}

// streamID is a stream entry's ID, "ms-seq".
type streamID struct{ ms, seq uint64 }

// parseStreamID reads an entry's ID.
func parseStreamID(s string) (streamID, bool) {
	a, b, found := strings.Cut(s, "-")
	ms, err1 := strconv.ParseUint(a, 10, 64)
	seq, err2 := strconv.ParseUint(b, 10, 64)
	return streamID{ms, seq}, found && err1 == nil && err2 == nil
}

// less reports whether id comes before o in a stream.
func (id streamID) less(o streamID) bool {
	return id.ms < o.ms || (id.ms == o.ms && id.seq < o.seq)
}
