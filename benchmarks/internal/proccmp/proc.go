package proccmp

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// A worker process is the program (a comparison's command, or the test
// binary) re-executed with an environment variable set to the JSON of
// its spec: StartProc starts one, IsWorker tells the program that it is
// one, and ReadSpec reads the spec. It reads one command a line on stdin
// and answers on stdout, a line an event, and exits when stdin closes.

// IsWorker reports whether this process was started as a worker whose
// spec is in the environment variable env.
func IsWorker(env string) bool { return os.Getenv(env) != "" }

// ReadSpec decodes into spec the JSON that StartProc passed this worker
// process through the environment variable env.
func ReadSpec(env string, spec any) error {
	return json.Unmarshal([]byte(os.Getenv(env)), spec)
}

// Proc is a worker process, seen from the parent.
type Proc struct {
	name  string // the comparison's package, the prefix of errors
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // its stdout, line by line; closed at EOF
	stash [][]string  // lines read but not yet expected
	done  chan struct{}
}

// StartProc starts argv as a worker with the JSON of spec in the
// environment variable env; its stderr is the parent's. name prefixes
// the errors of the Proc's methods. A line of the worker's stdout may
// hold up to 1 MiB.
func StartProc(name string, argv []string, env string, spec any) (*Proc, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env+"="+string(b))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Proc{name: name, cmd: cmd, stdin: stdin, lines: make(chan string, 1024), done: make(chan struct{})}
	go func() {
		s := bufio.NewScanner(stdout)
		s.Buffer(nil, 1<<20) // a line may hold a number per request
		for s.Scan() {
			p.lines <- s.Text()
		}
		close(p.lines)
		_ = cmd.Wait() // after the last read, as exec.Cmd.StdoutPipe asks
		close(p.done)
	}()
	return p, nil
}

// Send writes one command line, its fields separated by spaces.
func (p *Proc) Send(fields ...any) error {
	_, err := fmt.Fprintln(p.stdin, fields...)
	return err
}

// Expect returns the fields of the first line, stashed or new, that
// satisfy match, stashing the others; an "error" line or the worker's
// exit is an error, and so is nothing within timeout.
func (p *Proc) Expect(timeout time.Duration, match func(f []string) bool) ([]string, error) {
	if i := slices.IndexFunc(p.stash, match); i >= 0 {
		f := p.stash[i]
		p.stash = slices.Delete(p.stash, i, i+1)
		return f, nil
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				return nil, errors.New(p.name + ": the worker exited")
			}
			f := strings.Fields(line)
			if len(f) > 0 && f[0] == "error" {
				return nil, fmt.Errorf("%s: worker: %s", p.name, line)
			}
			if match(f) {
				return f, nil
			}
			p.stash = append(p.stash, f)
		case <-t.C:
			return nil, fmt.Errorf("%s: no answer from the worker within %v", p.name, timeout)
		}
	}
}

// Is returns a match for Expect: a line of the given first fields.
func Is(first ...string) func([]string) bool {
	return func(f []string) bool {
		return len(f) >= len(first) && slices.Equal(f[:len(first)], first)
	}
}

// Kill kills the worker (SIGKILL) and waits for it to exit.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	p.drain()
}

// Stop closes the worker's stdin, so that it exits, and kills it if it
// has not within 10 s.
func (p *Proc) Stop() {
	_ = p.stdin.Close()
	t := time.AfterFunc(10*time.Second, func() { _ = p.cmd.Process.Kill() })
	defer t.Stop()
	p.drain()
}

// drain discards the worker's output until it exits.
func (p *Proc) drain() {
	for range p.lines {
	}
	<-p.done
}
