package etcdlock_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// Tests across processes re-execute the test binary as workers: TestMain
// sees workerEnv and calls runWorker, which connects to the parent's
// embedded server (ETCDLOCK_TEST_ENDPOINTS), does its role, reports on
// stdout one line per event, and exits.

// runWorker runs a worker process's role and returns its exit code.
func runWorker(role string) int {
	client, err := etcdtest.NewClient(strings.Split(os.Getenv("ETCDLOCK_TEST_ENDPOINTS"), ","))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer client.Close()
	ttl, _ := time.ParseDuration(os.Getenv("ETCDLOCK_TEST_TTL"))
	l, err := etcdlock.New(client, os.Getenv("ETCDLOCK_TEST_PREFIX"), etcdlock.WithTTL(ttl))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer l.Close(context.Background())
	key := os.Getenv("ETCDLOCK_TEST_KEY")
	ctx := context.Background()
	switch role {
	case "fifo":
		err = fifoWorker(ctx, client, l, key, os.Getenv("ETCDLOCK_TEST_ID"))
	case "count":
		g, _ := strconv.Atoi(os.Getenv("ETCDLOCK_TEST_G"))
		m, _ := strconv.Atoi(os.Getenv("ETCDLOCK_TEST_M"))
		err = countWorker(ctx, client, l, key, g, m)
	case "hold":
		var g keylock.Lease
		if g, err = l.Lock(ctx, key); err == nil {
			fmt.Println("held", g.Token())
			select {} // until killed
		}
	default:
		if run, ok := roles[role]; ok {
			err = run(ctx, client, l, key)
		} else {
			err = fmt.Errorf("unknown role %q", role)
		}
	}
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	return 0
}

// roles are the worker roles that other test files add (flight_test.go
// does, in its init), by name: each runs in a worker process with the
// worker's client, its Locker on ETCDLOCK_TEST_PREFIX and
// ETCDLOCK_TEST_KEY, and fails the worker with its error.
var roles = map[string]func(ctx context.Context, client *clientv3.Client, l *etcdlock.Locker, key string) error{}

// fifoWorker locks key once and appends "id:token" to the log key with a
// write fenced by the grant: the log is the grant order.
func fifoWorker(ctx context.Context, client *clientv3.Client, l *etcdlock.Locker, key, id string) error {
	g, err := l.Lock(ctx, key)
	if err != nil {
		return err
	}
	resp, err := client.Get(ctx, "/log/"+key)
	if err != nil {
		return err
	}
	old := ""
	if len(resp.Kvs) > 0 {
		old = string(resp.Kvs[0].Value)
	}
	entry := fmt.Sprintf("%s:%d ", id, g.Token())
	tr, err := client.Txn(ctx).If(isOwner(g)).Then(clientv3.OpPut("/log/"+key, old+entry)).Commit()
	if err != nil {
		return err
	}
	if !tr.Succeeded {
		return errors.New("fenced append failed")
	}
	fmt.Println("granted", id, g.Token())
	return g.Unlock(ctx)
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

// proc is a worker process.
type proc struct {
	cmd   *exec.Cmd
	lines chan string // its stdout, line by line; closed at EOF
	done  chan error  // its exit
}

// startWorker starts the test binary as a worker with role and the given
// environment; t.Cleanup kills it if it is still running.
func startWorker(t *testing.T, role string, endpoints []string, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerEnv+"="+role,
		"ETCDLOCK_TEST_ENDPOINTS="+strings.Join(endpoints, ","),
		"ETCDLOCK_TEST_TTL="+testTTL.String())
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, lines: make(chan string, 100), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		for range p.lines {
		}
		<-p.done
	})
	return p
}

// wait waits for the worker to exit and returns its output lines; it
// fails the test if the worker fails or takes longer than d.
func (p *proc) wait(t *testing.T, d time.Duration) []string {
	t.Helper()
	var lines []string
	timeout := time.After(d)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				if err := <-p.done; err != nil {
					t.Fatalf("worker: %v; output %q", err, lines)
				}
				p.done <- nil // for Cleanup
				return lines
			}
			lines = append(lines, line)
		case <-timeout:
			t.Fatalf("worker still running after %v; output %q", d, lines)
		}
	}
}

// TestProcessesFIFO: four worker processes queue on one key in a known
// order (each one's key is seen under the prefix before the next starts),
// behind a holder in this process, and are granted in that order with
// strictly increasing tokens.
func TestProcessesFIFO(t *testing.T) {
	srv := etcdtest.StartServer(t)
	c := srv.Client(t)
	l := newLocker(t, c, "/pfifo")
	ctx := context.Background()
	g := mustLock(t, ctx, l, "hot")
	const n = 4
	var procs []*proc
	for i := range n {
		procs = append(procs, startWorker(t, "fifo", srv.Endpoints(),
			"ETCDLOCK_TEST_PREFIX=/pfifo", "ETCDLOCK_TEST_KEY=hot", "ETCDLOCK_TEST_ID="+strconv.Itoa(i)))
		waitKeys(t, c, "/pfifo/", i+2, 30*time.Second)
	}
	mustUnlock(t, ctx, g)
	for _, p := range procs {
		p.wait(t, 60*time.Second)
	}
	resp, err := c.Get(ctx, "/log/hot")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("log: %v %v", resp, err)
	}
	entries := strings.Fields(string(resp.Kvs[0].Value))
	t.Logf("grant log: %q", entries)
	if len(entries) != n {
		t.Fatalf("%d grants logged, want %d", len(entries), n)
	}
	last := g.Token()
	for i, e := range entries {
		id, tok, _ := strings.Cut(e, ":")
		token, _ := strconv.ParseUint(tok, 10, 64)
		if id != strconv.Itoa(i) {
			t.Errorf("grant %d went to worker %s, queued %d-th", i, id, i)
		}
		if token <= last {
			t.Errorf("grant %d: token %d after %d", i, token, last)
		}
		last = token
	}
	waitKeys(t, c, "/pfifo/", 0, 10*time.Second)
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
		for _, line := range p.wait(t, 90*time.Second) {
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

// TestProcessKilled: a holder process killed with SIGKILL stops renewing;
// its lease expires and the next waiter is granted within TTL + 1 s; a
// write fenced with the dead grant is refused.
func TestProcessKilled(t *testing.T) {
	srv := etcdtest.StartServer(t)
	c := srv.Client(t)
	p := startWorker(t, "hold", srv.Endpoints(), "ETCDLOCK_TEST_PREFIX=/kill", "ETCDLOCK_TEST_KEY=hot")
	var line string
	select {
	case line = <-p.lines:
	case <-time.After(30 * time.Second):
		t.Fatal("the worker did not report its grant")
	}
	if !strings.HasPrefix(line, "held ") {
		t.Fatalf("worker: %q", line)
	}
	resp, err := c.Get(context.Background(), "/kill/", clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("%v %v", resp, err)
	}
	dead := resp.Kvs[0]
	if line != fmt.Sprint("held ", dead.CreateRevision) {
		t.Fatalf("worker says %q; its key's revision is %d", line, dead.CreateRevision)
	}
	l := newLocker(t, c, "/kill")
	waiter := startLock(context.Background(), l.Lock, "hot")
	waitKeys(t, c, "/kill/", 2, 10*time.Second)
	killed := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	g, err := waiter.within(t, testTTL+10*time.Second, "the waiter, once the holder was killed")
	if err != nil {
		t.Fatalf("the waiter: %v", err)
	}
	took := waiter.at.Sub(killed)
	t.Logf("granted %v after SIGKILL (TTL %v)", took, testTTL)
	if took > testTTL+time.Second {
		t.Errorf("granted %v after SIGKILL, more than TTL + 1 s", took)
	}
	fenced := clientv3.Compare(clientv3.CreateRevision(string(dead.Key)), "=", dead.CreateRevision)
	tr, err := c.Txn(context.Background()).If(fenced).Then(clientv3.OpPut("/data", "dead")).Commit()
	if err != nil || tr.Succeeded {
		t.Fatalf("write fenced with the dead grant: %v %v", tr, err)
	}
	if g.Token() <= uint64(dead.CreateRevision) {
		t.Fatalf("token %d after the dead grant's %d", g.Token(), dead.CreateRevision)
	}
	mustUnlock(t, context.Background(), g)
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
