package redistest

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Replica is a redis-server replicating a Server, started by
// StartReplica. It reaches its primary through a relay of redistest's (a
// TCP proxy on loopback) that Stall can stop, so that a test can make
// the replica miss writes and then promote it, as a failover to a
// lagging replica would. Its methods are safe for concurrent use.
type Replica struct {
	*Server
	primary *Server
	relay   *relay
}

// StartReplica starts a replica of s (--replicaof the relay's address),
// with s's persistence and arguments, on a free loopback port in a
// temporary directory, waits until its first sync is done (at most 20 s),
// and stops it and the relay in tb.Cleanup. It fails tb if the replica
// does not start or sync.
func (s *Server) StartReplica(tb testing.TB) *Replica {
	tb.Helper()
	rl, err := newRelay(s.Addr())
	if err != nil {
		tb.Fatalf("redistest: relay: %v", err)
	}
	tb.Cleanup(rl.close)
	rep := &Server{opts: s.opts}
	host, port, _ := net.SplitHostPort(rl.addr())
	rep.opts.Args = append(append([]string{}, s.opts.Args...), "--replicaof", host, port)
	startProcess(tb, rep)
	r := &Replica{Server: rep, primary: s, relay: rl}
	if err := r.Sync(); err != nil {
		tb.Fatal(err)
	}
	return r
}

// Stall stops the replication link: from Stall's return until Resume,
// no byte passes between the primary and the replica, either way. Both
// keep the connection open, so neither sees an error before Redis's
// repl-timeout (60 s): the replica reports its link up while the writes
// the primary makes meanwhile pile up in the primary's output buffer for
// it, and the primary gets no acknowledgement (WAIT counts the replica
// no further).
func (r *Replica) Stall() { r.relay.stall() }

// Resume lets the replication link go on after Stall: what the primary
// sent meanwhile reaches the replica.
func (r *Replica) Resume() { r.relay.resume() }

// Promote makes the replica a primary (REPLICAOF NO ONE), with the data
// it has, as Sentinel or an operator does in a failover, and waits until
// it reports role:master (at most 20 s). Writes the primary made that had
// not reached the replica (Stall) are not on it.
func (r *Replica) Promote() error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	if err := c.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
		return fmt.Errorf("redistest: REPLICAOF NO ONE on %s: %w", r.Addr(), err)
	}
	return poll(ctx, func() (bool, error) {
		info, err := c.Info(ctx, "replication").Result()
		return infoField(info, "role") == "master", err
	}, "the promoted replica "+r.Addr()+" reports role:master")
}

// Sync waits until the replica has applied every write its primary had
// made when Sync was called (its replication offset reached the
// primary's), at most 20 s. It returns an error if the link is stalled
// or down for that long.
func (r *Replica) Sync() error {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	p := redis.NewClient(&redis.Options{Addr: r.primary.Addr()})
	defer p.Close()
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	info, err := p.Info(ctx, "replication").Result()
	if err != nil {
		return fmt.Errorf("redistest: INFO replication on %s: %w", r.primary.Addr(), err)
	}
	want, err := strconv.ParseInt(infoField(info, "master_repl_offset"), 10, 64)
	if err != nil {
		return fmt.Errorf("redistest: the primary's master_repl_offset: %w", err)
	}
	return poll(ctx, func() (bool, error) {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil || infoField(info, "master_link_status") != "up" || infoField(info, "master_sync_in_progress") != "0" {
			return false, err
		}
		got, err := strconv.ParseInt(infoField(info, "master_repl_offset"), 10, 64)
		return got >= want, err
	}, fmt.Sprintf("the replica %s reaches the primary's replication offset %d", r.Addr(), want))
}

// infoField returns the value of name in an INFO reply, or "".
func infoField(info, name string) string {
	for _, ln := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(ln, name+":"); ok {
			return v
		}
	}
	return ""
}

// poll calls cond every 20 ms until it reports true or ctx ends; then it
// returns an error saying what did not happen, with cond's last error.
func poll(ctx context.Context, cond func() (bool, error), what string) error {
	for {
		ok, err := cond()
		if ok && err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: not within %v: %s (last error: %v)", startTimeout, what, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// relay is a TCP proxy on loopback to target whose traffic, both ways,
// stall stops and resume lets go on.
type relay struct {
	ln     net.Listener
	target string
	done   chan struct{} // closed by close

	gate    sync.RWMutex // read-held around each write through the relay; write-held to change stalled
	stalled bool
	resumed chan struct{} // closed by resume; replaced by stall

	mu    sync.Mutex // guards conns
	conns []net.Conn
	wg    sync.WaitGroup
}

func newRelay(target string) (*relay, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &relay{ln: ln, target: target, done: make(chan struct{}), resumed: make(chan struct{})}
	close(r.resumed)
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

func (r *relay) addr() string { return r.ln.Addr().String() }

func (r *relay) stall() {
	r.gate.Lock()
	if !r.stalled {
		r.stalled = true
		r.resumed = make(chan struct{})
	}
	r.gate.Unlock()
}

func (r *relay) resume() {
	r.gate.Lock()
	if r.stalled {
		r.stalled = false
		close(r.resumed)
	}
	r.gate.Unlock()
}

// close stops the relay and closes its connections.
func (r *relay) close() {
	close(r.done)
	r.ln.Close()
	r.mu.Lock()
	for _, c := range r.conns {
		c.Close()
	}
	r.conns = nil
	r.mu.Unlock()
	r.wg.Wait()
}

func (r *relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		t, err := net.Dial("tcp", r.target)
		if err != nil {
			c.Close()
			continue
		}
		r.mu.Lock()
		select {
		case <-r.done:
			r.mu.Unlock()
			c.Close()
			t.Close()
			return
		default:
		}
		r.conns = append(r.conns, c, t)
		r.mu.Unlock()
		r.wg.Add(2)
		go r.pipe(t, c)
		go r.pipe(c, t)
	}
}

// pipe copies src to dst while the relay is not stalled, and closes both
// when either fails.
func (r *relay) pipe(dst, src net.Conn) {
	defer r.wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !r.pass() {
				return
			}
			_, werr := dst.Write(buf[:n])
			r.gate.RUnlock()
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// pass waits until the relay is not stalled and returns true with
// r.gate read-held (the caller writes, then releases it), or false once
// the relay is closed.
func (r *relay) pass() bool {
	for {
		r.gate.RLock()
		if !r.stalled {
			return true
		}
		ch := r.resumed
		r.gate.RUnlock()
		select {
		case <-ch:
		case <-r.done:
			return false
		}
	}
}
