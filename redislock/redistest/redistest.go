// Package redistest starts real redis-server processes for tests: one
// node (Start, StartServer) or a local Redis Cluster (StartCluster,
// StartNodes), on free loopback ports, without persistence, each in a
// temporary directory of its own and stopped by tb.Cleanup; NewServer
// does the same for a program that is not a test. It is its own module so that the
// users of redislock never get test helpers in their module graph.
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
	bin     string
	dir     string
	port    int
	cluster bool

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
// fails tb if redis-server is not installed or does not start.
func StartServer(tb testing.TB) *Server {
	tb.Helper()
	return startServer(tb, false)
}

func startServer(tb testing.TB, cluster bool) *Server {
	tb.Helper()
	s, err := newServer(tb.TempDir(), cluster)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// NewServer is StartServer for programs that are not tests (a demo, a
// benchmark): the server keeps its files in dir, which must exist, and
// runs until Stop.
func NewServer(dir string) (*Server, error) { return newServer(dir, false) }

func newServer(dir string, cluster bool) (*Server, error) {
	bin, err := serverBinary()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir, cluster: cluster}
	// A port free now may be taken before redis-server binds it: try a
	// few.
	for try := 0; ; try++ {
		s.port, err = freePort(cluster)
		if err == nil {
			err = s.start()
		}
		if err == nil {
			return s, nil
		}
		if try == 4 {
			return nil, fmt.Errorf("redistest: %w", err)
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

// start runs redis-server on s.port and waits until it answers PING.
func (s *Server) start() error {
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--protected-mode", "no",
		"--loglevel", "warning",
		"--logfile", "",
	}
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

// Stop kills the server (SIGKILL: nothing to save) and waits for it to
// exit. Stopping a stopped server does nothing. StartServer's tb.Cleanup
// calls it.
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

// Restart stops the server and starts a new one on the same port and
// directory, as a crash and restart would: without persistence it comes
// back empty (no keys, no scripts). Clients reconnect on their own. It
// returns an error if the server does not come back within about 5 s.
func (s *Server) Restart() error {
	s.Stop()
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
