package redislock

import (
	"context"
	"errors"
	"net"

	"github.com/redis/go-redis/v9"
)

// The server side. Every change to a key's queue is one Lua script, so it
// is atomic on the server (a script runs with nothing interleaved: "Atomicity
// of scripts", redis.io/docs/latest/develop/interact/programmability/eval-intro).
// redis.NewScript loads each one lazily: Script.Run sends EVALSHA and
// falls back to EVAL on NOSCRIPT, so a restarted server or a SCRIPT FLUSH
// costs one EVAL, not an error.
//
// A key's queue is a sorted set of entries, one per call but Waits (see
// keys.go for the names), scored by the call's fencing token, which the
// enqueue takes above every score queued, so its order is arrival order.
// An entry is "sid|seq|mode|w|n": the session of the Locker that made it,
// that Locker's call number, the mode (x exclusive, r shared, u units of
// a semaphore, w a Wait), the units asked (w) and the semaphore's size
// (n). Whether an entry holds the key is not stored: it follows from the
// entries ahead of it (walk below), so a grant is never a separate write
// that could be lost.
//
// Waits are kept apart, in the key's set of Waits, scored by their tokens
// as the queue is. A Wait is a zero-length exclusive turn: its turn has
// come once no entry of the queue is ahead of it (its token is below the
// queue's first score, or the queue is empty), and from then on it is
// transparent; until then it keeps the entries behind it from being
// granted beside the queue's head (walk stops at the first Wait behind
// the head). So whether a Wait's turn has come is one comparison with a
// bound, the queue's first score, and a release that frees any number of
// Waits walks none of them and announces them all with that bound: every
// Wait of the key with a token below it (notify). Keeping them in the
// queue instead would make every release walk, and name, each Wait
// behind it.
//
// What a listing in another process shows (list.go) is kept beside the
// queue: a session's marker holds its Locker's process (host, pid and
// name), and a labelled call's label is a field of the key's label hash,
// named by the entry, written by the enqueue only for a call that has a
// label. Every script that removes an entry removes its label with it
// (unlist), so the hash empties, and Redis deletes it, as the queue does.
//
// An entry lives while its session's marker on the key exists. A script
// that walks the head of a queue removes the entries of sessions whose
// marker expired (purge), so a dead process's entries go the first time
// anyone looks at them, all at once: each costs no more than its session's
// TTL, and dead entries do not add up (Redisson's fair lock instead waits
// out one timeout per dead waiter, redisson/redisson#1353). A Wait,
// live or dead, goes when its turn comes (notify removes every Wait below
// the bound it announces, and the queue's last release the whole set), or
// when its Locker removes it (a cancelled Wait); a dead session's Wait
// before then only when its Locker's process comes back (the enqueue
// that sets the marker again). The set of Waits is empty whenever the
// queue is, but for one case: the queue itself evicted (an allkeys
// memory policy) or lost in a restore, which leaves Waits no script
// removes until the key's queue empties again; the re-read still grants
// them (its bound is one above the last Wait's).
//
// Every script that can change which entries hold the key publishes the
// entries it newly granted on the Locker prefix's channel, and, when the
// queue's head moved past Waits, the bound below which every Wait's turn
// has come; the waiters' Lockers dispatch them to their calls (hub.go).
//
// Every script that can change which entries hold the key also writes the
// holders after it to the key's change log, a stream beside the queue,
// if the log exists: a Follow (feed.go) creates it and keeps it alive,
// so a key nobody follows pays one EXISTS per script that can change its
// holders, and nothing more. An entry of the log is three fields: p, the
// ID of the entry before it ("0-0" for none), so that a reader who finds
// an entry whose p is not the last it read knows it missed some; t, the
// holders' tokens, space-separated, in grant order ("" for a vacancy);
// and h, each holder's entry, process (its marker's value) and label, as
// netstrings ("5:hello"), in the same order. Scripts that walk the queue
// log through record, which compares the tokens with the last entry's
// and appends only if they differ, so that the log follows the holders
// however they changed (a purge included, and a set of Waits that
// expired while no script ran); the two fast paths, which grant a free
// key and release its only entry, append their one change directly. The
// log is trimmed to about logLen entries (XADD MAXLEN ~).

// logLen is about how many entries a key's change log keeps (XADD's
// MAXLEN ~, which trims whole nodes of the stream, so a few more may
// stay): a Follow that falls further behind finds the oldest it had not
// read gone, and reports a gap (feed.go).
const logLen = "1000"

// prelude is shared by the scripts that walk a queue. KEYS[1] is the
// queue; ARGV[1] the prefix of the key's session markers, ARGV[2] the
// channel. The names of the key's label hash and set of Waits are the
// queue's with its last letter changed (keys.go): in the same hash slot,
// as the markers are.
const prelude = `
local q = KEYS[1]
local mpre = ARGV[1]
local chan = ARGV[2]
local tag = string.sub(q, 1, -2)
local lkey = tag .. 'l'
local wq = tag .. 'w'
-- isWait reports whether m is a Wait's entry ("sid|seq|w|1|n"; the seq
-- field, in base 36, may be "w" too).
local function isWait(m)
  return string.match(m, '^[^|]+|[^|]+|(%a)|') == 'w'
end
-- unlist removes entry m from the queue, or from the Waits, and its label.
local function unlist(m)
  if isWait(m) then redis.call('ZREM', wq, m) else redis.call('ZREM', q, m) end
  redis.call('HDEL', lkey, m)
end
local alive = {}
local function live(sid)
  local a = alive[sid]
  if a == nil then
    a = redis.call('EXISTS', mpre .. sid) == 1
    alive[sid] = a
  end
  return a
end
local function parse(m)
  local sid, mode, w, n = string.match(m, '^([^|]+)|[^|]+|(%a)|(%d+)|(%d+)$')
  return sid, mode, tonumber(w), tonumber(n)
end
-- fits: can an entry be granted behind cnt granted entries, which are all
-- shared (shared), all units summing to sum (units)?
local function fits(cnt, shared, units, sum, mode, w, n)
  if cnt == 0 then return true end
  if mode == 'r' then return shared end
  if mode == 'u' then return units and sum + w <= n end
  return false
end
-- head returns the queue's first score, or nil if it is empty.
local function head()
  local h = redis.call('ZRANGE', q, 0, 0, 'WITHSCORES')
  return h[2] and tonumber(h[2])
end
-- walk returns the entries that hold the key (a prefix of the queue:
-- head-of-line) and the prefix's state, and the score of the first Wait
-- behind the queue's head (nil for none), which no entry behind it
-- passes: it is granted beside the head only if ahead of that Wait.
-- With purge it removes the entries of expired sessions that it meets,
-- the first blocked entry included.
local function walk(purge)
  local granted = {}
  local cnt, shared, units, sum = 0, true, true, 0
  local bar = nil
  local i = 0
  while true do
    local batch = redis.call('ZRANGE', q, i, i + 63, 'WITHSCORES')
    if #batch == 0 then break end
    local stop = false
    for j = 1, #batch, 2 do
      local m = batch[j]
      local sid, mode, w, n = parse(m)
      if purge and not live(sid) then
        unlist(m)
      elseif cnt == 0 or ((bar == nil or tonumber(batch[j + 1]) < bar) and fits(cnt, shared, units, sum, mode, w, n)) then
        if cnt == 0 then
          local f = redis.call('ZRANGEBYSCORE', wq, '(' .. batch[j + 1], '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
          bar = f[2] and tonumber(f[2])
        end
        granted[#granted + 1] = m
        cnt = cnt + 1
        shared = shared and mode == 'r'
        units = units and mode == 'u'
        sum = sum + w
        i = i + 1
      else
        stop = true
        break
      end
    end
    if stop then break end
  end
  return granted, cnt, shared, units, sum, bar
end
-- bound returns the Waits' bound: every Wait with a token below it has
-- had its turn. It is the queue's first score, or, with the queue
-- empty, one above the last Wait's, or, with no Wait either, one above
-- the key's counter (every token handed out: a Wait whose entry the
-- release that announced its turn removed, and whose notice its Locker
-- has not read yet, is covered); nil if the counter is gone too. Call it
-- after a purging walk, so that the queue's head is live.
local function bound()
  local b = head()
  if b then return b end
  local t = redis.call('ZRANGE', wq, -1, -1, 'WITHSCORES')
  if t[2] then return tonumber(t[2]) + 1 end
  local n = tonumber(redis.call('GET', tag .. 'n'))
  return n and n + 1
end
local function fmt(x) return string.format('%.0f', x) end
-- dropWaits removes the Waits with a token below b, and their labels:
-- their turn has come, and their Lockers learn it from the bound, not
-- from their entries. ZREMRANGEBYSCORE does it without a walk in Lua;
-- the labels, only if any call on the key has one, take one
-- ZRANGEBYSCORE and HDELs of up to 1000 names each.
local function dropWaits(b)
  local lim = '(' .. fmt(b)
  if redis.call('EXISTS', lkey) == 1 then
    local ms = redis.call('ZRANGEBYSCORE', wq, '-inf', lim)
    for i = 1, #ms, 1000 do
      redis.call('HDEL', lkey, unpack(ms, i, math.min(i + 999, #ms)))
    end
  end
  redis.call('ZREMRANGEBYSCORE', wq, '-inf', lim)
end
-- notify publishes the entries of after that were not in before, and,
-- if the queue's head has moved past Waits since its score was hb (nil:
-- the queue was empty, and no Wait waited), the Waits' bound, as
-- "@bound tag" (tag: the queue's name less its last letter, from which
-- a Locker reads the key), having removed the Waits below it. It returns
-- the entries it published, and the bound it published (nil for none).
local function notify(before, after, hb)
  local was = {}
  for _, m in ipairs(before) do was[m] = true end
  local news = {}
  for _, m in ipairs(after) do
    if not was[m] then news[#news + 1] = m end
  end
  if #news > 0 then redis.call('PUBLISH', chan, table.concat(news, ' ')) end
  if hb and redis.call('EXISTS', wq) == 1 then
    local b = bound()
    if b > hb and redis.call('ZCOUNT', wq, fmt(hb), '(' .. fmt(b)) > 0 then
      dropWaits(b)
      redis.call('PUBLISH', chan, '@' .. fmt(b) .. ' ' .. tag)
      return news, b
    end
  end
  return news, nil
end
-- The key's change log (feed.go): ns is a netstring of s; record appends
-- the holders after (walk's granted entries) to the log if it exists
-- (or, with create, in any case) and its last entry lists other tokens.
local flog = tag .. 'f'
local function ns(s) return #s .. ':' .. s end
local function record(after, create)
  if not create and redis.call('EXISTS', flog) == 0 then return end
  local toks = {}
  for i, m in ipairs(after) do toks[i] = fmt(tonumber(redis.call('ZSCORE', q, m))) end
  local t = table.concat(toks, ' ')
  local p = '0-0'
  local last = redis.call('XREVRANGE', flog, '+', '-', 'COUNT', 1)[1]
  if last then
    p = last[1]
    local fs = last[2]
    for i = 1, #fs, 2 do
      if fs[i] == 't' then
        if fs[i + 1] == t then return end
        break
      end
    end
  end
  local h = {}
  for _, m in ipairs(after) do
    h[#h + 1] = ns(m) .. ns(redis.call('GET', mpre .. parse(m)) or '') .. ns(redis.call('HGET', lkey, m) or '')
  end
  redis.call('XADD', flog, 'MAXLEN', '~', ` + logLen + `, '*', 'p', p, 't', t, 'h', table.concat(h))
end
`

// enqueueScript queues a call. KEYS: queue, counter, this session's
// marker. ARGV: marker prefix, channel, entry, TTL in ms, kind ("l" queue,
// "t" only if granted at once, "w" a Wait: nothing if its turn would come
// at once), the Locker's process (the marker's value), the call's label
// ("" for none). It returns {1, token, granted (0/1)}; {0} for a Try that
// would wait; {2} for a Wait whose turn would come at once (an empty queue, or
// one of Waits whose turn has come); {-1, n} when the queue holds a
// semaphore entry of another size n. It is idempotent per entry: go-redis
// sends a script again when its reply is lost (EOF, a read timeout), and a
// run that finds its entry already queued reports it as the first run did.
//
// The token. A call's token is the largest of: the key's counter plus
// one, the largest score in the queue plus one, and the server's clock in
// microseconds (TIME); the counter is then set to it, with an expiry of
// ten TTLs that each enqueue pushes back. The counter alone is not enough:
// a server restarted from an RDB snapshot or from an append-only file
// that lost its last second, or a replica promoted before it received
// the latest scripts, has an older counter, and counting on from it would
// hand out again tokens that were handed out before. The clock is the
// floor that makes tokens keep growing across any such restore while the
// server's clock goes forward: each token handed out was its server's
// clock when the script ran, or the token before it plus one where two
// calls on the key met within a microsecond (an enqueue runs for longer
// than that, so a token leads the clock by a microsecond or so at most),
// and the server that comes back reads a later clock. After a failover,
// the new primary's clock must not be behind the old one's by more than
// the time between the two grants. The counter keeps tokens strictly increasing
// when the clock does not move between two calls or steps back, while
// it lives; the queue's largest score keeps a new entry behind every
// queued one even when the counter has expired or was lost, so that the
// order of the queue is always the order of arrival. A counter that
// expired with an idle key (keys.go) comes back from the clock, above
// its old tokens unless the clock stepped back by more than the ten TTLs
// the key was idle.
//
// The arithmetic is exact: Lua's numbers are doubles, exact for integers
// below 2^53, and 2^53 µs is about 9.0e9 s after 1970, in the year 2255;
// TIME's seconds times 10^6 is an integer product below that, tonumber
// reads the counter's and the scores' decimal strings exactly, '%.0f'
// writes an integral double exactly, and a sorted set's score is a
// double too. The reply's token is converted to a Redis integer exactly.
var enqueueScript = redis.NewScript(`
local member, ttl, kind, proc, label = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
-- The token: above the key's counter, above every entry and Wait queued
-- (top, the highest score), and not below the server's clock in
-- microseconds (see the comment above).
local function nextToken(top)
  local t = redis.call('TIME')
  local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local last = tonumber(redis.call('GET', KEYS[2]))
  if last and last >= token then token = last + 1 end
  if top and top >= token then token = top + 1 end
  local tok = string.format('%.0f', token)
  redis.call('SET', KEYS[2], tok, 'PX', string.format('%.0f', ttl * 10))
  return token, tok
end
-- topOf returns the highest score of the sorted set z, or nil.
local function topOf(z)
  local t = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  return t[2] and tonumber(t[2])
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  -- A free key: nothing to walk, purge or announce (so this comes before
  -- the prelude's functions are even made). The call is granted at once
  -- (a Wait's turn has come: nothing is written), with a token above the
  -- Waits that are left, whose turns have come.
  if kind == 'w' then return {2} end
  redis.call('SET', KEYS[3], proc, 'PX', ttl)
  local token, tok = nextToken(topOf(string.sub(KEYS[1], 1, -2) .. 'w'))
  redis.call('ZADD', KEYS[1], tok, member)
  if label ~= '' then redis.call('HSET', string.sub(KEYS[1], 1, -2) .. 'l', member, label) end
  local f = string.sub(KEYS[1], 1, -2) .. 'f'
  if redis.call('EXISTS', f) == 1 then
    -- The key's change log: this call is its one holder.
    local last = redis.call('XREVRANGE', f, '+', '-', 'COUNT', 1)[1]
    redis.call('XADD', f, 'MAXLEN', '~', ` + logLen + `, '*', 'p', last and last[1] or '0-0', 't', tok,
      'h', #member .. ':' .. member .. #proc .. ':' .. proc .. #label .. ':' .. label)
  end
  return {1, token, 1}
end
` + prelude + `
local sid, mode, w, n = parse(member)
local wait = mode == 'w'
local before = walk(false)
local hb = head()
if redis.call('EXISTS', KEYS[3]) == 0 then
  -- Entries of this session left from before its marker expired are dead
  -- (their calls were told so, or will be); they go before the marker
  -- comes back.
  local pre = sid .. '|'
  for _, z in ipairs({q, wq}) do
    for _, m in ipairs(redis.call('ZRANGE', z, 0, -1)) do
      if string.sub(m, 1, #pre) == pre then unlist(m) end
    end
  end
end
local g, cnt, shared, units, sum, bar = walk(true)
local had = redis.call('ZSCORE', wait and wq or q, member)
if had then
  -- This call's script ran before: go-redis sends a script again when
  -- its reply was lost (EOF, a read timeout). Report what the first run
  -- did; a second ZADD would move the entry behind later calls while its
  -- grant may already have been announced, and a Try would answer {0}
  -- with its entry left holding the key.
  redis.call('SET', KEYS[3], proc, 'PX', ttl)
  notify(before, g, hb)
  record(g)
  if wait then
    local b = head()
    if b == nil or tonumber(had) < b then return {1, tonumber(had), 1} end
    return {1, tonumber(had), 0}
  end
  for _, m in ipairs(g) do
    if m == member then return {1, tonumber(had), 1} end
  end
  return {1, tonumber(had), 0}
end
local total = redis.call('ZCARD', q)
if mode == 'u' and total > 0 then
  local hs, hm, hw, hn = parse(redis.call('ZRANGE', q, 0, 0)[1])
  if hm == 'u' and hn ~= n then
    notify(before, g, hb)
    record(g)
    return {-1, hn}
  end
end
-- Granted at once: a Wait when the queue is empty (its purge included);
-- another call when every entry is granted, no Wait waits behind the
-- head, and it fits beside them.
local now = total == 0 or (not wait and #g == total and bar == nil and fits(cnt, shared, units, sum, mode, w, n))
if (kind == 't' and not now) or (kind == 'w' and now) then
  notify(before, g, hb)
  record(g)
  if kind == 't' then return {0} end
  return {2}
end
redis.call('SET', KEYS[3], proc, 'PX', ttl)
local top, wtop = topOf(q), topOf(wq)
if wtop and (top == nil or wtop > top) then top = wtop end
local token, tok = nextToken(top)
if wait then
  redis.call('ZADD', wq, tok, member)
else
  redis.call('ZADD', q, tok, member)
end
if label ~= '' then redis.call('HSET', lkey, member, label) end
notify(before, g, hb)
-- Granted at once: among the holders, though not announced (the reply
-- tells its Locker).
if now and not wait then g[#g + 1] = member end
record(g)
if now then return {1, token, 1} end
return {1, token, 0}
`)

// releaseSrc removes an entry of the calling session. KEYS: queue, the
// session's marker. ARGV: marker prefix, channel, entry, the session's
// id. It returns {1, bound, granted...} if the entry was there and its
// session alive, {0, bound, granted...} if not (someone removed it, or
// the session's marker expired and anyone may purge the entry: the grant
// was lost, whether or not another call was granted meanwhile). It
// announces every entry its release granted, and the Waits' bound if it
// moved (notify); the reply's bound is that bound (0 if it did not move)
// and granted are the entries of the calling session it granted, so that
// the releasing Locker grants its own calls, Waits included, from the
// reply, without the notice's hop, and a release that frees many calls of
// other Lockers does not send their names back as well.
// A queue left empty deletes the queue (Redis does) and the session's
// marker, which then guards no entry, so that an uncontended key keeps
// only its counter; a marker whose session released while others were
// queued expires with its TTL. A second run answers 0 for the entry the
// first removed, so it runs through runOnce, never go-redis's retries.
const releaseSrc = `
local current = redis.call('EXISTS', KEYS[2])
if redis.call('ZCARD', KEYS[1]) == 1 and redis.call('ZREM', KEYS[1], ARGV[3]) == 1 then
  -- The entry was the queue's only one: nothing is granted by its
  -- release but the Waits behind it, whose turns have all come, and
  -- the queue is gone (so this comes before the prelude's functions are
  -- even made). The Waits go with it, and with them every label left
  -- (only Waits could still have one), and the session's marker, which
  -- guards no entry any more.
  local tag = string.sub(KEYS[1], 1, -2)
  local t = redis.call('ZRANGE', tag .. 'w', -1, -1, 'WITHSCORES')
  local b = 0
  if t[2] then
    b = tonumber(t[2]) + 1
    redis.call('DEL', tag .. 'w', tag .. 'l')
    redis.call('PUBLISH', ARGV[2], '@' .. string.format('%.0f', b) .. ' ' .. tag)
  else
    redis.call('HDEL', tag .. 'l', ARGV[3])
  end
  redis.call('DEL', KEYS[2])
  if redis.call('EXISTS', tag .. 'f') == 1 then
    -- The key's change log: nobody holds it.
    local last = redis.call('XREVRANGE', tag .. 'f', '+', '-', 'COUNT', 1)[1]
    redis.call('XADD', tag .. 'f', 'MAXLEN', '~', ` + logLen + `, '*', 'p', last and last[1] or '0-0', 't', '', 'h', '')
  end
  return {current, b}
end
` + prelude + `
local before = walk(false)
local hb = head()
local removed = redis.call('ZREM', isWait(ARGV[3]) and wq or q, ARGV[3])
redis.call('HDEL', lkey, ARGV[3])
local after = walk(true)
local news, b = notify(before, after, hb)
record(after)
local res = {removed * current, b or 0}
local own = ARGV[4] .. '|'
for _, m in ipairs(news) do
  if string.sub(m, 1, #own) == own then res[#res + 1] = m end
end
if redis.call('EXISTS', q) == 0 and redis.call('EXISTS', wq) == 0 then redis.call('DEL', KEYS[2]) end
return res
`

var releaseScript = redis.NewScript(releaseSrc)

// noRetryCmd is a command go-redis sends at most once: its retries (after
// EOF, a read timeout, a pool timeout) would run a script that has
// already run, whose reply was lost, a second time. go-redis's Cmder has
// NoRetry for this (a command that must not run twice); MOVED and ASK
// redirections are followed all the same.
type noRetryCmd struct{ *redis.Cmd }

func (noRetryCmd) NoRetry() bool { return true }

// unsent reports whether err shows that a command never left: no
// connection from the pool in time, or a failed dial. Any other error
// leaves its outcome unknown.
func unsent(err error) bool {
	var op *net.OpError
	return errors.Is(err, redis.ErrPoolTimeout) || (errors.As(err, &op) && op.Op == "dial")
}

// runOnce runs the script src (whose SHA1 is s's) as Script.Run does,
// EVALSHA then EVAL after NOSCRIPT, but with each run at most once: it is
// sent again only after an error that shows it never left (no connection
// from the pool in time, a failed dial), up to 3 more times as go-redis's
// default MaxRetries. Any other error leaves the outcome unknown, and the
// caller must treat it so.
func runOnce(ctx context.Context, c redis.UniversalClient, s *redis.Script, src string, keys []string, args ...any) *redis.Cmd {
	send := func(name, body string) *redis.Cmd {
		a := make([]any, 0, 3+len(keys)+len(args))
		a = append(a, name, body, len(keys))
		for _, k := range keys {
			a = append(a, k)
		}
		a = append(a, args...)
		var cmd *redis.Cmd
		for try := 0; ; try++ {
			cmd = redis.NewCmd(ctx, a...)
			err := c.Process(ctx, noRetryCmd{cmd})
			if !unsent(err) || try == 3 || ctx.Err() != nil {
				return cmd
			}
		}
	}
	cmd := send("evalsha", s.Hash())
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		return send("eval", src)
	}
	return cmd
}

// checkScript purges the head of a queue and reports it. KEYS: queue.
// ARGV: marker prefix, channel, entry or "". It returns {entry present
// (0/1), entries in the queue, the entries that hold the key...}.
var checkScript = redis.NewScript(prelude + `
local before = walk(false)
local hb = head()
local after = walk(true)
notify(before, after, hb)
record(after)
local present = 0
if ARGV[3] ~= '' and redis.call('ZSCORE', isWait(ARGV[3]) and wq or q, ARGV[3]) then present = 1 end
local res = {present, redis.call('ZCARD', q), bound() or 0}
for _, m in ipairs(after) do res[#res + 1] = m end
return res
`)

// renewScript renews a session's marker on one key and removes the
// session's entries that its Locker no longer knows from the head of the
// queue. KEYS: queue, marker. ARGV: marker prefix, channel, TTL in ms,
// the cutoff, then the session's entries the Locker believes present. It
// returns {-1} if the marker had expired (every entry of the session on
// the key is dead, and it is not brought back), else {0, the entries
// that are missing...}.
//
// An entry the Locker no longer knows is one it released, or lost, or
// gave up on, and that came back: from an RDB snapshot or an append-only
// file taken before its release, or from a replica promoted before the
// release reached it. Its session's marker is alive while the Locker has
// other calls on the key, so no purge removes it, and it would block the
// key for as long as the Locker lives (its own new calls queued behind
// it). The renewal removes such an entry when it holds the key (the
// prefix of the queue that walk grants, where an entry blocks others; an
// entry further back is removed by the first renewal after it gets
// there), so it stops blocking within one renewal period. It compares
// only that head with the Locker's list, not the whole queue: the cost
// per renewal is the head's, whatever the queue's length. The cutoff
// keeps it from removing an entry whose enqueue is in flight (the
// Locker cannot list it yet, and the script may overtake the renewal on
// another connection): it removes only entries numbered at or below it
// (the seq field, base 36), all of which the Locker either lists or no
// longer waits for (see staleCutoffLocked).
var renewScript = redis.NewScript(prelude + `
local marker, ttl, cutoff = KEYS[2], ARGV[3], tonumber(ARGV[4])
if redis.call('PEXPIRE', marker, ttl) == 0 then return {-1} end
local res = {0, 0}
local known = {}
for i = 5, #ARGV do
  known[ARGV[i]] = true
  if not redis.call('ZSCORE', isWait(ARGV[i]) and wq or q, ARGV[i]) then res[#res + 1] = ARGV[i] end
end
local sid = string.sub(marker, #mpre + 1)
local before = walk(false)
local hb = head()
local held = walk(true)
local stale = false
for _, m in ipairs(held) do
  local s, seq = string.match(m, '^([^|]+)|([^|]+)|')
  if s == sid and not known[m] and tonumber(seq, 36) <= cutoff then
    unlist(m)
    stale = true
  end
end
if stale then held = walk(true) end
notify(before, held, hb)
record(held)
res[2] = bound() or 0
return res
`)

// listScript lists a queue for a listing (list.go). KEYS: queue. ARGV:
// marker prefix, channel. It first purges the dead entries at the head of
// the queue, as checkScript does, then returns the server's clock (TIME:
// seconds, microseconds) and, for each live entry in queue order, five
// strings: the entry, its score (its token), its session's marker (the
// Locker's process), its label ("" for none), and "1" if it holds the
// key, else "0". Its cost is the queue's length.
var listScript = redis.NewScript(prelude + `
local before = walk(false)
local hb = head()
local after = walk(true)
notify(before, after, hb)
record(after)
local held = {}
for _, m in ipairs(after) do held[m] = true end
local b = bound()
local t = redis.call('TIME')
local res = {t[1], t[2]}
local procs = {}
local function add(m, score, h)
  local sid = parse(m)
  if sid and live(sid) then
    local p = procs[sid]
    if p == nil then
      p = redis.call('GET', mpre .. sid) or ''
      procs[sid] = p
    end
    res[#res + 1] = m
    res[#res + 1] = fmt(score)
    res[#res + 1] = p
    res[#res + 1] = redis.call('HGET', lkey, m) or ''
    res[#res + 1] = h and '1' or '0'
  end
end
-- The queue and the Waits, merged in token order: the Waits whose turn
-- has come (below the bound) come before the queue's head.
local all = redis.call('ZRANGE', q, 0, -1, 'WITHSCORES')
local ws = redis.call('ZRANGE', wq, 0, -1, 'WITHSCORES')
local i, j = 1, 1
while i <= #all or j <= #ws do
  if j <= #ws and (i > #all or tonumber(ws[j + 1]) < tonumber(all[i + 1])) then
    local sc = tonumber(ws[j + 1])
    add(ws[j], sc, b ~= nil and sc < b)
    j = j + 2
  else
    add(all[i], tonumber(all[i + 1]), held[all[i]])
    i = i + 2
  end
end
return res
`)

// removeScript removes entries of the calling session from a queue at
// once: the finished Waits of a release, which the janitor removes
// together, and whatever else it has for the key. KEYS: queue, the
// session's marker. ARGV: marker prefix, channel, the entries. It walks
// the queue once before and once after, announces what the removals
// granted, and deletes the marker if the queue is left empty, as the
// release script does for one entry.
var removeScript = redis.NewScript(prelude + `
local hb = head()
-- Waits whose turn has come are transparent: removing only them grants
-- nothing, and needs no walk.
local grants = false
for i = 3, #ARGV do
  local m = ARGV[i]
  if not isWait(m) then
    grants = true
  elseif hb then
    local sc = redis.call('ZSCORE', wq, m)
    if sc and tonumber(sc) > hb then grants = true end
  end
end
if grants then
  local before = walk(false)
  for i = 3, #ARGV do unlist(ARGV[i]) end
  local after = walk(true)
  notify(before, after, hb)
  record(after)
else
  for i = 3, #ARGV do unlist(ARGV[i]) end
end
if redis.call('EXISTS', q) == 0 and redis.call('EXISTS', wq) == 0 then redis.call('DEL', KEYS[2]) end
return 0
`)
