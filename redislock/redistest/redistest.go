// Package redistest starts real redis-server processes for tests: one
// node (Start, StartServer) or a local Redis Cluster (StartCluster,
// StartNodes), on free loopback ports, without persistence, each in a
// temporary directory of its own and stopped by tb.Cleanup; NewServer
// does the same for a program that is not a test. It is its own module so that the
// users of redislock never get test helpers in their module graph.
//
// For fault tests it also starts a server that keeps its data
// (StartServerWith: RDB snapshots or an append-only file, and any other
// redis-server setting, such as maxmemory and its policy), which can be
// killed and restarted on that data (Server.Restart) or on a copy of it
// taken earlier, as a disk that lost its unflushed writes would hold it
// (Server.CopyData, Server.RestartFrom); a replica of a server whose
// replication link can be stalled, and promoted (Server.StartReplica,
// Replica.Stall, Replica.Promote); and a Sentinel that monitors a
// primary and fails it over to a replica, for go-redis's failover client
// (StartSentinel).
//
// It needs the redis-server binary (7.0 or newer: Debian's and Ubuntu's
// redis-server package) on $PATH, or named by $REDISTEST_SERVER; a test
// that calls it fails at once, saying so, when there is none. Nothing here
// mocks or emulates Redis.
package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// startTimeout bounds how long a server may take to answer PING, and a
// cluster to report cluster_state:ok.
const startTimeout = 20 * time.Second

// Server is one redis-server process started by StartServer. Its methods
// are safe for concurrent use.
type Server struct {
	bin      string
	dir      string
	port     int
	cluster  bool
	opts     Options
	sentinel string // the config file of a Sentinel; "" for a data node

	mu     sync.Mutex   // guards cmd and waitCh
	cmd    *exec.Cmd    // nil while stopped
	waitCh <-chan error // cmd.Wait's result
}

// Start starts one redis-server and returns a client of it, both closed
// by tb.Cleanup. It is StartServer(tb).NewClient(tb).
func Start(tb testing.TB) *redis.Client {
	tb.Helper()
	return StartServer(tb).NewClient(tb)
}

// StartServer starts one redis-server on a free loopback port with no
// persistence (--save "" --appendonly no) in a temporary directory, waits
// until it answers PING (at most 20 s), and stops it in tb.Cleanup. It
// fails tb if redis-server is not installed or does not start. It is
// StartServerWith(tb, Options{}).
func StartServer(tb testing.TB) *Server {
	tb.Helper()
	return StartServerWith(tb, Options{})
}

// Persistence is what a server keeps on disk, in its directory, to load
// when it starts again.
type Persistence int

const (
	// NoPersistence keeps nothing (--save "" --appendonly no): a restart
	// comes back empty, unless a SAVE wrote a snapshot (dump.rdb), which
	// redis-server loads whenever it finds one.
	NoPersistence Persistence = iota
	// RDB keeps snapshots (dump.rdb) on Redis's default schedule (--save
	// "3600 1 300 100 60 10000": after an hour with one change, five
	// minutes with 100, a minute with 10,000), Redis's default
	// persistence; SAVE or BGSAVE takes one at once. A restart loads the
	// last snapshot: every write after it is lost.
	RDB
	// AOF keeps an append-only file (--appendonly yes --appendfsync
	// everysec, no snapshots): every write is appended before its reply
	// is sent, and the file is fsynced once a second. A killed server
	// loses nothing (the kernel still holds what was written); a power
	// loss or a kernel crash loses up to the last second, which
	// CopyData and RestartFrom reproduce.
	AOF
)

// Options configure a server started by StartServerWith.
type Options struct {
	Persistence Persistence
	// Args are more redis-server arguments, appended to the ones
	// redistest sets and overriding them: {"--maxmemory", "2mb",
	// "--maxmemory-policy", "allkeys-lru"}, say.
	Args []string
}

// StartServerWith starts one redis-server as StartServer does, with the
// persistence and the further arguments of o.
func StartServerWith(tb testing.TB, o Options) *Server {
	tb.Helper()
	s := &Server{opts: o}
	startProcess(tb, s)
	return s
}

func startServer(tb testing.TB, cluster bool) *Server {
	tb.Helper()
	s := &Server{cluster: cluster}
	startProcess(tb, s)
	return s
}

// startProcess starts s in a temporary directory, stopped by tb.Cleanup.
func startProcess(tb testing.TB, s *Server) {
	tb.Helper()
	s.dir = tb.TempDir()
	if err := s.launch(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
}

// NewServer is StartServer for programs that are not tests (a demo, a
// benchmark): the server keeps its files in dir, which must exist, and
// runs until Stop.
func NewServer(dir string) (*Server, error) {
	s := &Server{dir: dir}
	if err := s.launch(); err != nil {
		return nil, err
	}
	return s, nil
}

// launch finds the binary and a free port for s, and starts it.
func (s *Server) launch() error {
	bin, err := serverBinary()
	if err != nil {
		return err
	}
	s.bin = bin
	// A port free now may be taken before redis-server binds it: try a
	// few.
	for try := 0; ; try++ {
		s.port, err = freePort(s.cluster)
		if err == nil {
			err = s.start()
		}
		if err == nil {
			return nil
		}
		if try == 4 {
			return fmt.Errorf("redistest: %w", err)
		}
	}
}

// serverBinary finds redis-server.
func serverBinary() (string, error) {
	if p := os.Getenv("REDISTEST_SERVER"); p != "" {
		return p, nil
	}
	p, err := exec.LookPath("redis-server")
	if err != nil {
		return "", errors.New("redistest: redis-server is not installed (apt-get install redis-server, or set REDISTEST_SERVER to its path)")
	}
	return p, nil
}

// freePort returns a loopback port that was free a moment ago; for a
// cluster node, one whose cluster bus port (port+10000) was free too.
func freePort(cluster bool) (int, error) {
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		if !cluster {
			ln.Close()
			return port, nil
		}
		if port+10000 > 65535 {
			ln.Close()
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+10000))
		ln.Close()
		if err != nil {
			continue
		}
		bus.Close()
		return port, nil
	}
	return 0, errors.New("no free port pair for a cluster node")
}

// Addr returns the server's address, "127.0.0.1:port".
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// NewClient returns a new client of the server, closed by tb.Cleanup.
func (s *Server) NewClient(tb testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	tb.Cleanup(func() { c.Close() })
	return c
}

// Dir returns the server's data directory: its snapshot (dump.rdb) and
// append-only files (appendonlydir) are there.
func (s *Server) Dir() string { return s.dir }

// args returns the server's command line, less the binary.
func (s *Server) args() []string {
	var args []string
	if s.sentinel != "" {
		args = append(args, s.sentinel, "--sentinel")
	}
	args = append(args,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--daemonize", "no",
		"--protected-mode", "no",
		"--loglevel", "warning",
		"--logfile", "")
	if s.sentinel != "" {
		return args
	}
	switch s.opts.Persistence {
	case RDB:
		args = append(args, "--save", "3600 1 300 100 60 10000", "--appendonly", "no")
	case AOF:
		args = append(args, "--save", "", "--appendonly", "yes", "--appendfsync", "everysec")
	default:
		args = append(args, "--save", "", "--appendonly", "no")
	}
	// A replica's first sync starts at once, not after the 5 s Redis
	// waits by default for more replicas to share the transfer.
	args = append(args, "--repl-diskless-sync-delay", "0")
	return append(args, s.opts.Args...)
}

// start runs redis-server on s.port and waits until it answers PING.
func (s *Server) start() error {
	args := s.args()
	if s.cluster {
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(s.dir, "nodes-"+strconv.Itoa(s.port)+".conf"),
			"--cluster-node-timeout", "5000")
	}
	cmd := exec.Command(s.bin, args...)
	logs := &lockedWriter{}
	cmd.Stdout = logs
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start %s: %w", s.bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			break
		}
		select {
		case werr := <-exited:
			return fmt.Errorf("redis-server on port %d exited (%v): %s", s.port, werr, strings.TrimSpace(logs.String()))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redis-server on port %d did not answer PING within %v: %v", s.port, startTimeout, err)
		}
	}
	s.mu.Lock()
	s.cmd, s.waitCh = cmd, exited // the goroutine above owns cmd.Wait
	s.mu.Unlock()
	return nil
}

// Stop kills the server (SIGKILL: it saves nothing on the way out, as a
// crash) and waits for it to exit. Stopping a stopped server does
// nothing. StartServer's tb.Cleanup calls it.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, ch := s.cmd, s.waitCh
	s.cmd, s.waitCh = nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-ch
}

// Restart kills the server (SIGKILL) and starts a new one on the same
// port, directory and settings, as a crash and restart would: it loads
// what its persistence kept (RDB: the last snapshot; AOF: every write
// acknowledged before the kill) or comes back empty (NoPersistence, and
// no SAVE was made), and without scripts. Clients reconnect on their
// own. It returns an error if the server does not come back within about
// 5 s (or longer while it loads its data).
func (s *Server) Restart() error {
	s.Stop()
	return s.restart()
}

// restart starts the stopped server again.
func (s *Server) restart() error {
	var err error
	// The port was just released; retry briefly if it is still taken.
	for range 50 {
		if err = s.start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("redistest: restart: %w", err)
}

// lockedWriter serialises the server's stdout and stderr into one buffer.
type lockedWriter struct {
	mu sync.Mutex
	w  bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// String returns what was written so far.
func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}

// CopyData copies the server's data directory as it is now (its
// snapshot, its append-only files) into a new directory, removed by
// tb.Cleanup, and returns it. The server goes on. RestartFrom(dir) later
// restarts the server on the copy: the server as a machine that crashed
// would bring it back when the writes made after CopyData never reached
// its disk (appendfsync everysec loses up to a second of them on a power
// loss), or a backup taken at this instant restored.
func (s *Server) CopyData(tb testing.TB) string {
	tb.Helper()
	dst := tb.TempDir()
	if err := copyTree(s.dir, dst); err != nil {
		tb.Fatalf("redistest: copy %s: %v", s.dir, err)
	}
	return dst
}

// RestartFrom kills the server (SIGKILL), replaces the files of its data
// directory by those of dir (a CopyData), and starts it again on the same
// port and settings, so that it loads them. It returns an error if the
// files cannot be copied or the server does not come back, as Restart.
func (s *Server) RestartFrom(dir string) error {
	s.Stop()
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(s.dir, e.Name())); err != nil {
			return fmt.Errorf("redistest: %w", err)
		}
	}
	if err := copyTree(dir, s.dir); err != nil {
		return fmt.Errorf("redistest: copy %s: %w", dir, err)
	}
	return s.restart()
}

// copyTree copies the regular files and directories under src into dst,
// which exists.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil || rel == "." {
			return err
		}
		to := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			return os.Mkdir(to, 0o755)
		case d.Type().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, b, 0o644)
		}
		return nil
	})
}
