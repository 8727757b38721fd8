package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartPgBouncer starts a real PgBouncer in front of the server, on a
// free loopback port, with pool_mode poolMode ("session", "transaction"
// or "statement"), trust authentication for the user "postgres", and
// every database of the server; it returns a connection string like
// ConnString's that goes through it, and stops it in tb.Cleanup. It is
// for tests of what a client does behind a pooler (LISTEN, for one, does
// not work through transaction pooling). PgBouncer before 1.21 keeps no
// prepared statements in transaction mode: a pgx pool through it needs
// pgx.QueryExecModeExec or another mode that prepares nothing.
//
// The binary is the pgbouncer of Debian's pgbouncer package
// (/usr/sbin/pgbouncer), or on $PATH; a test fails at once, saying so,
// when there is none. Like the server, it runs as the unprivileged user
// when this process is root (it refuses to run as root too). It fails tb
// if PgBouncer does not accept connections within a minute.
func (s *Server) StartPgBouncer(tb testing.TB, poolMode string) string {
	tb.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		if isExec("/usr/sbin/pgbouncer") {
			bin = "/usr/sbin/pgbouncer"
		} else {
			tb.Fatal("pgtest: pgbouncer is not installed (apt-get install pgbouncer)")
		}
	}
	dir := filepath.Join(s.dir, "pgbouncer-"+poolMode+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	if err := os.Mkdir(dir, 0o700); err != nil {
		tb.Fatal(err)
	}
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			tb.Fatal(err)
		}
	}
	port, err := freePort()
	if err != nil {
		tb.Fatal(err)
	}
	users := filepath.Join(dir, "users.txt")
	ini := filepath.Join(dir, "pgbouncer.ini")
	config := "[databases]\n* = host=127.0.0.1 port=" + strconv.Itoa(s.port) + "\n\n[pgbouncer]\n" +
		"listen_addr = 127.0.0.1\nlisten_port = " + strconv.Itoa(port) + "\n" +
		"unix_socket_dir =\nauth_type = trust\nauth_file = " + users + "\n" +
		"pool_mode = " + poolMode + "\nmax_client_conn = 200\ndefault_pool_size = 20\n" +
		"ignore_startup_parameters = extra_float_digits\n"
	for name, text := range map[string]string{users: `"postgres" ""` + "\n", ini: config} {
		if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	cmd := exec.Command(bin, ini)
	cmd.Dir = dir
	logs := &ringWriter{}
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("pgtest: start pgbouncer: %v", err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(func() {
		syscall.Kill(cmd.Process.Pid, syscall.SIGTERM) // PgBouncer's immediate shutdown
		select {
		case <-p.done:
		case <-time.After(stopTimeout):
			cmd.Process.Kill()
			<-p.done
		}
	})
	url := "postgres://postgres@127.0.0.1:" + strconv.Itoa(port) + "/postgres?sslmode=disable"
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	for deadline := time.Now().Add(startTimeout); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			_, err = c.Exec(ctx, "SELECT 1")
			c.Close(ctx)
		}
		cancel()
		if err == nil {
			return url
		}
		select {
		case <-p.done:
			tb.Fatalf("pgtest: pgbouncer exited (%v): %s", p.err, tail(logs.String(), 2000))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			tb.Fatal(errors.Join(fmt.Errorf("pgtest: pgbouncer on port %d accepted no connection within %v", port, startTimeout), err))
		}
	}
}
