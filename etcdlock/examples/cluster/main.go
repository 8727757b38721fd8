// Command cluster shows etcdlock across processes. It starts an embedded
// etcd server (or uses -endpoints), then:
//
//  1. runs three worker processes whose goroutines contend on a few hot
//     keys, each grant recorded in etcd by a write fenced with the grant
//     (IsOwner), and checks that every key was granted in the order its
//     callers queued (their keys' creation revisions) and that no fenced
//     write was refused; it prints the grants per process;
//  2. measures the hand-off to a freshly queued waiter on another client,
//     for etcdlock and for etcd's concurrency.Mutex side by side;
//  3. kills a holder process with SIGKILL and prints how long the next
//     waiter took to be granted (the lease TTL, plus the server's expiry
//     scan), and that a write fenced with the dead grant is refused.
//
// Run it from the etcdlock folder (a module of its own, etcdlock/examples,
// in the workspace):
//
//	go run ./examples/cluster
//
// It runs three phases (contention for -contend, 3 s by default, the hand-off rounds,
// and a killed holder, which lasts one lease TTL) and exits non-zero if a
// check fails.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fairlock/fairlock/etcdlock"
	"github.com/fairlock/fairlock/etcdlock/etcdtest"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

var (
	endpoints  = flag.String("endpoints", "", "comma-separated etcd endpoints; empty: start an embedded server")
	procs      = flag.Int("procs", 3, "worker processes")
	goroutines = flag.Int("goroutines", 4, "goroutines per worker process")
	hotKeys    = flag.Int("keys", 3, "hot keys")
	contend    = flag.Duration("contend", 3*time.Second, "how long the workers contend")
	rounds     = flag.Int("rounds", 30, "hand-off rounds per implementation")
	ttl        = flag.Duration("ttl", 2*time.Second, "lease TTL of every Locker")
	run        = flag.String("run", strconv.FormatInt(time.Now().UnixNano(), 36), "run id: the demo's keys live under /cluster-demo/<run>/")
	worker     = flag.String("worker", "", "internal: run as a worker process (contend or hold)")
)

func main() {
	flag.Parse()
	if *worker != "" {
		if err := runWorker(*worker); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		return
	}
	if err := demo(); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

// root is where this run's keys live.
func root() string { return "/cluster-demo/" + *run + "/" }

func demo() error {
	eps := strings.Split(*endpoints, ",")
	if *endpoints == "" {
		dir, err := os.MkdirTemp("", "etcdlock-cluster-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		start := time.Now()
		srv, err := etcdtest.NewServer(dir)
		if err != nil {
			return err
		}
		defer srv.Close()
		eps = srv.Endpoints()
		fmt.Printf("etcd: embedded server at %s, started in %v\n", eps[0], time.Since(start).Round(time.Millisecond))
	} else {
		fmt.Printf("etcd: %s\n", *endpoints)
	}
	*endpoints = strings.Join(eps, ",")
	client, err := etcdtest.NewClient(eps)
	if err != nil {
		return err
	}
	defer client.Close()
	defer func() {
		_, _ = client.Delete(context.Background(), root(), clientv3.WithPrefix())
	}()

	failed := false
	ok, err := contention(client)
	if err != nil {
		return err
	}
	failed = failed || !ok
	if err := handOffs(client, eps); err != nil {
		return err
	}
	ok, err = killHolder(client)
	if err != nil {
		return err
	}
	failed = failed || !ok
	if failed {
		return errors.New("a check failed")
	}
	return nil
}

// contention runs the worker processes on the hot keys and checks the
// grant log.
func contention(client *clientv3.Client) (bool, error) {
	fmt.Printf("\ncontention: %d processes × %d goroutines on %d hot keys for %v (lease TTL %v)\n",
		*procs, *goroutines, *hotKeys, *contend, *ttl)
	var ws []*proc
	for range *procs {
		p, err := startProc("contend")
		if err != nil {
			return false, err
		}
		ws = append(ws, p)
	}
	ok := true
	for i, p := range ws {
		lines, err := p.wait()
		if err != nil {
			return false, err
		}
		for _, line := range lines {
			fmt.Printf("  process %d (pid %d): %s\n", i+1, p.cmd.Process.Pid, line)
			if !strings.Contains(line, " 0 fenced writes refused") {
				ok = false
			}
		}
	}
	// The grant log: one key per grant, written under the grant with
	// If(IsOwner), so the log's order (mod revisions) is the grant order
	// and its values are the grants' tokens: the order they queued in.
	resp, err := client.Get(context.Background(), root()+"log/", clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortAscend))
	if err != nil {
		return false, err
	}
	last := map[string]uint64{}
	grants := 0
	for _, kv := range resp.Kvs {
		key, _, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), root()+"log/"), "/")
		tok, _ := strconv.ParseUint(string(kv.Value), 10, 64)
		if tok <= last[key] {
			fmt.Printf("  FIFO check: FAILED: key %s granted token %d after %d\n", key, tok, last[key])
			ok = false
		}
		last[key] = tok
		grants++
	}
	if ok {
		fmt.Printf("  FIFO check: ok: %d grants on %d keys, each key granted in the order its callers queued (tokens increase in grant order), no fenced write refused while held\n",
			grants, len(last))
	}
	return ok, nil
}

// handOffs measures the hand-off to a freshly queued waiter for etcdlock
// and concurrency.Mutex, alternating, with the holder and the waiter on
// different clients.
func handOffs(client *clientv3.Client, eps []string) error {
	var impls [2][2]etcdtest.LockFunc // [etcdlock, mutex][holder, waiter]
	for side := range 2 {
		c, err := etcdtest.NewClient(eps)
		if err != nil {
			return err
		}
		defer c.Close()
		l, err := etcdlock.New(c, root()+"etcdlock", etcdlock.WithTTL(*ttl))
		if err != nil {
			return err
		}
		defer l.Close(context.Background())
		s, err := concurrency.NewSession(c, concurrency.WithTTL(int(ttl.Seconds()+0.5)))
		if err != nil {
			return err
		}
		defer s.Close()
		impls[0][side] = func(ctx context.Context) (func(), error) {
			g, err := l.Lock(ctx, "handoff")
			if err != nil {
				return nil, err
			}
			return func() { _ = g.Unlock(ctx) }, nil
		}
		impls[1][side] = func(ctx context.Context) (func(), error) {
			m := concurrency.NewMutex(s, root()+"mutex/handoff")
			if err := m.Lock(ctx); err != nil {
				return nil, err
			}
			return func() { _ = m.Unlock(ctx) }, nil
		}
	}
	ranges := [2]string{root() + "etcdlock/handoff/", root() + "mutex/handoff/"}
	var samples [2][]time.Duration
	for range *rounds {
		for i := range 2 {
			d, err := etcdtest.HandOff(context.Background(), client, impls[i][0], impls[i][1], ranges[i])
			if err != nil {
				return err
			}
			samples[i] = append(samples[i], d)
		}
	}
	var p50, p99 [2]time.Duration
	for i := range 2 {
		slices.Sort(samples[i])
		p50[i], p99[i] = etcdtest.Quantile(samples[i], 0.5), etcdtest.Quantile(samples[i], 0.99)
	}
	fmt.Printf("\nhand-off to a freshly queued waiter, %d rounds each (holder's Unlock to the waiter's grant, two clients):\n", *rounds)
	fmt.Printf("  etcdlock           p50 %8s  p99 %8s\n", ms(p50[0]), ms(p99[0]))
	fmt.Printf("  concurrency.Mutex  p50 %8s  p99 %8s\n", ms(p50[1]), ms(p99[1]))
	fmt.Printf("  hand-off etcdlock/concurrency.Mutex: p50 %.3f  p99 %.3f\n",
		float64(p50[0])/float64(p50[1]), float64(p99[0])/float64(p99[1]))
	return nil
}

// killHolder kills a holder process and times the next grant.
func killHolder(client *clientv3.Client) (bool, error) {
	ctx := context.Background()
	p, err := startProc("hold")
	if err != nil {
		return false, err
	}
	line, ok := <-p.lines
	if !ok || !strings.HasPrefix(line, "held ") {
		return false, fmt.Errorf("holder process: %q", line)
	}
	deadTok, _ := strconv.ParseInt(strings.TrimPrefix(line, "held "), 10, 64)
	rng := root() + "locks/victim/"
	resp, err := client.Get(ctx, rng, clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		return false, fmt.Errorf("the holder's key: %v %v", resp, err)
	}
	dead := resp.Kvs[0]
	l, err := etcdlock.New(client, root()+"locks", etcdlock.WithTTL(*ttl))
	if err != nil {
		return false, err
	}
	defer l.Close(ctx)
	type grant struct {
		g   keylock.Lease
		at  time.Time
		err error
	}
	granted := make(chan grant, 1)
	go func() {
		g, err := l.Lock(ctx, "victim")
		granted <- grant{g, time.Now(), err}
	}()
	for {
		resp, err := client.Get(ctx, rng, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return false, err
		}
		if resp.Count == 2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	killed := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return false, err
	}
	_, _ = p.wait()
	g := <-granted
	if g.err != nil {
		return false, g.err
	}
	took := g.at.Sub(killed)
	fmt.Printf("\nkill: holder process (pid %d, token %d) killed with SIGKILL while a waiter queued;\n", p.cmd.Process.Pid, deadTok)
	fmt.Printf("  the next waiter was granted %v later (lease TTL %v; bound TTL + 1 s), token %d\n",
		took.Round(time.Millisecond), *ttl, g.g.Token())
	fenced := clientv3.Compare(clientv3.CreateRevision(string(dead.Key)), "=", dead.CreateRevision)
	tr, err := client.Txn(ctx).If(fenced).Then(clientv3.OpPut(root()+"data", "from the dead holder")).Commit()
	if err != nil {
		return false, err
	}
	refused := !tr.Succeeded
	fmt.Printf("  a write fenced with the dead grant (token %d): refused: %v\n", dead.CreateRevision, refused)
	if err := g.g.Unlock(ctx); err != nil {
		return false, err
	}
	return refused && took <= *ttl+time.Second, nil
}

// proc is a worker process.
type proc struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan error
}

// startProc starts this program as a worker with role.
func startProc(role string) (*proc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-worker", role, "-endpoints", *endpoints, "-run", *run,
		"-ttl", ttl.String(), "-goroutines", strconv.Itoa(*goroutines),
		"-keys", strconv.Itoa(*hotKeys), "-contend", contend.String())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, lines: make(chan string, 16), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.done <- cmd.Wait()
	}()
	return p, nil
}

// wait returns the worker's remaining output once it has exited.
func (p *proc) wait() ([]string, error) {
	var lines []string
	for line := range p.lines {
		lines = append(lines, line)
	}
	err := <-p.done
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled() {
		err = nil // killed on purpose
	}
	if err != nil {
		return lines, fmt.Errorf("worker %v: %v: %q", p.cmd.Args[1:3], err, lines)
	}
	return lines, nil
}

// runWorker is a worker process.
func runWorker(role string) error {
	client, err := etcdtest.NewClient(strings.Split(*endpoints, ","))
	if err != nil {
		return err
	}
	defer client.Close()
	l, err := etcdlock.New(client, root()+"locks", etcdlock.WithTTL(*ttl))
	if err != nil {
		return err
	}
	defer l.Close(context.Background())
	ctx := context.Background()
	if role == "hold" {
		g, err := l.Lock(ctx, "victim")
		if err != nil {
			return err
		}
		fmt.Println("held", g.Token())
		select {} // until killed
	}
	var (
		mu                    sync.Mutex
		grants, refused, lost int
		waits                 []time.Duration
		firstErr              error
		wg                    sync.WaitGroup
		end                   = time.Now().Add(*contend)
	)
	for range *goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := owner.NewContext(ctx)
			for time.Now().Before(end) {
				key := "hot-" + strconv.Itoa(rand.IntN(*hotKeys))
				start := time.Now()
				g, err := l.Lock(ctx, key)
				if err != nil {
					mu.Lock()
					firstErr = firstError(firstErr, err)
					mu.Unlock()
					return
				}
				wait := time.Since(start)
				logKey := fmt.Sprintf("%slog/%s/%020d", root(), key, g.Token())
				// Lock returns a keylock.Lease; behind it is a
				// *etcdlock.Guard, whose IsOwner fences the write.
				tr, err := client.Txn(ctx).If(g.(*etcdlock.Guard).IsOwner()).
					Then(clientv3.OpPut(logKey, strconv.FormatUint(g.Token(), 10))).Commit()
				// A refused write or an ErrLost from Unlock is a grant
				// lost on an overloaded machine (its lease not renewed in
				// time), as long as Lost says so too; anything else is a
				// broken lock.
				wasLost := false
				if err == nil && !tr.Succeeded {
					select {
					case <-g.Lost():
						wasLost = true
					case <-time.After(5 * time.Second):
					}
				}
				uerr := g.Unlock(ctx)
				if errors.Is(uerr, etcdlock.ErrLost) {
					uerr, wasLost = nil, true
				}
				mu.Lock()
				grants++
				waits = append(waits, wait)
				switch {
				case wasLost:
					lost++
				case err == nil && !tr.Succeeded:
					refused++
				}
				firstErr = firstError(firstErr, err, uerr)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	slices.Sort(waits)
	fmt.Printf("%d grants, Lock wait p50 %s p99 %s, %d fenced writes refused while held, %d grants lost with their lease\n",
		grants, ms(etcdtest.Quantile(waits, 0.5)), ms(etcdtest.Quantile(waits, 0.99)), refused, lost)
	return nil
}

// firstError returns the first non-nil error.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// ms formats d in milliseconds.
func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
