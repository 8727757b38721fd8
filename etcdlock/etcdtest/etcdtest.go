// Package etcdtest starts a real etcd server inside the test process
// (go.etcd.io/etcd/server/v3/embed), for tests of code that uses etcd:
// package etcdlock's own tests, and yours. No mocks: the server is the one
// etcd ships, single-node, on the loopback interface.
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
	"io"
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

// Server is one embedded single-node etcd server. Its methods are safe for
// concurrent use.
type Server struct {
	dir       string
	clientURL url.URL // the relay's: what clients dial
	innerURL  url.URL // the server's own client listener
	peerURL   url.URL

	mu    sync.Mutex // guards e and relay
	e     *embed.Etcd
	relay *relay
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
	s := &Server{
		dir:       dir,
		clientURL: url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[0])},
		innerURL:  url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[1])},
		peerURL:   url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[2])},
	}
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
// see the server gone at once, as after a crash; they keep retrying
// (gRPC's reconnection backoff: about 1 s, then 1.6 s, 2.6 s…). Stopping a
// stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	e, r := s.e, s.relay
	s.e, s.relay = nil, nil
	s.mu.Unlock()
	if r != nil {
		r.close()
	}
	if e != nil {
		e.Close()
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

// start starts the embedded server on s's directory and ports.
func (s *Server) start() error {
	cfg := embed.NewConfig()
	cfg.Name = "etcdtest"
	cfg.Dir = s.dir
	cfg.ListenClientUrls = []url.URL{s.innerURL}
	cfg.AdvertiseClientUrls = []url.URL{s.clientURL}
	cfg.ListenPeerUrls = []url.URL{s.peerURL}
	cfg.AdvertisePeerUrls = []url.URL{s.peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.TickMs = 10
	cfg.ElectionMs = 100
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("etcdtest: start: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcdtest: start: %w", err)
	case <-time.After(startTimeout):
		e.Close()
		return fmt.Errorf("etcdtest: server not ready after %v", startTimeout)
	}
	r, err := newRelay(s.clientURL.Host, s.innerURL.Host)
	if err != nil {
		e.Close()
		return err
	}
	s.mu.Lock()
	s.e, s.relay = e, r
	s.mu.Unlock()
	return nil
}

// relay forwards TCP connections from its listener to the server, and
// cuts them all on close.
type relay struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup // the accept loop and two copiers per connection

	mu     sync.Mutex // guards conns and closed
	conns  map[net.Conn]struct{}
	closed bool
}

func newRelay(addr, target string) (*relay, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("etcdtest: relay: %w", err)
	}
	r := &relay{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
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
		s, err := net.Dial("tcp", r.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !r.track(c, s) {
			return
		}
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
func (r *relay) pipe(dst, src net.Conn) {
	defer r.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	r.mu.Lock()
	delete(r.conns, dst)
	delete(r.conns, src)
	r.mu.Unlock()
}

// close stops accepting and cuts every relayed connection.
func (r *relay) close() {
	_ = r.ln.Close()
	r.mu.Lock()
	r.closed = true
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
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
