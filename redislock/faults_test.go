package redislock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// replyDropper is a TCP proxy in front of a real redis-server that holds
// back one reply: once armed, the first connection that sends a request
// that match accepts (an EVALSHA, or only the enqueueing script's:
// isEnqueue) has its next reply held (the script has run on the server).
// When the test says so, the proxy delivers it late (deliver), or closes
// that connection without it (drop), as a network failure between the
// server's reply and the client would: go-redis then sees EOF and sends
// the script again on a new connection (its MaxRetries, 3 by default),
// and a script that runs twice must do what it did once.
type replyDropper struct {
	t     testing.TB
	ln    net.Listener
	addr  string            // the server's
	match func([]byte) bool // the requests whose reply may be held

	mu      sync.Mutex
	armed   bool
	target  net.Conn      // the client side of the connection whose reply is held
	held    chan struct{} // closed when the target's reply has arrived and is held
	release chan struct{} // closed by drop or deliver
	forward bool          // set by deliver: pass the held reply on
	conns   []net.Conn
	wg      sync.WaitGroup
}

// newReplyDropper starts a proxy to the server at addr, closed by
// t.Cleanup (which delivers a reply still held). match picks the requests
// whose reply may be held; nil: any EVALSHA.
func newReplyDropper(t testing.TB, addr string, match func([]byte) bool) *replyDropper {
	t.Helper()
	if match == nil {
		match = func(req []byte) bool { return bytes.Contains(bytes.ToLower(req), []byte("evalsha")) }
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyDropper{t: t, ln: ln, addr: addr, match: match, held: make(chan struct{}), release: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		p.deliver()
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

// Addr is where clients connect.
func (p *replyDropper) Addr() string { return p.ln.Addr().String() }

// NewClient returns a client that talks to the server through p, closed
// by t.Cleanup.
func (p *replyDropper) NewClient(t testing.TB) *redis.Client {
	t.Helper()
	return newClient(t, &redis.Options{Addr: p.Addr()})
}

// arm makes the reply to the next request that match accepts the one
// held back.
func (p *replyDropper) arm() {
	p.mu.Lock()
	p.armed = true
	p.mu.Unlock()
}

// awaitHeld waits until the armed script has run and its reply is held.
func (p *replyDropper) awaitHeld(d time.Duration) {
	p.t.Helper()
	recvWithin(p.t, p.held, d, "proxy: no EVALSHA reply held")
}

// drop closes the held connection without its reply. Only the first of
// drop and deliver counts.
func (p *replyDropper) drop() { p.let(false) }

// deliver passes the held reply on, late. Only the first of drop and
// deliver counts.
func (p *replyDropper) deliver() { p.let(true) }

// let releases the held reply, forwarded or not, once.
func (p *replyDropper) let(forward bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.release:
	default:
		p.forward = forward
		close(p.release)
	}
}

func (p *replyDropper) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.addr)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.up(c, s)
		go p.down(c, s)
	}
}

// up copies client to server, spotting the armed EVALSHA.
func (p *replyDropper) up(c, s net.Conn) {
	defer p.wg.Done()
	defer s.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if p.armed && p.match(buf[:n]) {
				p.armed, p.target = false, c
			}
			p.mu.Unlock()
			if _, werr := s.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// down copies server to client, holding back the target's reply.
func (p *replyDropper) down(c, s net.Conn) {
	defer p.wg.Done()
	defer c.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			p.mu.Lock()
			target := p.target == c
			if target {
				p.target = nil
			}
			p.mu.Unlock()
			if target {
				close(p.held)
				<-p.release
				p.mu.Lock()
				forward := p.forward
				p.mu.Unlock()
				if !forward {
					return // c.Close: the reply is lost
				}
			}
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestEnqueueRetriedAfterLostReply: the reply to a Lock's enqueueing
// script is lost after the script ran; meanwhile the holder released (so
// the waiter's entry was announced as granted) and another call queued
// behind it. go-redis sends the script again. Running it twice must not
// move the entry behind the later call: the waiter holds the key, and the
// later call is not granted until it unlocks (two holders at once
// otherwise, the later one found by its periodic re-read of the queue).
func TestEnqueueRetriedAfterLostReply(t *testing.T) {
	srv := redistest.StartServer(t)
	p := newReplyDropper(t, srv.Addr(), nil)
	ca := srv.NewClient(t)
	cb := p.NewClient(t)
	const prefix = "retry"
	a := newLocker(t, ca, prefix)
	// B's own renewals and re-reads must not take the proxy's one held
	// reply: a long TTL keeps them away for the test.
	b := newLocker(t, cb, prefix, redislock.WithTTL(time.Minute))
	c := newLocker(t, srv.NewClient(t), prefix) // re-reads its queue every testTTL/3
	ctx := context.Background()

	ga, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	p.arm()
	bDone := lockAsync(t, ctx, b, "k")
	p.awaitHeld(10 * time.Second)
	awaitQueue(t, ca, prefix, "k", 2, 10*time.Second)
	if err := ga.Unlock(ctx); err != nil { // announces B's entry as granted
		t.Fatal(err)
	}
	cDone := lockAsync(t, owner.NewContext(ctx), c, "k")
	awaitQueue(t, ca, prefix, "k", 2, 10*time.Second) // B's entry and C's
	p.drop()

	gb := awaitGrant(t, bDone, 20*time.Second, "B's Lock did not return after its enqueue was retried")
	head, err := ca.ZRange(ctx, redislock.QueueKey(prefix, "k"), 0, 0).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(head) != 1 || head[0] != redislock.Member(gb) {
		t.Errorf("B holds the key but the queue's head is %q, not B's entry %q", head, redislock.Member(gb))
	}
	waitsBehind(t, ctx, cDone, "C", gb, "B")
	awaitQueue(t, ca, prefix, "k", 0, 10*time.Second)
}

// waitsBehind checks the hand-off from holder to the call whose grant
// comes on next (from lockAsync), named nextName and holderName in
// failures. next must not be granted while holder holds the key, for two
// TTLs: next's Locker re-reads its queue every testTTL/3, so a wrong
// grant it would find shows within them. Then holder unlocks, and next
// must be granted within three TTLs, with a larger token. If next is
// granted early, waitsBehind reports it, unlocks both and returns.
func waitsBehind(t *testing.T, ctx context.Context, next <-chan keylock.Lease, nextName string, holder keylock.Lease, holderName string) {
	t.Helper()
	select {
	case g := <-next:
		if g != nil {
			t.Errorf("%s was granted (token %d) while %s holds the key (token %d)", nextName, g.Token(), holderName, holder.Token())
			g.Unlock(ctx)
		}
		holder.Unlock(ctx)
		return
	case <-time.After(2 * testTTL):
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-next:
		if g != nil {
			if g.Token() <= holder.Token() {
				t.Errorf("%s's token %d after %s's %d", nextName, g.Token(), holderName, holder.Token())
			}
			g.Unlock(ctx)
		}
	case <-time.After(3 * testTTL):
		t.Fatalf("%s was not granted after %s unlocked (waited %v)", nextName, holderName, 3*testTTL)
	}
}

// TestTryLockRetriedAfterLostReply: the reply to a TryLock's script is
// lost after it granted the free key. The script sent again must report
// the grant it made, not ErrWouldBlock with its entry left holding the
// key for a call that returned (kept alive as long as the Locker renews
// its session on the key).
func TestTryLockRetriedAfterLostReply(t *testing.T) {
	srv := redistest.StartServer(t)
	p := newReplyDropper(t, srv.Addr(), nil)
	admin := srv.NewClient(t)
	cb := p.NewClient(t)
	const prefix = "retry-try"
	// Load the scripts so that B's first command is an EVALSHA that runs.
	warm := newLocker(t, admin, prefix)
	if g, err := warm.TryLock(context.Background(), "warm"); err != nil {
		t.Fatal(err)
	} else {
		g.Unlock(context.Background())
	}
	b := newLocker(t, cb, prefix, redislock.WithTTL(time.Minute))
	ctx := context.Background()
	p.arm()
	type result struct {
		g   keylock.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		g, err := b.TryLock(ctx, "k")
		done <- result{g, err}
	}()
	p.awaitHeld(10 * time.Second)
	p.drop()
	r := recvWithin(t, done, 20*time.Second, "TryLock did not return")
	if r.err != nil {
		if !errors.Is(r.err, fairlock.ErrWouldBlock) {
			t.Fatalf("TryLock: %v", r.err)
		}
		// Nothing may be left holding the key for a call that failed.
		if n := queueLen(t, admin, prefix, "k"); n != 0 {
			t.Fatalf("TryLock failed with %v and left %d entries in the queue", r.err, n)
		}
		return
	}
	if err := r.g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	awaitQueue(t, admin, prefix, "k", 0, 10*time.Second)
}

// TestUnlockRetriedAfterLostReply: the reply to an Unlock's release
// script is lost after the script removed the entry. Unlock must not
// report the grant lost (ErrLost says another process may have held the
// key meanwhile, which it could not): it returns nil or the connection's
// error, and the entry is gone.
func TestUnlockRetriedAfterLostReply(t *testing.T) {
	srv := redistest.StartServer(t)
	p := newReplyDropper(t, srv.Addr(), nil)
	admin := srv.NewClient(t)
	cb := p.NewClient(t)
	const prefix = "retry-unlock"
	b := newLocker(t, cb, prefix, redislock.WithTTL(time.Minute))
	ctx := context.Background()
	for range 2 { // the first round loads the scripts: the armed EVALSHA must run
		g, err := b.Lock(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	g, err := b.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	p.arm()
	done := make(chan error, 1)
	go func() { done <- g.Unlock(ctx) }()
	p.awaitHeld(10 * time.Second)
	p.drop()
	if err := recvWithin(t, done, 20*time.Second, "Unlock did not return"); errors.Is(err, redislock.ErrLost) {
		t.Errorf("Unlock after a lost reply: %v; the grant was not lost", err)
	}
	if isClosed(g.Lost()) {
		t.Error("Lost closed for a grant that was released, not lost")
	}
	awaitQueue(t, admin, prefix, "k", 0, 10*time.Second)
}

// TestNothingLeftButCounters: once every call has returned, an
// uncontended key keeps only its fencing counter in Redis (until the key
// has been idle for ten TTLs: TestIdleKeysLeaveNothing), not its session
// marker until the TTL; a
// cancelled waiter and a Try that would block leave nothing either.
func TestNothingLeftButCounters(t *testing.T) {
	c := redistest.Start(t)
	const prefix = "left"
	l := newLocker(t, c, prefix, redislock.WithTTL(time.Minute))
	ctx := context.Background()
	keys := []string{"a", "b/{c}", "%"}
	for _, k := range keys {
		g, err := l.Lock(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.TryLock(owner.NewContext(ctx), k); !errors.Is(err, fairlock.ErrWouldBlock) {
			t.Fatalf("TryLock of a held key: %v", err)
		}
		wctx, cancel := context.WithCancel(owner.NewContext(ctx))
		done := make(chan error, 1)
		go func() {
			_, err := l.Lock(wctx, k)
			done <- err
		}()
		awaitQueue(t, c, prefix, k, 2, 10*time.Second)
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Lock: %v", err)
		}
		if err := g.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The cancelled call's removal may land after its Lock returned; the
	// queues are empty within a round trip or two.
	for _, k := range keys {
		awaitQueue(t, c, prefix, k, 0, 10*time.Second)
	}
	got, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(keys) {
		t.Fatalf("Redis holds %q after every call returned; want only the %d counters", got, len(keys))
	}
	for _, k := range got {
		if !strings.HasSuffix(k, "}n") {
			t.Errorf("Redis holds %q after every call returned; want only counters", k)
		}
	}
}

// serverPID returns the process id of the redis-server c talks to.
func serverPID(t testing.TB, c redis.UniversalClient) int {
	t.Helper()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, ln := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(ln, "process_id:"); ok {
			pid, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatal("INFO server has no process_id")
	return 0
}

// stopServer stops the redis-server process pid (SIGSTOP), as a server
// that hangs, and returns resume, which lets it go on (SIGCONT) the first
// time it is called and does nothing after. t.Cleanup calls resume too,
// so that a failed test leaves no server stopped; registered after the
// test's Lockers, it runs before their Close (cleanups run last first).
func stopServer(t testing.TB, pid int) (resume func()) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	return resume
}

// TestLostOnTimeWhileRedisHangs: the server stops answering (SIGSTOP: a
// hung server, or a connection that black-holes) while a Locker holds a
// key. go-redis does not apply a context's deadline to a connection's
// reads unless ContextTimeoutEnabled is set: a renewal waits for the
// client's ReadTimeout, here longer than the TTL. Lost must close all the
// same by the renewal deadline (TTL less a tenth after the last renewal
// was sent, before the server could expire the session and grant the key
// to another), not when the blocked renewal gives up.
func TestLostOnTimeWhileRedisHangs(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.NewClient(t)
	pid := serverPID(t, admin)
	holder := newClient(t, &redis.Options{Addr: srv.Addr(), ReadTimeout: 20 * time.Second})
	const ttl = 3 * time.Second
	l := newLocker(t, holder, "hang", redislock.WithTTL(ttl))
	ctx := context.Background()
	g, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	resume := stopServer(t, pid)
	paused := time.Now()
	select {
	case <-g.Lost():
		// The last renewal was sent before the pause: its deadline is at
		// most paused + ttl - ttl/10. A tenth of the TTL is slack for a
		// loaded machine.
		if d := time.Since(paused); d > ttl {
			t.Errorf("Lost closed %v after the server hung; the renewal deadline is at most %v", d, ttl-ttl/10)
		}
	case <-time.After(3 * ttl):
		t.Errorf("Lost did not close within %v of the server hanging", 3*ttl)
	}
	resume()
	if err := g.Unlock(ctx); !errors.Is(err, redislock.ErrLost) {
		t.Errorf("Unlock of the lost grant: %v, want ErrLost", err)
	}
	awaitQueue(t, admin, "hang", "k", 0, 10*time.Second)
}

// TestUnlockAfterSessionExpired: the holder's session marker expires on
// the server (DEL here, so the test need not wait a TTL) and the holder
// unlocks before its renewal notices and before anyone purged the entry.
// The grant was lost (any script could have purged it and granted the key
// to another): Unlock returns ErrLost and Lost is closed.
func TestUnlockAfterSessionExpired(t *testing.T) {
	c := redistest.Start(t)
	l := newLocker(t, c, "expired-unlock", redislock.WithTTL(time.Minute))
	ctx := context.Background()
	g, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Del(ctx, redislock.MarkerKey("expired-unlock", g)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := g.Unlock(ctx); !errors.Is(err, redislock.ErrLost) {
		t.Errorf("Unlock after the session expired: %v, want ErrLost", err)
	}
	if !isClosed(g.Lost()) {
		t.Error("Lost is not closed after Unlock reported the grant lost")
	}
	awaitQueue(t, c, "expired-unlock", "k", 0, 10*time.Second)
}

// TestLockWhileRedisHangs: a Lock sent to a server that hangs (SIGSTOP)
// fails once Redis does not answer, with Redis's error: not one that
// says the caller's context ended (it has no deadline), which a caller
// and the Observer would take for its own timeout. When the server
// resumes and runs the scripts it had received, their entries are
// removed: nothing is left in the queue.
func TestLockWhileRedisHangs(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.NewClient(t)
	pid := serverPID(t, admin)
	l := newLocker(t, srv.NewClient(t), "hung")
	ctx := context.Background()
	if g, err := l.Lock(ctx, "k"); err != nil { // loads the scripts
		t.Fatal(err)
	} else if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	resume := stopServer(t, pid)
	g, err := l.Lock(ctx, "k")
	if err == nil {
		t.Fatalf("Lock on a hung server returned a grant (token %d)", g.Token())
	}
	var le *fairlock.LockError
	if g != nil || !errors.As(err, &le) || le.Key != "k" {
		t.Errorf("Lock on a hung server: %v, %v; want a nil Lease and a *fairlock.LockError naming the key", g, err)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		t.Errorf("Lock with a live context on a hung server: %v; it wraps a context error", err)
	}
	resume()
	// The scripts the server received while it hung run when it resumes;
	// the janitor removes what they wrote.
	awaitQueue(t, admin, "hung", "k", 0, 10*time.Second)
	if g, err := l.TryLock(ctx, "k"); err != nil {
		t.Fatalf("TryLock after the server resumed: %v", err)
	} else {
		g.Unlock(ctx)
	}
}

// TestCancelWhileEnqueueInFlight: a Lock's context ends while its
// enqueueing script has run on the server but its reply is still on the
// way (held by the proxy). Lock returns the context's error at once; when
// the reply arrives, the entry it reports is removed, so a later call is
// not blocked by it. Once for a free key (the entry would hold it) and
// once behind a holder (the entry would be granted at its Unlock).
func TestCancelWhileEnqueueInFlight(t *testing.T) {
	for _, behind := range []bool{false, true} {
		t.Run(fmt.Sprintf("behind=%v", behind), func(t *testing.T) {
			srv := redistest.StartServer(t)
			p := newReplyDropper(t, srv.Addr(), nil)
			admin := srv.NewClient(t)
			cb := p.NewClient(t)
			const prefix = "inflight"
			a := newLocker(t, admin, prefix)
			b := newLocker(t, cb, prefix, redislock.WithTTL(time.Minute))
			ctx := context.Background()
			ga, err := a.Lock(ctx, "k") // also loads the scripts
			if err != nil {
				t.Fatal(err)
			}
			want := 1
			if !behind {
				if err := ga.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
				want = 0
			}
			p.arm()
			bctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				g, err := b.Lock(bctx, "k")
				if g != nil {
					t.Errorf("a cancelled Lock returned a Lease (token %d)", g.Token())
				}
				done <- err
			}()
			p.awaitHeld(10 * time.Second)
			awaitQueue(t, admin, prefix, "k", want+1, 10*time.Second)
			cancel()
			if err := recvWithin(t, done, 5*time.Second, "a cancelled Lock did not return while its script's reply was in flight"); !errors.Is(err, context.Canceled) {
				t.Errorf("Lock cancelled while its script's reply was in flight: %v", err)
			}
			p.deliver()
			awaitQueue(t, admin, prefix, "k", want, 10*time.Second)
			if behind {
				if err := ga.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			g, err := a.TryLock(ctx, "k")
			if err != nil {
				t.Fatalf("TryLock after the cancelled call's entry should be gone: %v", err)
			}
			g.Unlock(ctx)
		})
	}
}

// countingHandler counts the log records whose message contains sub.
type countingHandler struct {
	sub string
	mu  sync.Mutex
	n   int
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.sub) {
		h.mu.Lock()
		h.n++
		h.mu.Unlock()
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

func (h *countingHandler) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// TestSubscriptionOutageLogsOnce: while the server is down, the Locker's
// subscription keeps trying to come back, backing off, and warns once
// per outage, not at every attempt; when the server is back, the Locker
// works again.
func TestSubscriptionOutageLogsOnce(t *testing.T) {
	srv := redistest.StartServer(t)
	h := &countingHandler{sub: "subscription failed"}
	l := newLocker(t, srv.NewClient(t), "outage", redislock.WithLogger(slog.New(h)))
	srv.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for h.count() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no warning within 10 s of the server stopping")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(time.Second) // a span of outage, not an ordering
	if n := h.count(); n > 1 {
		t.Errorf("%d warnings in about a second of outage; want one", n)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	g, err := l.Lock(context.Background(), "k")
	if err != nil {
		t.Fatal(err)
	}
	g.Unlock(context.Background())
}

// TestGrantAnnouncedThenSessionExpired: a Lock's enqueueing script runs
// but its reply is late (held by the proxy, then lost: go-redis sends the
// script again). Meanwhile the holder releases, so the entry is announced
// as granted, and the entry's session expires (a TTL shorter than the
// delay), so another call purges the entry and is granted. The retried
// script queues the call again, at the back. The first call must not take
// the stale announcement for a grant: it must wait behind the holder.
func TestGrantAnnouncedThenSessionExpired(t *testing.T) {
	srv := redistest.StartServer(t)
	p := newReplyDropper(t, srv.Addr(), nil)
	admin := srv.NewClient(t)
	cb := p.NewClient(t)
	const prefix = "stale-notice"
	a := newLocker(t, admin, prefix)
	b := newLocker(t, cb, prefix, redislock.WithTTL(300*time.Millisecond))
	c := newLocker(t, srv.NewClient(t), prefix)
	ctx := context.Background()
	ga, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	p.arm()
	bDone := lockAsync(t, ctx, b, "k")
	p.awaitHeld(10 * time.Second)
	awaitQueue(t, admin, prefix, "k", 2, 10*time.Second)
	q, err := admin.ZRange(ctx, redislock.QueueKey(prefix, "k"), 1, 1).Result()
	if err != nil || len(q) != 1 {
		t.Fatalf("B's entry: %v %v", q, err)
	}
	marker := redislock.MarkerOf(prefix, "k", q[0])
	if err := ga.Unlock(ctx); err != nil { // announces B's entry as granted
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for admin.Exists(ctx, marker).Val() != 0 { // B's session expires
		if time.Now().After(deadline) {
			t.Fatal("B's session marker did not expire")
		}
		time.Sleep(10 * time.Millisecond)
	}
	gc, err := c.Lock(owner.NewContext(ctx), "k") // purges B's dead entry
	if err != nil {
		t.Fatal(err)
	}
	p.drop()
	waitsBehind(t, ctx, bDone, "B", gc, "C")
	awaitQueue(t, admin, prefix, "k", 0, 10*time.Second)
}

// TestWaitersHoldNoConnection: a queued call holds no connection of the
// client's pool while it waits (it waits for its Locker's subscription),
// so 200 waiters on one key through a client whose pool has two
// connections are all queued, and all granted in turn.
func TestWaitersHoldNoConnection(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.NewClient(t)
	small := newClient(t, &redis.Options{Addr: srv.Addr(), PoolSize: 2})
	l := newLocker(t, small, "pool")
	ctx := context.Background()
	first, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := l.Lock(owner.NewContext(ctx), "k")
			if err != nil {
				t.Error(err)
				return
			}
			if err := g.Unlock(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	awaitQueue(t, admin, "pool", "k", n+1, 30*time.Second)
	if st := small.PoolStats(); st.TotalConns > 2 {
		t.Errorf("%d pooled connections with %d waiters queued; the pool has 2", st.TotalConns, n)
	}
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	awaitQueue(t, admin, "pool", "k", 0, 10*time.Second)
}

// TestErrorsNameTheKey: every call that fails returns a nil Lease and a
// *fairlock.LockError with its Op, naming the key (a long one with
// braces, a slash and a percent sign here) and wrapping the sentinel or
// cause; its message starts with "fairlock:".
func TestErrorsNameTheKey(t *testing.T) {
	c := redistest.Start(t)
	key := "{a}/%" + strings.Repeat("k", 1<<16)
	l, err := redislock.New(c, "errs", redislock.WithTTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	s := newSemaphoreT(t, c, "errs-sem", 2)
	ctx := context.Background()
	g, err := l.Lock(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(owner.NewContext(ctx))
	cancel()
	other := owner.NewContext(ctx)
	check := func(op string, lease keylock.Lease, err error, want error) {
		t.Helper()
		var le *fairlock.LockError
		if lease != nil || !errors.As(err, &le) || le.Op != op || le.Key != key || !errors.Is(err, want) ||
			!strings.HasPrefix(err.Error(), "fairlock:") {
			t.Errorf("%s: (%v, %v); want a nil Lease and a *fairlock.LockError with Op %s naming the key, wrapping %v", op, lease, err, op, want)
		}
	}
	lease, err := l.Lock(ctx, key)
	check("Lock", lease, err, fairlock.ErrReentrant)
	lease, err = l.TryLock(other, key)
	check("TryLock", lease, err, fairlock.ErrWouldBlock)
	lease, err = l.TryRLock(other, key)
	check("TryRLock", lease, err, fairlock.ErrWouldBlock)
	lease, err = l.RLock(done, key)
	check("RLock", lease, err, context.Canceled)
	check("Wait", nil, l.Wait(done, key), context.Canceled)
	_, err = l.Locked(done, key)
	check("Locked", nil, err, context.Canceled)
	lease, err = s.Acquire(ctx, key, 3)
	check("Acquire", lease, err, fairlock.ErrInvalidWeight)
	lease, err = s.TryAcquire(ctx, key, 0)
	check("TryAcquire", lease, err, fairlock.ErrInvalidWeight)
	if err := c.ZRem(ctx, redislock.QueueKey("errs", key), redislock.Member(g)).Err(); err != nil {
		t.Fatal(err)
	}
	check("Unlock", nil, g.Unlock(ctx), redislock.ErrLost)
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	lease, err = l.Lock(ctx, key)
	check("Lock", lease, err, fairlock.ErrClosed)
	check("Wait", nil, l.Wait(ctx, key), fairlock.ErrClosed)
}

// newSemaphoreT returns a Semaphore of n units on client under prefix,
// closed by t.Cleanup.
func newSemaphoreT(t testing.TB, client redis.UniversalClient, prefix string, n int64) *redislock.Semaphore {
	t.Helper()
	s, err := redislock.NewSemaphore(client, prefix, n, redislock.WithTTL(testTTL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(context.Background()); err != nil {
			t.Errorf("Semaphore.Close: %v", err)
		}
	})
	return s
}

// TestRedisPausedMidWait: the server hangs (SIGSTOP) for longer than the
// TTL while one Locker holds a key and another waits for it. The holder's
// Lost closes while the server hangs (its renewal deadline); when the
// server resumes, the waiter is granted after the holder's grant was lost
// (or fails with Redis's error if its queueing again found the server
// still hung), never both holding; the old holder's Unlock reports
// ErrLost; nothing is left in the queue.
func TestRedisPausedMidWait(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.NewClient(t)
	pid := serverPID(t, admin)
	a, b := newLocker(t, srv.NewClient(t), "paused"), newLocker(t, srv.NewClient(t), "paused")
	ctx := context.Background()
	ga, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		g   keylock.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		g, err := b.Lock(owner.NewContext(ctx), "k")
		done <- result{g, err}
	}()
	awaitQueue(t, admin, "paused", "k", 2, 10*time.Second)
	resume := stopServer(t, pid)
	select {
	case <-ga.Lost():
	case r := <-done:
		t.Fatalf("the waiter returned (%v, %v) while the server hung and the holder's Lost was open", r.g, r.err)
	case <-time.After(3 * testTTL):
		t.Fatal("the holder's Lost did not close while the server hung")
	}
	// Hang past the server's own expiry of the holder's session too:
	// poll the waiter for a span of a TTL, which must not be granted
	// while the server is stopped.
	select {
	case r := <-done:
		if r.g != nil {
			t.Fatalf("the waiter was granted (token %d) while the server was stopped", r.g.Token())
		}
		done <- r
	case <-time.After(testTTL):
	}
	resume()
	r := recvWithin(t, done, 30*time.Second, "the waiter neither was granted nor failed after the server resumed")
	if r.err != nil {
		if errors.Is(r.err, context.DeadlineExceeded) || errors.Is(r.err, context.Canceled) {
			t.Errorf("the waiter failed with a context error, its context being live: %v", r.err)
		}
		t.Logf("the waiter failed: %v", r.err)
	} else {
		if r.g.Token() <= ga.Token() {
			t.Errorf("the waiter's token %d is not above the lost holder's %d", r.g.Token(), ga.Token())
		}
		if err := r.g.Unlock(ctx); err != nil {
			t.Error(err)
		}
	}
	if err := ga.Unlock(ctx); !errors.Is(err, redislock.ErrLost) {
		t.Errorf("the old holder's Unlock: %v, want ErrLost", err)
	}
	awaitQueue(t, admin, "paused", "k", 0, 10*time.Second)
}

// TestClusterSlotMoved: while a grant is held and a call waits, the hash
// slot of the lock key moves to another master (keys migrated with
// MIGRATE, then CLUSTER SETSLOT … NODE on every node), as a resharding
// does. Every Redis key of the lock key is in that one slot, so all of
// them move together (the queue, the counter, the session markers with
// their TTLs); the Lockers' cluster clients, whose slot maps are stale,
// follow the MOVED redirection (the release script too, which go-redis
// sends at most once), and the hand-off and tokens go on.
func TestClusterSlotMoved(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	cl := redistest.StartNodes(t, 3)
	const prefix = "moved"
	a := newLocker(t, cl.NewClient(t), prefix)
	b := newLocker(t, cl.NewClient(t), prefix)
	ctx := context.Background()
	ga, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	done := lockAsync(t, owner.NewContext(ctx), b, "k")
	admin := cl.NewClient(t)
	awaitQueue(t, admin, prefix, "k", 2, 10*time.Second)

	nodes := make([]*redis.Client, len(cl.Nodes))
	ids := make([]string, len(cl.Nodes))
	for i, n := range cl.Nodes {
		nodes[i] = n.NewClient(t)
		id, err := nodes[i].Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	slot, err := admin.ClusterKeySlot(ctx, redislock.QueueKey(prefix, "k")).Result()
	if err != nil {
		t.Fatal(err)
	}
	from := -1
	for i := range nodes {
		if n, _ := nodes[i].ClusterCountKeysInSlot(ctx, int(slot)).Result(); n > 0 {
			from = i
		}
	}
	if from < 0 {
		t.Fatalf("no node holds the keys of slot %d", slot)
	}
	to := (from + 1) % len(nodes)
	must := func(c *redis.Client, args ...any) {
		t.Helper()
		if err := c.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
	}
	must(nodes[to], "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from])
	must(nodes[from], "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to])
	keys, err := nodes[from].ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
	if err != nil {
		t.Fatal(err)
	}
	// The queue, the counter and both sessions' markers.
	if len(keys) != 4 {
		t.Errorf("slot %d holds %q; want the queue, the counter and two markers", slot, keys)
	}
	host, port, _ := net.SplitHostPort(cl.Nodes[to].Addr())
	margs := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		margs = append(margs, k)
	}
	must(nodes[from], margs...)
	for i := range nodes {
		must(nodes[i], "CLUSTER", "SETSLOT", slot, "NODE", ids[to])
	}

	if err := ga.Unlock(ctx); err != nil {
		t.Fatalf("Unlock after the slot moved: %v", err)
	}
	gb := awaitGrant(t, done, 3*testTTL, "the waiter was not granted after the slot moved")
	if gb.Token() <= ga.Token() {
		t.Errorf("token %d after %d", gb.Token(), ga.Token())
	}
	if err := gb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	g, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if g.Token() <= gb.Token() {
		t.Errorf("token %d after %d", g.Token(), gb.Token())
	}
	if err := g.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := nodes[to].ZCard(ctx, redislock.QueueKey(prefix, "k")).Result(); err != nil || n != 0 {
		t.Errorf("queue on the new node: %d entries, %v", n, err)
	}
}

// TestCancelWhileRedisHangs: a queued call is cancelled while the server
// hangs (SIGSTOP), so its removal cannot run. The call returns with its
// context's error once the removal's 5 s bound has passed, even though
// its client's reads wait 30 s (go-redis applies a context's deadline to
// reads only with ContextTimeoutEnabled), and once the server answers
// again its entry is removed by the Locker's janitor, well before its
// session's TTL would have let it die.
func TestCancelWhileRedisHangs(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.NewClient(t)
	pid := serverPID(t, admin)
	const ttl = time.Minute
	a := newLocker(t, srv.NewClient(t), "cancel-hung", redislock.WithTTL(ttl))
	// A client whose reads wait long: go-redis applies a context's
	// deadline to reads only with ContextTimeoutEnabled.
	slow := newClient(t, &redis.Options{Addr: srv.Addr(), ReadTimeout: 30 * time.Second})
	b := newLocker(t, slow, "cancel-hung", redislock.WithTTL(ttl))
	ctx := context.Background()
	ga, err := a.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(owner.NewContext(ctx))
	done := make(chan error, 1)
	go func() {
		_, err := b.Lock(wctx, "k")
		done <- err
	}()
	awaitQueue(t, admin, "cancel-hung", "k", 2, 10*time.Second)
	resume := stopServer(t, pid)
	cancel()
	cancelled := time.Now()
	if err := recvWithin(t, done, 15*time.Second, "a cancelled Lock did not return while the server hung"); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled Lock: %v", err)
	}
	t.Logf("returned after %v", time.Since(cancelled))
	resume()
	awaitQueue(t, admin, "cancel-hung", "k", 1, ttl/4)
	if err := ga.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	awaitQueue(t, admin, "cancel-hung", "k", 0, 10*time.Second)
}

// TestUnlockBoundedByItsContextWhileRedisHangs: Unlock's script is made
// with its ctx, and returns when ctx ends even though the client's reads
// wait far longer (go-redis applies a context's deadline to reads only
// with ContextTimeoutEnabled): with the context's error, not ErrLost.
// Once the server answers again the entry is removed in the background.
func TestUnlockBoundedByItsContextWhileRedisHangs(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.NewClient(t)
	pid := serverPID(t, admin)
	slow := newClient(t, &redis.Options{Addr: srv.Addr(), ReadTimeout: 30 * time.Second})
	l := newLocker(t, slow, "unlock-hung", redislock.WithTTL(time.Minute))
	ctx := context.Background()
	g, err := l.Lock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	resume := stopServer(t, pid)
	uctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = g.Unlock(uctx)
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Unlock with a 200 ms context returned after %v while the server hung", d)
	}
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redislock.ErrLost) {
		t.Errorf("Unlock while the server hung: %v; want its context's error", err)
	}
	if err := g.Unlock(ctx); err != nil {
		t.Errorf("a second Unlock: %v, want nil", err)
	}
	resume()
	awaitQueue(t, admin, "unlock-hung", "k", 0, 15*time.Second)
}
