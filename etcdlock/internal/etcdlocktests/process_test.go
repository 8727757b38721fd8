package etcdlock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/flight"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/keylock/keylocktest/disttest"
	"github.com/fairlock/fairlock/owner"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// Tests across processes re-execute the test binary as workers
// (package disttest): TestMain sees a worker's environment and calls
// runWorker, which connects to the parent's embedded server
// (Worker.Server, its endpoints), makes a Locker on Worker.Prefix, does
// its role, reports on stdout one line per event, and exits. The tests
// every backend repeats are disttest's, run here on an etcd adapter
// (newBackend); what is etcd's alone stays below them.

// runWorker runs a worker process's role and returns its exit code: the
// roles of package disttest, or those of roles.
func runWorker(w disttest.Worker) int {
	client, err := etcdtest.NewClient(strings.Split(w.Server, ","))
	if err != nil {
		return w.Fail(err)
	}
	defer client.Close()
	l, err := etcdlock.New(client, w.Prefix, etcdlock.WithTTL(w.TTL))
	if err != nil {
		return w.Fail(err)
	}
	defer l.Close(context.Background())
	tools := disttest.Tools{Locker: l, Store: fencedLog{client, w.Prefix}, Cache: etcdStore[string]{client}}
	return w.Run(tools, func(ctx context.Context) error {
		run, ok := roles[w.Role]
		if !ok {
			return fmt.Errorf("unknown role %q", w.Role)
		}
		return run(ctx, client, l, w.Key)
	})
}

// roles are the worker roles that other test files add (in an init
// func; this one adds "count"), by name: each runs in a worker process
// with the worker's client, its Locker on the worker's prefix and key,
// and fails the worker with its error.
var roles = map[string]func(ctx context.Context, client *clientv3.Client, l *etcdlock.Locker, key string) error{}

// proc is a worker process.
type proc = disttest.Proc

// startWorker starts the test binary as a worker with role on the server
// at endpoints, with env added to its environment, where
// ETCDLOCK_TEST_PREFIX and ETCDLOCK_TEST_KEY name the worker's prefix
// and key; t.Cleanup kills it if it is still running.
func startWorker(t *testing.T, role string, endpoints []string, env ...string) *proc {
	t.Helper()
	w := disttest.Worker{Role: role, Server: strings.Join(endpoints, ","), TTL: testTTL}
	for _, e := range env {
		switch name, v, _ := strings.Cut(e, "="); name {
		case "ETCDLOCK_TEST_PREFIX":
			w.Prefix = v
		case "ETCDLOCK_TEST_KEY":
			w.Key = v
		}
	}
	return disttest.Start(t, w, env...)
}

// fencedLog is disttest's fenced store on etcd, for the Lockers on
// prefix: key's log is the value of /log/KEY, one entry a line, and a
// write is fenced by etcd itself, as IsOwner fences it: the grant's key
// (found in key's range by its creation revision, the token) must still
// exist with that revision when the transaction is applied. Counters
// are the keys /counters/NAME.
type fencedLog struct {
	c      *clientv3.Client
	prefix string
}

func (s fencedLog) Append(ctx context.Context, key string, token uint64, entry string) (bool, error) {
	grant, err := s.c.Get(ctx, rangeUnder(s.prefix, key), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithMinCreateRev(int64(token)), clientv3.WithMaxCreateRev(int64(token)))
	if err != nil || len(grant.Kvs) != 1 {
		return false, err // no key of the grant: it has ended
	}
	owner := clientv3.Compare(clientv3.CreateRevision(string(grant.Kvs[0].Key)), "=", int64(token))
	log := "/log/" + key
	for {
		resp, err := s.c.Get(ctx, log)
		if err != nil {
			return false, err
		}
		old, rev := "", int64(0)
		if len(resp.Kvs) > 0 {
			old, rev = string(resp.Kvs[0].Value), resp.Kvs[0].ModRevision
		}
		unchanged := clientv3.Compare(clientv3.ModRevision(log), "=", rev)
		tr, err := s.c.Txn(ctx).If(owner).
			Then(clientv3.OpTxn([]clientv3.Cmp{unchanged}, []clientv3.Op{clientv3.OpPut(log, old+entry+"\n")}, nil)).Commit()
		if err != nil || !tr.Succeeded {
			return false, err
		}
		if tr.Responses[0].GetResponseTxn().Succeeded {
			return true, nil
		}
	}
}

func (s fencedLog) Log(ctx context.Context, key string) ([]string, error) {
	resp, err := s.c.Get(ctx, "/log/"+key)
	if err != nil || len(resp.Kvs) == 0 {
		return nil, err
	}
	return strings.Split(strings.TrimSuffix(string(resp.Kvs[0].Value), "\n"), "\n"), nil
}

// Add adds n to the counter at /counters/NAME in a transaction on its
// mod revision, retried.
func (s fencedLog) Add(ctx context.Context, name string, n int64) (int64, error) {
	k := "/counters/" + name
	for {
		resp, err := s.c.Get(ctx, k)
		if err != nil {
			return 0, err
		}
		v, rev := int64(0), int64(0)
		if len(resp.Kvs) > 0 {
			v, _ = strconv.ParseInt(string(resp.Kvs[0].Value), 10, 64)
			rev = resp.Kvs[0].ModRevision
		}
		if n == 0 {
			return v, nil
		}
		tr, err := s.c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k), "=", rev)).
			Then(clientv3.OpPut(k, strconv.FormatInt(v+n, 10))).Commit()
		if err != nil {
			return 0, err
		}
		if tr.Succeeded {
			return v + n, nil
		}
	}
}

// countUnder returns the number of etcd keys under r.
func countUnder(t testing.TB, c *clientv3.Client, r string) int {
	t.Helper()
	resp, err := c.Get(context.Background(), r, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return int(resp.Count)
}

// newBackend is the disttest adapter of srv: every Locker, store and
// cache on a client of its own; a key's calls are the keys in its
// range; a process that stops is replaced within the TTL and a second
// (its lease's expiry, and the watch's event); a grant a worker holds is
// the only key in its range, created at the worker's token.
func newBackend(t testing.TB, srv *etcdtest.Server) disttest.Backend {
	admin := srv.Client(t)
	return disttest.Backend{
		Server: strings.Join(srv.Endpoints(), ","),
		TTL:    testTTL,
		Expiry: testTTL + time.Second,
		New: func(t testing.TB, prefix string) keylock.Locker {
			return newLocker(t, srv.Client(t), prefix)
		},
		Calls: func(t testing.TB, prefix, key string) int { return countUnder(t, admin, rangeUnder(prefix, key)) },
		Store: func(t testing.TB, prefix string) disttest.Store { return fencedLog{srv.Client(t), prefix} },
		Held: func(t testing.TB, prefix, key string, token uint64) {
			resp, err := admin.Get(context.Background(), rangeUnder(prefix, key), clientv3.WithPrefix())
			if err != nil || len(resp.Kvs) != 1 || uint64(resp.Kvs[0].CreateRevision) != token {
				t.Fatalf("the worker says it holds token %d; the keys of %q: %v (%v)", token, key, resp, err)
			}
		},
		Cache: func(t testing.TB) flight.Store[string] { return etcdStore[string]{srv.Client(t)} },
		Observed: func(t testing.TB, prefix, name string, o fairlock.Observer) keylock.Locker {
			return newLocker(t, srv.Client(t), prefix, etcdlock.WithDebug(), etcdlock.WithName(name), etcdlock.WithObserver(o))
		},
		Named: func(t testing.TB, prefix, name string, debug bool) keylock.Locker {
			opts := []etcdlock.Option{etcdlock.WithName(name)}
			if debug {
				opts = append(opts, etcdlock.WithDebug())
			}
			return newLocker(t, srv.Client(t), prefix, opts...)
		},
		WorkerName: "etcdlock-1",
		Kind:       "etcdlock.Locker",
	}
}

func init() {
	roles["count"] = func(ctx context.Context, client *clientv3.Client, l *etcdlock.Locker, key string) error {
		g, _ := strconv.Atoi(os.Getenv("ETCDLOCK_TEST_G"))
		m, _ := strconv.Atoi(os.Getenv("ETCDLOCK_TEST_M"))
		return countWorker(ctx, client, l, key, g, m)
	}
}

// countWorker runs g goroutines (each its own owner) that each lock key
// and increment a counter in etcd by a read and a write fenced with
// IsOwner, until each has made m increments. An occupancy key, created
// at each grant only if absent (and attached to the grant's lease, so
// that it goes with a lease that ends), and deleted with the increment,
// catches two holders at once. A grant lost on a loaded machine (its
// lease not renewed in time) is reported, and its increment redone.
func countWorker(ctx context.Context, client *clientv3.Client, l *etcdlock.Locker, key string, goroutines, m int) error {
	counter, occ := "/count/"+key, "/occupied/"+key
	errs := make(chan error, goroutines)
	for range goroutines {
		go func() {
			errs <- countLoop(owner.NewContext(ctx), client, l, key, counter, occ, m)
		}()
	}
	var err error
	for range goroutines {
		err = errors.Join(err, <-errs)
	}
	return err
}

// countLoop is one goroutine of countWorker.
func countLoop(ctx context.Context, client *clientv3.Client, l *etcdlock.Locker, key, counter, occ string, m int) error {
	for done := 0; done < m; {
		g, err := l.Lock(ctx, key)
		if err != nil {
			return err
		}
		// The grant's key, for its lease.
		resp, err := client.Get(ctx, os.Getenv("ETCDLOCK_TEST_PREFIX")+"/"+key+"/", clientv3.WithPrefix(),
			clientv3.WithMinCreateRev(int64(g.Token())), clientv3.WithMaxCreateRev(int64(g.Token())))
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 1 {
			if lostGrant(g) {
				continue
			}
			return fmt.Errorf("the grant's key is gone but Lost is open: %v", resp.Kvs)
		}
		tr, err := client.Txn(ctx).If(clientv3.Compare(clientv3.Version(occ), "=", 0)).
			Then(clientv3.OpPut(occ, strconv.FormatUint(g.Token(), 10), clientv3.WithLease(clientv3.LeaseID(resp.Kvs[0].Lease)))).
			Else(clientv3.OpGet(occ)).Commit()
		if err != nil {
			if lostGrant(g) {
				continue
			}
			return err
		}
		if !tr.Succeeded {
			fmt.Printf("violation: grant %d found the occupancy key %q\n", g.Token(), tr.Responses[0].GetResponseRange().Kvs[0].Value)
		}
		got, err := client.Get(ctx, counter)
		if err != nil {
			return err
		}
		n := 0
		if len(got.Kvs) > 0 {
			n, _ = strconv.Atoi(string(got.Kvs[0].Value))
		}
		tr, err = client.Txn(ctx).If(isOwner(g)).
			Then(clientv3.OpPut(counter, strconv.Itoa(n+1)), clientv3.OpDelete(occ)).Commit()
		if err != nil {
			return err
		}
		if !tr.Succeeded {
			if lostGrant(g) {
				continue
			}
			return errors.New("fenced increment refused while Lost is open")
		}
		done++
		if err := g.Unlock(ctx); err != nil && !(errors.Is(err, etcdlock.ErrLost) && lostGrant(g)) {
			return err
		}
	}
	return nil
}

// lostGrant reports whether g's Lost closes within 5 s, and if so says so
// on stdout and releases g.
func lostGrant(g keylock.Lease) bool {
	select {
	case <-g.Lost():
		fmt.Println("lost: grant", g.Token(), "lost its lease")
		_ = g.Unlock(context.Background())
		return true
	case <-time.After(5 * time.Second):
		return false
	}
}

// TestDistributed runs package disttest's checks, each on a server of
// its own: worker processes granted in FIFO order; a holder process
// killed, or stopped past its TTL (keylock.Valid false at once when it
// resumes, before its Lost closes); dead waiters that do not add up; one
// fill of a flight.Cache across processes, also with the filler killed;
// the debug views and the Observer.
func TestDistributed(t *testing.T) {
	disttest.Run(t, func(t *testing.T) disttest.Backend { return newBackend(t, etcdtest.StartServer(t)) })
}

// TestProcessesExclusion: three processes of four goroutines each
// increment a counter in etcd under the lock, by a read and a write
// fenced with IsOwner; the count is exact, and the occupancy key never
// finds two holders.
func TestProcessesExclusion(t *testing.T) {
	srv := etcdtest.StartServer(t)
	c := srv.Client(t)
	const procs, goroutines, m = 3, 4, 8
	var ps []*proc
	for range procs {
		ps = append(ps, startWorker(t, "count", srv.Endpoints(), "ETCDLOCK_TEST_PREFIX=/pcount",
			"ETCDLOCK_TEST_KEY=hot", "ETCDLOCK_TEST_G="+strconv.Itoa(goroutines), "ETCDLOCK_TEST_M="+strconv.Itoa(m)))
	}
	for _, p := range ps {
		for _, line := range p.Wait(t, 90*time.Second) {
			if strings.HasPrefix(line, "lost:") {
				t.Log("worker:", line) // a loaded machine; the increment was redone
				continue
			}
			t.Errorf("worker: %s", line)
		}
	}
	resp, err := c.Get(context.Background(), "/count/hot")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("counter: %v %v", resp, err)
	}
	if got, want := string(resp.Kvs[0].Value), strconv.Itoa(procs*goroutines*m); got != want {
		t.Fatalf("count %s, want %s", got, want)
	}
	waitKeys(t, c, "/pcount/", 0, 10*time.Second)
}

// answered is a gRPC interceptor that, once armed, closes done when a
// transaction that writes a key has been answered.
type answered struct {
	once  sync.Once
	armed atomic.Bool
	done  chan struct{}
}

func (a *answered) arm() { a.armed.Store(true) }

func (a *answered) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoke(ctx, method, req, reply, cc, opts...)
	if tr, ok := req.(*etcdserverpb.TxnRequest); ok && err == nil && a.armed.Load() {
		for _, op := range append(tr.Success, tr.Failure...) {
			if op.GetRequestPut() != nil {
				a.once.Do(func() { close(a.done) })
			}
		}
	}
	return err
}

// TestServerRestart: the server stops and restarts on the same data
// within the TTL while one Locker holds a key and another waits. The
// holder keeps its grant or sees Lost; never are both grants current.
func TestServerRestart(t *testing.T) {
	srv := etcdtest.StartServer(t)
	ca := srv.Client(t)
	// b's client says when b's enqueueing transaction has been answered:
	// its key shows up in etcd a little before that, and a Stop in
	// between fails b's Lock with the transaction's error (its outcome
	// unknown to b), as Lock documents.
	enq := &answered{done: make(chan struct{})}
	cb := interceptedClient(t, srv, enq.intercept) // closed after lb
	// A TTL that outlasts the outage as the clients see it: the stop,
	// the restart and gRPC's first reconnection delay (about 1 s).
	const ttl = 5 * time.Second
	la := newLocker(t, ca, "/restart", etcdlock.WithTTL(ttl))
	lb := newLocker(t, cb, "/restart", etcdlock.WithTTL(ttl))
	ctx := context.Background()
	ga := mustLock(t, ctx, la, "k")
	var mu sync.Mutex
	var gb keylock.Lease
	enq.arm()
	bDone := make(chan error, 1)
	go func() {
		g, err := lb.Lock(ctx, "k")
		mu.Lock()
		gb = g
		mu.Unlock()
		bDone <- err
	}()
	waitKeys(t, ca, "/restart/", 2, 10*time.Second)
	select {
	case <-enq.done:
	case <-time.After(10 * time.Second):
		t.Fatal("b's enqueueing transaction was not answered")
	}

	srv.Stop()
	time.Sleep(300 * time.Millisecond) // the outage: shorter than the TTL
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}

	// Both grants are never current at once: IsOwner of a and of b in
	// one transaction never both hold.
	deadline := time.Now().Add(3 * time.Second)
	aLost := false
	for time.Now().Before(deadline) {
		mu.Lock()
		b := gb
		mu.Unlock()
		if b != nil {
			tr, err := ca.Txn(ctx).If(isOwner(ga), isOwner(b)).Commit()
			if err == nil && tr.Succeeded {
				t.Fatal("two current grants")
			}
		}
		select {
		case <-ga.Lost():
			aLost = true
		default:
		}
		if b != nil && !aLost {
			// b was granted: a's key is gone, and a must learn it.
			select {
			case <-ga.Lost():
				aLost = true
			case <-time.After(5 * time.Second):
				t.Fatal("b holds, a's Lost did not close")
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("after the restart: holder lost its grant: %v", aLost)
	if !aLost {
		tr, err := ca.Txn(ctx).If(isOwner(ga)).Commit()
		if err != nil || !tr.Succeeded {
			t.Fatalf("a's Lost is open but its grant is not current: %v %v", tr, err)
		}
	}
	err := ga.Unlock(ctx)
	if aLost != errors.Is(err, etcdlock.ErrLost) || (!aLost && err != nil) {
		t.Fatalf("a's Unlock: %v (lost: %v)", err, aLost)
	}
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	tr, err := cb.Txn(ctx).If(isOwner(gb)).Then(clientv3.OpPut("/data", "b")).Commit()
	if err != nil || !tr.Succeeded {
		t.Fatalf("b's fenced write: %v %v", tr, err)
	}
	mustUnlock(t, ctx, gb)
	// Both Lockers go on working.
	for _, l := range []*etcdlock.Locker{la, lb} {
		g := mustLock(t, ctx, l, "k")
		mustUnlock(t, ctx, g)
	}
	waitKeys(t, ca, "/restart/", 0, 10*time.Second)
}

// TestOutageLongerThanTTL: the server is down for longer than the TTL.
// The holder cannot renew its lease and sees Lost by the lease's
// deadline; after the restart its Unlock returns ErrLost (and deletes
// the key if the lease outlived the outage), and the Locker works again
// on a new lease.
func TestOutageLongerThanTTL(t *testing.T) {
	srv := etcdtest.StartServer(t)
	ca, cb := srv.Client(t), srv.Client(t)
	la, lb := newLocker(t, ca, "/outage"), newLocker(t, cb, "/outage")
	ctx := context.Background()
	ga := mustLock(t, ctx, la, "k")
	srv.Stop()
	stopped := time.Now()
	awaitLost(t, ga, testTTL+5*time.Second, "after the server stopped, down for longer than the TTL")
	t.Logf("Lost closed %v after the server stopped (TTL %v)", time.Since(stopped), testTTL)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := ga.Unlock(uctx); !errors.Is(err, etcdlock.ErrLost) {
		t.Fatalf("Unlock after the outage: %v, want ErrLost", err)
	}
	for _, l := range []*etcdlock.Locker{lb, la} {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		g, err := l.Lock(lctx, "k")
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		mustUnlock(t, ctx, g)
	}
	waitKeys(t, ca, "/outage/", 0, 10*time.Second)
}
