// Command cluster shows redislock across processes. It starts a
// redis-server (or uses -addr), then:
//
//  1. runs three worker processes whose goroutines contend on a few hot
//     keys, each grant recorded by a write to a fenced store (a Lua
//     script that accepts a token only if it is larger than every token
//     it accepted for the key), and checks that no fenced write was
//     refused: grants of a key never overlapped and came in token order,
//     which is queue order; it prints the grants per process;
//  2. measures the hand-off to a queued waiter on another client, for
//     redislock and for redsync side by side;
//  3. kills a holder process with SIGKILL and prints how long the next
//     waiter took to be granted (about one session TTL), and that a write
//     fenced with the dead grant's token is refused.
//
// Run it from the redislock folder (a module of its own,
// redislock/examples, in the workspace):
//
//	go run ./examples/cluster
//
// It needs redis-server on $PATH unless -addr names a server. It runs
// three phases (contention for -contend, 3 s by default, the hand-off
// rounds, and a killed holder, which lasts about one TTL) and exits
// non-zero if a check fails.
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

	"github.com/fairlock/fairlock/owner"
	"github.com/fairlock/fairlock/redislock"
	"github.com/fairlock/fairlock/redislock/redistest"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

var (
	addr       = flag.String("addr", "", "Redis address; empty: start a redis-server")
	procs      = flag.Int("procs", 3, "worker processes")
	goroutines = flag.Int("goroutines", 4, "goroutines per worker process")
	hotKeys    = flag.Int("keys", 3, "hot keys")
	contend    = flag.Duration("contend", 3*time.Second, "how long the workers contend")
	rounds     = flag.Int("rounds", 30, "hand-off rounds per implementation")
	ttl        = flag.Duration("ttl", 2*time.Second, "session TTL of every Locker")
	run        = flag.String("run", strconv.FormatInt(time.Now().UnixNano(), 36), "run id: the demo's keys live under cluster-demo/<run>")
	worker     = flag.String("worker", "", "internal: run as a worker process (contend or hold)")
)

func main() {
	flag.Parse()
	var err error
	if *worker != "" {
		err = runWorker(*worker)
	} else {
		err = demo()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

// prefix is the Lockers' prefix; store names a key of the fenced store.
func prefix() string              { return "cluster-demo/" + *run }
func store(what, k string) string { return "cluster-demo:" + *run + ":" + what + ":" + k }

// fence is the fenced store: it appends ARGV[2] to the list KEYS[2] only
// if the token ARGV[1] is larger than every token accepted before (kept
// in KEYS[1]), and returns 1; else 0 (Kleppmann's fencing tokens).
var fence = redis.NewScript(`
local last = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) <= last then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
`)

// fencedWrite records entry for key under token; false: refused.
func fencedWrite(ctx context.Context, c *redis.Client, key string, token uint64, entry string) (bool, error) {
	n, err := fence.Run(ctx, c, []string{store("fence", key), store("log", key)}, strconv.FormatUint(token, 10), entry).Int()
	return n == 1, err
}

func demo() error {
	if *addr == "" {
		dir, err := os.MkdirTemp("", "redislock-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		srv, err := redistest.NewServer(dir)
		if err != nil {
			return err
		}
		defer srv.Stop()
		*addr = srv.Addr()
		fmt.Println("redis-server on", *addr)
	}
	client := redis.NewClient(&redis.Options{Addr: *addr})
	defer client.Close()
	okFIFO, err := contention(client)
	if err != nil {
		return err
	}
	if err := handOffs(); err != nil {
		return err
	}
	okKill, err := killHolder(client)
	if err != nil {
		return err
	}
	if !okFIFO || !okKill {
		return errors.New("a check failed")
	}
	return nil
}

// contention runs the worker processes and checks their reports.
func contention(client *redis.Client) (bool, error) {
	fmt.Printf("\n1. %d processes x %d goroutines contend on %d hot keys for %v (TTL %v)\n", *procs, *goroutines, *hotKeys, *contend, *ttl)
	var ps []*proc
	for range *procs {
		p, err := startProc("contend")
		if err != nil {
			return false, err
		}
		ps = append(ps, p)
	}
	ok := true
	for i, p := range ps {
		lines, err := p.wait()
		if err != nil {
			return false, err
		}
		for _, l := range lines {
			fmt.Printf("  process %d: %s\n", i, l)
			if !strings.Contains(l, " 0 refused") {
				ok = false
			}
		}
	}
	total := 0
	for k := range *hotKeys {
		n, err := client.LLen(context.Background(), store("log", strconv.Itoa(k))).Result()
		if err != nil {
			return false, err
		}
		total += int(n)
	}
	fmt.Printf("  %d grants in all; fenced writes refused: %s\n", total, map[bool]string{true: "none (no overlap, token order = queue order)", false: "SOME: CHECK FAILED"}[ok])
	return ok, nil
}

// handOffs measures, for redislock and redsync alternately, the time from
// a holder's Unlock to the return of a waiter's Lock on another client,
// the waiter queued (redislock: its entry is in the queue) or polling
// (redsync: its first try has failed) before the release.
func handOffs() error {
	fmt.Printf("\n2. hand-off to a waiting client, %d rounds each\n", *rounds)
	ctx := context.Background()
	ch, cw := redis.NewClient(&redis.Options{Addr: *addr}), redis.NewClient(&redis.Options{Addr: *addr})
	defer ch.Close()
	defer cw.Close()
	lh, err := redislock.New(ch, prefix(), redislock.WithTTL(*ttl))
	if err != nil {
		return err
	}
	defer lh.Close(ctx)
	lw, err := redislock.New(cw, prefix(), redislock.WithTTL(*ttl))
	if err != nil {
		return err
	}
	defer lw.Close(ctx)
	rsH, rsW := redsync.New(goredis.NewPool(ch)), redsync.New(goredis.NewPool(cw))
	var samples [2][]time.Duration
	for range *rounds {
		d, err := handOffRedislock(ctx, ch, lh, lw)
		if err != nil {
			return err
		}
		samples[0] = append(samples[0], d)
		d, err = handOffRedsync(ctx, rsH, rsW)
		if err != nil {
			return err
		}
		samples[1] = append(samples[1], d)
	}
	for i, name := range []string{"redislock", "redsync"} {
		slices.Sort(samples[i])
		fmt.Printf("  %-10s p50 %9s  p99 %9s\n", name, ms(quantile(samples[i], 0.5)), ms(quantile(samples[i], 0.99)))
	}
	return nil
}

func handOffRedislock(ctx context.Context, c *redis.Client, holder, waiter *redislock.Locker) (time.Duration, error) {
	const key = "handoff"
	g, err := holder.Lock(ctx, key)
	if err != nil {
		return 0, err
	}
	got := make(chan error, 1)
	var at time.Time
	go func() {
		w, err := waiter.Lock(ctx, key)
		at = time.Now()
		if err == nil {
			err = w.Unlock(ctx)
		}
		got <- err
	}()
	q := redislock.QueueKey(prefix(), key)
	for {
		n, err := c.ZCard(ctx, q).Result()
		if err != nil {
			return 0, err
		}
		if n == 2 {
			break
		}
		time.Sleep(100 * time.Microsecond) // a poll: the count decides
	}
	start := time.Now()
	if err := g.Unlock(ctx); err != nil {
		return 0, err
	}
	if err := <-got; err != nil {
		return 0, err
	}
	return at.Sub(start), nil
}

func handOffRedsync(ctx context.Context, holder, waiter *redsync.Redsync) (time.Duration, error) {
	name := store("redsync", "handoff")
	m := holder.NewMutex(name, redsync.WithExpiry(*ttl))
	if err := m.LockContext(ctx); err != nil {
		return 0, err
	}
	tried := make(chan struct{})
	var once sync.Once
	// redsync's default retry delay (a random 50-250 ms), and a signal
	// at the first retry: the waiter has tried and failed once.
	delay := func(int) time.Duration {
		once.Do(func() { close(tried) })
		return time.Duration(50+rand.IntN(200)) * time.Millisecond
	}
	w := waiter.NewMutex(name, redsync.WithExpiry(*ttl), redsync.WithRetryDelayFunc(delay), redsync.WithTries(1000))
	got := make(chan error, 1)
	var at time.Time
	go func() {
		err := w.LockContext(ctx)
		at = time.Now()
		if err == nil {
			_, err = w.UnlockContext(ctx)
		}
		got <- err
	}()
	<-tried
	start := time.Now()
	if _, err := m.UnlockContext(ctx); err != nil {
		return 0, err
	}
	if err := <-got; err != nil {
		return 0, err
	}
	return at.Sub(start), nil
}

// killHolder kills a holder process and times the next waiter's grant.
func killHolder(client *redis.Client) (bool, error) {
	fmt.Printf("\n3. a holder process is killed (SIGKILL); TTL %v\n", *ttl)
	ctx := context.Background()
	p, err := startProc("hold")
	if err != nil {
		return false, err
	}
	line, ok := <-p.lines
	f := strings.Fields(line)
	if !ok || len(f) != 2 || f[0] != "held" {
		return false, fmt.Errorf("holder: %q", line)
	}
	dead, _ := strconv.ParseUint(f[1], 10, 64)
	l, err := redislock.New(client, prefix(), redislock.WithTTL(*ttl))
	if err != nil {
		return false, err
	}
	defer l.Close(ctx)
	type grant struct {
		tok uint64
		at  time.Time
		err error
	}
	got := make(chan grant, 1)
	go func() {
		g, err := l.Lock(ctx, "kill")
		gr := grant{at: time.Now(), err: err}
		if err == nil {
			gr.tok = g.Token()
			defer g.Unlock(ctx)
			if ok, err := fencedWrite(ctx, client, "kill", gr.tok, "next"); err != nil || !ok {
				gr.err = fmt.Errorf("the next holder's fenced write: %v %v", ok, err)
			}
		}
		got <- gr
	}()
	q := redislock.QueueKey(prefix(), "kill")
	for {
		n, err := client.ZCard(ctx, q).Result()
		if err != nil {
			return false, err
		}
		if n == 2 {
			break
		}
		time.Sleep(time.Millisecond) // a poll: the count decides
	}
	killed := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return false, err
	}
	p.wait()
	gr := <-got
	if gr.err != nil {
		return false, gr.err
	}
	fmt.Printf("  the next waiter was granted %v after the kill (token %d after the dead grant's %d)\n",
		gr.at.Sub(killed).Round(time.Millisecond), gr.tok, dead)
	refused, err := fencedWrite(ctx, client, "kill", dead, "dead")
	if err != nil {
		return false, err
	}
	fmt.Printf("  a write fenced with the dead grant's token: %s\n", map[bool]string{false: "refused", true: "ACCEPTED: CHECK FAILED"}[refused])
	return !refused && gr.tok > dead, nil
}

// proc is a worker process.
type proc struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan error
}

// startProc re-executes this binary as a worker with role.
func startProc(role string) (*proc, error) {
	cmd := exec.Command(os.Args[0], "-worker="+role, "-addr="+*addr, "-run="+*run, "-ttl="+ttl.String(),
		"-keys="+strconv.Itoa(*hotKeys), "-goroutines="+strconv.Itoa(*goroutines), "-contend="+contend.String())
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

// wait returns the worker's remaining output once it exits.
func (p *proc) wait() ([]string, error) {
	var lines []string
	for l := range p.lines {
		lines = append(lines, l)
	}
	err := <-p.done
	if err != nil && p.cmd.ProcessState != nil && p.cmd.ProcessState.Sys().(syscall.WaitStatus).Signaled() {
		err = nil // killed on purpose
	}
	if err != nil {
		return lines, fmt.Errorf("worker: %v; output %q", err, lines)
	}
	return lines, nil
}

// runWorker is a worker process: contend, or hold a key until killed.
func runWorker(role string) error {
	client := redis.NewClient(&redis.Options{Addr: *addr})
	defer client.Close()
	l, err := redislock.New(client, prefix(), redislock.WithTTL(*ttl))
	if err != nil {
		return err
	}
	defer l.Close(context.Background())
	ctx := context.Background()
	switch role {
	case "hold":
		g, err := l.Lock(ctx, "kill")
		if err != nil {
			return err
		}
		fmt.Println("held", g.Token())
		select {} // until killed
	case "contend":
		return contendWorker(ctx, client, l)
	}
	return fmt.Errorf("unknown role %q", role)
}

// contendWorker runs the goroutines of one contending process and prints
// one line: its grants, refused fenced writes, and wait quantiles.
func contendWorker(ctx context.Context, client *redis.Client, l *redislock.Locker) error {
	end := time.Now().Add(*contend)
	var mu sync.Mutex
	var waits []time.Duration
	grants, refused := 0, 0
	errs := make(chan error, *goroutines)
	for range *goroutines {
		go func() {
			octx := owner.NewContext(ctx)
			for time.Now().Before(end) {
				k := strconv.Itoa(rand.IntN(*hotKeys))
				start := time.Now()
				g, err := l.Lock(octx, k)
				if err != nil {
					errs <- err
					return
				}
				waited := time.Since(start)
				ok, err := fencedWrite(ctx, client, k, g.Token(), strconv.Itoa(os.Getpid()))
				if uerr := g.Unlock(ctx); err == nil {
					err = uerr
				}
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				grants++
				if !ok {
					refused++
				}
				waits = append(waits, waited)
				mu.Unlock()
			}
			errs <- nil
		}()
	}
	var err error
	for range *goroutines {
		err = errors.Join(err, <-errs)
	}
	if err != nil {
		return err
	}
	slices.Sort(waits)
	fmt.Printf("%d grants, %d refused, wait p50 %s p99 %s\n", grants, refused, ms(quantile(waits, 0.5)), ms(quantile(waits, 0.99)))
	return nil
}

// quantile returns the q-quantile of sorted (nearest rank); 0 if empty.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
