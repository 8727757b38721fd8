package etcdtest

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A cluster of embedded members, for tests of what a client sees when one
// member crashes, stops, or becomes unreachable while a quorum answers.
//
// Each member is a Server: its own data directory, its own free ports on
// 127.0.0.1, and its own TCP relay in front of its client listener. The
// relay is also where faults are injected on the client side of one
// member, while the member itself stays in the cluster (its peer traffic
// is untouched):
//
//   - Cut closes every client connection and refuses new ones, as a host
//     that resets connections does;
//   - Stall blackholes them: connections stay open (and new ones are
//     accepted) but no byte moves in either direction, as when a host
//     vanishes from the network without resetting anything. A client
//     sees no error; its requests on that connection just never finish;
//   - Heal ends either.
//
// Peers reach a member through a relay too, which Stop closes after the
// member has stopped: etcd's peer HTTP clients keep idle connections that
// nothing else closes, and a test's leak check would find their
// goroutines.
//
// Members run with a 50 ms heartbeat and a 1 s election timeout, so that
// a loaded machine does not make them elect a new leader at random; the
// server's minimum lease TTL is then 1.5 s.

// StartCluster starts an n-member cluster on 127.0.0.1, each member with
// its own free ports and a data directory under tb.TempDir(), and waits
// until every member is ready (the cluster has a leader). tb.Cleanup
// stops every member. It calls tb.Fatal if the cluster does not start.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	c, err := NewCluster(tb.TempDir(), n)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// Cluster is n embedded etcd members forming one cluster. Its methods are
// safe for concurrent use.
type Cluster struct {
	// Members are the cluster's members, each a Server whose Stop,
	// Restart, Cut, Stall and Heal act on that member alone.
	Members []*Server
}

// NewCluster starts an n-member cluster whose members keep their data
// under dir (one subdirectory each), and waits until every member is
// ready. The caller stops it with Close; dir is left to the caller.
func NewCluster(dir string, n int) (*Cluster, error) {
	if n < 1 {
		return nil, fmt.Errorf("etcdtest: a cluster of %d members", n)
	}
	ports, err := freePorts(4 * n)
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	var initial []string
	for i := range n {
		m := newMember(fmt.Sprintf("%s/m%d", dir, i), fmt.Sprintf("m%d", i), ports[4*i:4*i+3])
		m.peerInner = url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", ports[4*i+3])}
		m.tickMs, m.electMs = 50, 1000
		c.Members = append(c.Members, m)
		initial = append(initial, m.name+"="+m.peerURL.String())
	}
	// Every member waits for the others to elect a leader: start them
	// together.
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, m := range c.Members {
		m.cluster = strings.Join(initial, ",")
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.start()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Endpoints returns every member's client URL, in member order.
func (c *Cluster) Endpoints() []string {
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.Endpoints()...)
	}
	return eps
}

// Client returns a new client that knows the members numbered members
// (indexes into Members), or every member if none is given; tb.Cleanup
// closes it. The client logs nothing.
func (c *Cluster) Client(tb testing.TB, members ...int) *clientv3.Client {
	tb.Helper()
	eps := c.Endpoints()
	if len(members) > 0 {
		eps = nil
		for _, i := range members {
			eps = append(eps, c.Members[i].Endpoints()...)
		}
	}
	cl, err := NewClient(eps)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cl.Close() })
	return cl
}

// Close stops every member, all at once.
func (c *Cluster) Close() {
	var wg sync.WaitGroup
	for _, m := range c.Members {
		wg.Go(m.Stop)
	}
	wg.Wait()
}

// Cut closes every client connection to s and refuses new ones until
// Heal: clients see errors at once and turn to the other members they
// know. The member stays in its cluster.
func (s *Server) Cut() {
	s.faults.set(true, false)
}

// Stall blackholes s's client connections until Heal: they stay open,
// new ones are accepted, and no byte moves in either direction; what was
// in flight is held and delivered after Heal. Clients see no error. The
// member stays in its cluster.
func (s *Server) Stall() {
	s.faults.set(false, true)
}

// Heal ends a Cut or a Stall: stalled connections move again (with what
// they held), new connections are relayed.
func (s *Server) Heal() {
	s.faults.set(false, false)
}

// Accepted returns how many client connections s's relay has accepted
// and relayed so far (not those a Cut refused), across restarts: a test
// can wait for a client to have reconnected.
func (s *Server) Accepted() int64 {
	return s.faults.accepted.Load()
}

// faults is the fault state of one member's relay.
type faults struct {
	accepted atomic.Int64 // connections relayed

	mu    sync.Mutex
	cut   bool
	stall chan struct{} // non-nil while stalled; closed by the end of the stall
	relay *relay        // the running relay, if any
}

// set makes the relay cut, stalled, or neither.
func (f *faults) set(cut, stall bool) {
	f.mu.Lock()
	f.cut = cut
	if f.stall != nil && !stall {
		close(f.stall)
		f.stall = nil
	}
	if stall && f.stall == nil {
		f.stall = make(chan struct{})
	}
	r := f.relay
	f.mu.Unlock()
	if cut && r != nil {
		r.cut()
	}
}

func (f *faults) isCut() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cut
}

// pass waits while the relay is stalled; it reports false if the
// connection must be closed instead: the relay was cut or closed.
func (f *faults) pass(done <-chan struct{}) bool {
	for {
		f.mu.Lock()
		cut, stall := f.cut, f.stall
		f.mu.Unlock()
		switch {
		case cut:
			return false
		case stall == nil:
			return true
		}
		select {
		case <-stall:
		case <-done:
			return false
		}
	}
}

func (f *faults) attach(r *relay) {
	f.mu.Lock()
	f.relay = r
	f.mu.Unlock()
}

func (f *faults) detach(r *relay) {
	f.mu.Lock()
	if f.relay == r {
		f.relay = nil
	}
	f.mu.Unlock()
}
