package redislock_test

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/redis/go-redis/v9"
)

// enqueueHolder is a TCP proxy in front of a real redis-server that
// delays one reply: once armed, the first connection that sends an
// EVALSHA with three keys (the enqueueing script: the renewal, the
// release and the check take fewer) has its next reply held back (the
// script has run on the server) until deliver passes it on.
type enqueueHolder struct {
	ln   net.Listener
	addr string

	mu      sync.Mutex
	armed   bool
	target  net.Conn      // the client side of the connection whose reply is held
	held    chan struct{} // closed when the reply is held
	release chan struct{} // closed by deliver
	conns   []net.Conn
	wg      sync.WaitGroup
}

// enqueueRequest is how an enqueue's EVALSHA starts: the command, the
// script's SHA1 and three keys.
var enqueueRequest = []byte("$7\r\nevalsha\r\n$40\r\n")

func newEnqueueHolder(t testing.TB, addr string) *enqueueHolder {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &enqueueHolder{ln: ln, addr: addr, held: make(chan struct{}), release: make(chan struct{})}
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

func (p *enqueueHolder) arm() {
	p.mu.Lock()
	p.armed = true
	p.mu.Unlock()
}

// deliver passes the held reply on (once).
func (p *enqueueHolder) deliver() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.release:
	default:
		close(p.release)
	}
}

func (p *enqueueHolder) accept() {
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

// isEnqueue reports whether a request is an EVALSHA with three keys.
func isEnqueue(req []byte) bool {
	i := bytes.Index(bytes.ToLower(req), enqueueRequest)
	if i < 0 {
		return false
	}
	rest := req[i+len(enqueueRequest):]
	return len(rest) >= 40+2+8 && bytes.HasPrefix(rest[42:], []byte("$1\r\n3\r\n"))
}

func (p *enqueueHolder) up(c, s net.Conn) {
	defer p.wg.Done()
	defer s.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if p.armed && isEnqueue(buf[:n]) {
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

func (p *enqueueHolder) down(c, s net.Conn) {
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

// awaitRenewals waits until the Locker that owns marker has renewed it n
// times (its PTTL went up n times), failing t after d.
func awaitRenewals(t testing.TB, c redis.UniversalClient, marker string, n int, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(d)
	last := time.Duration(-1)
	for seen := 0; seen < n; {
		ttl, err := c.PTTL(ctx, marker).Result()
		if err != nil {
			t.Fatal(err)
		}
		if last >= 0 && ttl > last {
			seen++
		}
		last = ttl
		if time.Now().After(deadline) {
			t.Fatalf("%s renewed %d times within %v; want %d", marker, seen, d, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRenewalKeepsInFlightEntry: the renewal removes the entries of its
// session that hold the key and that its Locker does not know
// (TestReleasedEntryRestored), but not one whose enqueue has run on the
// server while its reply is still on the way: a second RLock of a key the
// Locker holds shared is granted at once by its script, whose reply is
// held back while the Locker renews its session twice. The entry stays,
// and once the reply arrives the call holds the key and unlocks without
// ErrLost.
func TestRenewalKeepsInFlightEntry(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.NewClient(t)
	p := newEnqueueHolder(t, srv.Addr())
	const prefix = "inflight"
	l := newLocker(t, newClient(t, &redis.Options{Addr: p.ln.Addr().String()}), prefix)
	ctx := context.Background()
	g1, err := l.RLock(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	p.arm()
	second := make(chan error, 1)
	var g2 *redislock.Guard
	go func() {
		g, err := l.RLock(owner.NewContext(ctx), "k")
		if err == nil {
			g2 = g.(*redislock.Guard)
		}
		second <- err
	}()
	recvWithin(t, p.held, 10*time.Second, "the second RLock's enqueue was not held")
	awaitQueue(t, admin, prefix, "k", 2, 10*time.Second)
	awaitRenewals(t, admin, redislock.MarkerKey(prefix, g1), 2, 3*testTTL)
	if n := queueLen(t, admin, prefix, "k"); n != 2 {
		t.Errorf("the queue holds %d entries after two renewals while the second RLock's reply was held; want both", n)
	}
	p.deliver()
	if err := recvWithin(t, second, 10*time.Second, "the second RLock did not return"); err != nil {
		t.Fatal(err)
	}
	if isClosed(g2.Lost()) {
		t.Error("the second RLock's grant is lost")
	}
	if err := g2.Unlock(ctx); err != nil {
		t.Errorf("the second RLock's Unlock: %v", err)
	}
	if err := g1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	awaitQueue(t, admin, prefix, "k", 0, 10*time.Second)
}
