// Package pgtest starts real PostgreSQL servers for tests: Start gives a
// test a *pgxpool.Pool (pgx v5) on a fresh server of its own, and
// StartServer the server itself, for tests that restart, stop or kill it.
// Each server is a new cluster (initdb) in a temporary directory of its
// own, listening on a free loopback port (TCP only, no Unix socket), with
// the superuser "postgres" and trust authentication, and tb.Cleanup stops
// it and removes its files. NewServer does the same for a program that is
// not a test. Server.StartPgBouncer puts a real PgBouncer in front of a
// server. It is its own module, so that the users of pglock never get
// test helpers in their module graph; it requires pgx and
// golang.org/x/sys alone (and its tests goleak). Nothing here mocks or
// emulates PostgreSQL.
//
// # Binaries
//
// It runs the initdb and postgres of the newest version that Debian's
// and Ubuntu's postgresql package installed under
// /usr/lib/postgresql/VERSION/bin, else those on $PATH; $PGTEST_BINDIR,
// if set, names the folder instead. A test that calls it fails at once,
// saying so, when there are none (apt-get install postgresql; the
// package starts a server of its own as a service, which pgtest neither
// needs nor touches).
//
// # Running as root
//
// PostgreSQL refuses to run as root ("initdb: error: cannot be run as
// root"), and CI runs as root. A process whose effective user is root
// runs initdb and postgres as the unprivileged user "postgres" (which the
// Debian package creates), or "nobody" when there is no such user,
// through exec.Cmd's SysProcAttr.Credential. The server's directory is
// then made in os.TempDir (which that user must be able to reach) and
// given to that user. Any other user runs them as itself.
//
// # Durability and speed
//
// A server is made for starting fast: initdb --no-sync, 16 MB of shared
// buffers, no Unix socket, no JIT. It runs with fsync=off and
// full_page_writes=off, which lose data only when the machine itself
// crashes (the operating system keeps what was written), and keeps
// synchronous_commit=on, so that a commit has written its WAL before it
// returns: a restart after any Shutdown mode, Kill included, keeps every
// committed transaction. Nothing that survives the machine is promised.
package pgtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sys/unix"
)

const (
	// startTimeout bounds how long a server may take to accept a
	// connection after it was started (crash recovery included).
	startTimeout = 60 * time.Second
	// stopTimeout bounds a Fast or Immediate shutdown; past it the
	// server is killed.
	stopTimeout = 60 * time.Second
	// logLimit is how many bytes of the server's log a Server keeps.
	logLimit = 64 << 10
)

// Shutdown is how Stop and Restart end the server. The constants are
// PostgreSQL's shutdown modes ("Shutting Down the Server" in its
// documentation), and a crash.
type Shutdown int

const (
	// Fast sends SIGINT: the server ends every session (their clients
	// get an error), writes a checkpoint and exits.
	Fast Shutdown = iota
	// Immediate sends SIGQUIT: every server process exits at once,
	// without a checkpoint, and the next start runs crash recovery from
	// the WAL.
	Immediate
	// Kill sends SIGKILL to the postmaster and every other process of
	// the server at once (they share a process group), as a crash of
	// PostgreSQL would; the next start runs crash recovery.
	Kill
)

// String returns the mode's name.
func (h Shutdown) String() string {
	switch h {
	case Fast:
		return "fast"
	case Immediate:
		return "immediate"
	case Kill:
		return "kill"
	}
	return "Shutdown(" + strconv.Itoa(int(h)) + ")"
}

// Server is one PostgreSQL cluster and its postmaster, started by
// StartServer or NewServer. Its methods are safe for concurrent use.
type Server struct {
	bin  string // the folder of initdb and postgres
	dir  string // ours: holds data/, removed by Close
	data string
	port int
	cred *syscall.Credential // nil: run as ourselves
	as   string              // the user the server runs as, for errors
	logs *ringWriter

	mu     sync.Mutex // held by Start, Stop and Close throughout
	proc   *proc      // the running postmaster, nil while stopped
	killed bool       // the last stop was Kill: the shared memory segment is left over
	closed bool
}

// proc is a started postmaster.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once cmd has exited
	err  error         // cmd.Wait's result, set before done is closed
}

// Start starts a server and returns a pool of connections to it as the
// superuser, both closed by tb.Cleanup. It is StartServer(tb).NewPool(tb).
func Start(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	return StartServer(tb).NewPool(tb)
}

// StartServer makes a new cluster and starts its server, as the package
// doc says, waits until it accepts connections, and closes it in
// tb.Cleanup (a fast shutdown, then its files are removed). It fails tb
// if the binaries are missing or the server does not start.
func StartServer(tb testing.TB) *Server {
	tb.Helper()
	s, err := NewServer()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Error(err)
		}
	})
	return s
}

// NewServer is StartServer for programs that are not tests (a demo, a
// benchmark): the server runs until Close, which the caller must call.
// It returns an error if the binaries are missing, initdb fails, or the
// server does not accept connections within a minute.
func NewServer() (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, logs: &ringWriter{}}
	if os.Geteuid() == 0 {
		if s.cred, s.as, err = unprivileged(); err != nil {
			return nil, err
		}
	}
	if s.dir, err = os.MkdirTemp("", "pgtest-"); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	s.data = filepath.Join(s.dir, "data")
	if err := s.initdb(); err != nil {
		os.RemoveAll(s.dir)
		return nil, err
	}
	// A port free now may be taken before postgres binds it: try a few.
	for try := 0; ; try++ {
		if s.port, err = freePort(); err == nil {
			if err = s.Start(); err == nil {
				return s, nil
			}
		}
		if try == 4 {
			os.RemoveAll(s.dir)
			return nil, err
		}
	}
}

// binDir finds the folder of initdb and postgres.
func binDir() (string, error) {
	if d := os.Getenv("PGTEST_BINDIR"); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest version first: "9.6" < "13" < "17", compared as numbers.
	version := func(d string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(d)), 64)
		return v
	}
	slices.SortFunc(dirs, func(a, b string) int {
		switch va, vb := version(a), version(b); {
		case va > vb:
			return -1
		case va < vb:
			return 1
		}
		return 0
	})
	for _, d := range dirs {
		if isExec(filepath.Join(d, "postgres")) && isExec(filepath.Join(d, "initdb")) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("postgres"); err == nil {
		d := filepath.Dir(p)
		if isExec(filepath.Join(d, "initdb")) {
			return d, nil
		}
	}
	return "", errors.New("pgtest: no PostgreSQL server binaries (initdb, postgres) in /usr/lib/postgresql/*/bin or on $PATH: apt-get install postgresql, or set PGTEST_BINDIR to their folder")
}

func isExec(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// unprivileged returns the credential of the user that runs the server
// when this process is root: "postgres", else "nobody".
func unprivileged() (*syscall.Credential, string, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, name, nil
	}
	return nil, "", errors.New(`pgtest: running as root, and PostgreSQL refuses to; found neither user "postgres" nor "nobody" to run it as`)
}

// command returns a command of the server's binaries, run as the
// server's user, in its own process group, in s.dir.
func (s *Server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	cmd.Env = []string{"LC_ALL=C", "LANG=C", "PATH=" + os.Getenv("PATH"), "HOME=" + s.dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred}
	return cmd
}

// initdb makes the cluster in s.data.
func (s *Server) initdb() error {
	if s.cred != nil {
		if err := os.Chown(s.dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
	}
	cmd := s.command("initdb", "-D", s.data, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync")
	out, err := cmd.CombinedOutput()
	if err != nil {
		hint := ""
		if s.cred != nil {
			hint = fmt.Sprintf(" (run as user %q, since this process is root: it must be able to reach %s)", s.as, s.dir)
		}
		return fmt.Errorf("pgtest: initdb%s: %v: %s", hint, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgtest: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// ConnString returns a URL that connects to the server's "postgres"
// database as the superuser "postgres", without TLS:
// postgres://postgres@127.0.0.1:PORT/postgres?sslmode=disable. Pass it
// to a worker process to connect from there; change its user to connect
// as another role (trust authentication accepts any role that exists).
func (s *Server) ConnString() string {
	return "postgres://postgres@127.0.0.1:" + strconv.Itoa(s.port) + "/postgres?sslmode=disable"
}

// Port returns the server's TCP port on 127.0.0.1. It stays the same
// across Restart.
func (s *Server) Port() int { return s.port }

// DataDir returns the cluster's data directory.
func (s *Server) DataDir() string { return s.data }

// PID returns the postmaster's process id, or 0 while the server is
// stopped. Every process of the server is in the process group of that
// id.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.cmd.Process.Pid
}

// Logs returns the last 64 KiB of what the server wrote to its log
// (stderr), for a test's failure message.
func (s *Server) Logs() string { return s.logs.String() }

// NewPool returns a new pool of connections to the server as the
// superuser, closed by tb.Cleanup. Each configure function, in order, may
// change the pool's configuration first (MaxConns, the role, hooks). It
// fails tb if the configuration is refused.
func (s *Server) NewPool(tb testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(s.ConnString())
	if err != nil {
		tb.Fatal(err)
	}
	for _, f := range configure {
		f(cfg)
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.Close)
	return p
}

// Start starts the server of a stopped Server on its data and port, and
// waits until it accepts connections (after crash recovery, if it was
// not shut down cleanly), at most a minute. It does nothing if the server
// runs. A Server that NewServer or StartServer returned is running.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("pgtest: Start after Close")
	}
	if s.proc != nil {
		return nil
	}
	cmd := s.command("postgres", "-D", s.data,
		"-p", strconv.Itoa(s.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=",
		"-c", "fsync=off",
		"-c", "full_page_writes=off",
		"-c", "synchronous_commit=on",
		"-c", "shared_buffers=16MB",
		"-c", "max_connections=200",
		"-c", "log_destination=stderr",
		"-c", "logging_collector=off",
		"-c", "jit=off")
	cmd.Stdout = s.logs
	cmd.Stderr = s.logs
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgtest: start %s: %w", cmd.Path, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := s.awaitReady(p); err != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		return err
	}
	s.proc, s.killed = p, false
	return nil
}

// awaitReady waits until the server accepts a connection and answers a
// query, or p exits, or startTimeout passes.
func (s *Server) awaitReady(p *proc) error {
	deadline := time.Now().Add(startTimeout)
	cfg, err := pgx.ParseConfig(s.ConnString())
	if err != nil {
		return err
	}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			_, err = c.Exec(ctx, "SELECT 1")
			c.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("pgtest: postgres on port %d exited (%v): %s", s.port, p.err, tail(s.logs.String(), 2000))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: postgres on port %d accepted no connection within %v: %v: %s", s.port, startTimeout, err, tail(s.logs.String(), 2000))
		}
	}
}

// Stop stops the server as how says and waits until every process of
// it has exited; the data stay, for Start. A Fast or Immediate shutdown
// that takes more than a minute is ended by Kill. Stopping a stopped
// server does nothing. It returns an error only if the signal cannot be
// sent.
func (s *Server) Stop(how Shutdown) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked(how)
}

func (s *Server) stopLocked(how Shutdown) error {
	if s.proc == nil {
		return nil
	}
	pid := s.proc.cmd.Process.Pid
	var err error
	switch how {
	case Fast:
		err = syscall.Kill(pid, syscall.SIGINT)
	case Immediate:
		err = syscall.Kill(pid, syscall.SIGQUIT)
	case Kill:
		err = syscall.Kill(-pid, syscall.SIGKILL)
	default:
		return fmt.Errorf("pgtest: Stop: unknown mode %v", how)
	}
	if err != nil {
		return fmt.Errorf("pgtest: stop postgres (pid %d, %v): %w", pid, how, err)
	}
	select {
	case <-s.proc.done:
	case <-time.After(stopTimeout):
		syscall.Kill(-pid, syscall.SIGKILL)
		<-s.proc.done
		how = Kill
	}
	// The postmaster has exited; after a kill, so have (or will, at
	// once) its children, which the kill reached too. Wait for them:
	// the next start refuses shared memory that a process still uses.
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if groupGone(pid) {
			break
		}
	}
	s.proc = nil
	s.killed = how == Kill
	return nil
}

// groupGone reports whether no process of process group pgid is left but
// zombies (which hold no memory and wait for their new parent to reap
// them).
func groupGone(pgid int) bool {
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces and
		// parentheses, so split after the last ')'.
		st := string(b)
		i := strings.LastIndexByte(st, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(st[i+1:])
		if len(f) < 3 {
			continue
		}
		if g, _ := strconv.Atoi(f[2]); g == pgid && f[0] != "Z" {
			return false
		}
	}
	return true
}

// Restart stops the server as how says and starts it again on the same
// data and port, as a restart of PostgreSQL would: sessions end, and
// clients reconnect (a pgxpool drops the broken connections as they
// fail). Every committed transaction is still there (see the package
// doc). It returns an error if the server does not come back within a
// minute.
func (s *Server) Restart(how Shutdown) error {
	if err := s.Stop(how); err != nil {
		return err
	}
	var err error
	// The port was just released; retry briefly if it is still taken.
	for range 50 {
		if err = s.Start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("pgtest: restart: %w", err)
}

// Close stops the server (a fast shutdown), removes its files, and, if it
// was last killed, the System V shared memory segment the killed server
// left. It is safe to call more than once; StartServer's tb.Cleanup calls
// it. Pools of the server should be closed first (NewPool's are, by
// cleanups that run before this one).
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.stopLocked(Fast)
	if s.killed {
		removeShm(s.data)
	}
	if rerr := os.RemoveAll(s.dir); rerr != nil {
		err = errors.Join(err, fmt.Errorf("pgtest: %w", rerr))
	}
	return err
}

// removeShm removes the System V shared memory segment that a killed
// server's postmaster.pid names (its seventh line: key and id), if it
// still has that key. A cleanly stopped server removes it itself; a
// killed one leaves it, and the next start of the cluster would remove
// it.
func removeShm(data string) {
	f, err := os.Open(filepath.Join(data, "postmaster.pid"))
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		if line != 7 {
			continue
		}
		fs := strings.Fields(sc.Text())
		if len(fs) != 2 {
			return
		}
		key, err1 := strconv.ParseInt(fs[0], 10, 64)
		id, err2 := strconv.Atoi(fs[1])
		if err1 != nil || err2 != nil {
			return
		}
		var desc unix.SysvShmDesc
		if _, err := unix.SysvShmCtl(id, unix.IPC_STAT, &desc); err != nil || int64(desc.Perm.Key) != key {
			return
		}
		unix.SysvShmCtl(id, unix.IPC_RMID, nil)
		return
	}
}

// ringWriter keeps the last logLimit bytes written to it.
type ringWriter struct {
	mu  sync.Mutex
	buf []byte
}

func (w *ringWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	if over := len(w.buf) - logLimit; over > 0 {
		w.buf = append(w.buf[:0], w.buf[over:]...)
	}
	return len(p), nil
}

func (w *ringWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.buf)
}

// tail returns the last n bytes of s, trimmed.
func tail(s string, n int) string {
	if len(s) > n {
		s = s[len(s)-n:]
	}
	return strings.TrimSpace(s)
}
