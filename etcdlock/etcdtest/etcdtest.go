// Package etcdtest starts a real etcd server inside the test process
// (go.etcd.io/etcd/server/v3/embed), for tests of code that uses etcd:
// package etcdlock's own tests, and yours. No mocks: the server is the one
// etcd ships, single-node, on the loopback interface; or, with
// StartCluster, a cluster of several members, one of which a test can
// stop, restart, cut off or blackhole from its clients (cluster.go).
//
// # Usage
//
//	func TestSomething(t *testing.T) {
//		client := etcdtest.Start(t) // stopped by t.Cleanup
//		l, err := etcdlock.New(client, "/locks", etcdlock.WithTTL(2*time.Second))
//		...
//	}
//
// The server runs with a 10 ms heartbeat and a 100 ms election timeout,
// so it elects itself at once. Its data
// directory is tb.TempDir(); fsync stays on, so commit latencies are those
// of a real single-node server on that disk.
//
// Clients reach the server through a TCP relay in the test process, on
// the advertised client port. Server.Stop cuts every client connection at
// once, as a crash or a network failure would, instead of letting the
// server's graceful stop hold open streams (watches, lease keep-alives)
// for its 5 s request timeout; the relay adds one loopback hop to each
// request.
package etcdtest

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// startTimeout bounds how long a server may take to become ready.
const startTimeout = 30 * time.Second

// Start starts a server on 127.0.0.1 with free ports and a temporary data
// directory, and returns a client connected to it. tb.Cleanup closes the
// client and stops the server. It calls tb.Fatal if the server does not
// start.
func Start(tb testing.TB) *clientv3.Client {
	tb.Helper()
	return StartServer(tb).Client(tb)
}

// StartServer starts a server like Start and returns it, for tests that
// need several clients, the endpoints (to hand to other processes), or a
// stop and restart on the same data. tb.Cleanup stops it.
func StartServer(tb testing.TB) *Server {
	tb.Helper()
	s, err := NewServer(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Server is one embedded etcd server: a single-node one (StartServer), or
// one member of a Cluster. Its methods are safe for concurrent use.
type Server struct {
	dir       string
	name      string  // the member's name in its cluster
	cluster   string  // the initial cluster: name=peerURL,...
	clientURL url.URL // the relay's: what clients dial
	innerURL  url.URL // the server's own client listener
	peerURL   url.URL // what peers dial: a relay for a cluster's member
	peerInner url.URL // a cluster member's own peer listener; empty: peerURL
	tickMs    uint    // raft heartbeat
	electMs   uint    // raft election timeout
	faults    *faults

	mu        sync.Mutex // guards e, relay and peerRelay
	e         *embed.Etcd
	relay     *relay
	peerRelay *relay // a cluster member's: cut on Stop, see NewCluster
}

// NewServer starts a server whose data lives in dir (created if missing),
// listening on 127.0.0.1 at free ports, and waits until it is ready. The
// caller stops it with Close; dir is left to the caller. Programs that are
// not tests (the etcdlock cluster demo) use it directly.
func NewServer(dir string) (*Server, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	s := newMember(dir, "etcdtest", ports)
	s.cluster = s.name + "=" + s.peerURL.String()
	s.tickMs, s.electMs = 10, 100
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

// Endpoints returns the client URLs to give clientv3.Config.Endpoints.
// They stay the same across Stop and Restart.
func (s *Server) Endpoints() []string { return []string{s.clientURL.String()} }

// Client returns a new client of the server; tb.Cleanup closes it. The
// client logs nothing.
func (s *Server) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	c, err := NewClient(s.Endpoints())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// NewClient returns a client of endpoints that logs nothing, with a 5 s
// dial timeout. The caller closes it.
func NewClient(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
}

// Stop stops the server and keeps its data directory and ports, for a
// later Restart. It first cuts every client connection, so that clients
// see the server gone at once, and stops a cluster's member without a
// word to its peers (no leadership transfer), as after a crash; they keep retrying
// (gRPC's reconnection backoff: about 1 s, then 1.6 s, 2.6 s…). Stopping a
// stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	e, r, pr := s.e, s.relay, s.peerRelay
	s.e, s.relay, s.peerRelay = nil, nil, nil
	s.mu.Unlock()
	if r != nil {
		r.close()
	}
	if e != nil {
		e.Server.HardStop()
		e.Close()
	}
	if pr != nil {
		pr.close()
	}
}

// Restart starts a stopped server again on the same data directory and
// ports, and waits until it is ready. Leases survive a restart: the new
// leader extends every lease by its TTL.
func (s *Server) Restart() error {
	s.mu.Lock()
	running := s.e != nil
	s.mu.Unlock()
	if running {
		return errors.New("etcdtest: Restart of a running server")
	}
	return s.start()
}

// Close stops the server. It is Stop under the name tb.Cleanup expects.
func (s *Server) Close() { s.Stop() }

// newMember returns the unstarted member name whose data lives in dir,
// on ports: the relay's, the server's client listener, the peer listener.
func newMember(dir, name string, ports []int) *Server {
	return &Server{
		dir:       dir,
		name:      name,
		clientURL: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[0])},
		innerURL:  url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[1])},
		peerURL:   url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2])},
		faults:    &faults{},
	}
}

// start starts the embedded server on s's directory and ports. A member
// of a cluster is ready once the cluster has a leader.
func (s *Server) start() error {
	cfg := embed.NewConfig()
	cfg.Name = s.name
	cfg.Dir = s.dir
	cfg.ListenClientUrls = []url.URL{s.innerURL}
	cfg.AdvertiseClientUrls = []url.URL{s.clientURL}
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{s.peerURL}
	var pr *relay
	if s.peerInner.Host != "" {
		var err error
		if pr, err = newRelay(s.peerURL.Host, s.peerInner.Host, &faults{}); err != nil {
			return err
		}
		cfg.ListenPeerUrls = []url.URL{s.peerInner}
	}
	closePeer := func() {
		if pr != nil {
			pr.close()
		}
	}
	cfg.InitialCluster = s.cluster
	cfg.TickMs = s.tickMs
	cfg.ElectionMs = s.electMs
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		closePeer()
		return fmt.Errorf("etcdtest: start: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		closePeer()
		return fmt.Errorf("etcdtest: start: %w", err)
	case <-time.After(startTimeout):
		e.Close()
		closePeer()
		return fmt.Errorf("etcdtest: server not ready after %v", startTimeout)
	}
	r, err := newRelay(s.clientURL.Host, s.innerURL.Host, s.faults)
	if err != nil {
		e.Close()
		closePeer()
		return err
	}
	s.mu.Lock()
	s.e, s.relay, s.peerRelay = e, r, pr
	s.mu.Unlock()
	return nil
}

// relay forwards TCP connections from its listener to the server, and
// cuts them all on close. Its faults (see Server.Stall and Server.Cut)
// belong to the Server and outlive a restart.
type relay struct {
	ln     net.Listener
	target string
	faults *faults
	wg     sync.WaitGroup // the accept loop and two copiers per connection
	done   chan struct{}  // closed by close: wakes stalled copiers

	mu     sync.Mutex // guards conns and closed
	conns  map[net.Conn]struct{}
	closed bool
}

func newRelay(addr, target string, f *faults) (*relay, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: relay: %w", err)
	}
	r := &relay{ln: ln, target: target, faults: f, done: make(chan struct{}), conns: make(map[net.Conn]struct{})}
	f.attach(r)
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

func (r *relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		if r.faults.isCut() {
			_ = c.Close() // refused, as by a host that resets connections
			continue
		}
		s, err := net.Dial("tcp", r.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !r.track(c, s) {
			return
		}
		r.faults.accepted.Add(1)
		r.wg.Add(2)
		go r.pipe(c, s)
		go r.pipe(s, c)
	}
}

// track records a relayed pair, or closes it and reports false if the
// relay is closed.
func (r *relay) track(cs ...net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		r.conns[c] = struct{}{}
	}
	return true
}

// pipe copies from src to dst until either fails, then closes both.
// While the relay is stalled it holds what it read: the connection stays
// open and nothing moves.
func (r *relay) pipe(dst, src net.Conn) {
	defer r.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !r.faults.pass(r.done) {
				break
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = dst.Close()
	_ = src.Close()
	r.mu.Lock()
	delete(r.conns, dst)
	delete(r.conns, src)
	r.mu.Unlock()
}

// cut closes every relayed connection, and keeps the listener.
func (r *relay) cut() {
	r.mu.Lock()
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
}

// close stops accepting and cuts every relayed connection.
func (r *relay) close() {
	_ = r.ln.Close()
	r.mu.Lock()
	r.closed = true
	close(r.done)
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.faults.detach(r)
	r.wg.Wait()
}

// freePorts returns n distinct TCP ports that were free on 127.0.0.1 an
// instant ago. Another process may take one before the server binds it;
// the server then fails to start with "address already in use".
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("etcdtest: free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
