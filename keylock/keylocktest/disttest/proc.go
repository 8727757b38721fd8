package disttest

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"
)

// Worker processes. Start re-executes the test binary with the Worker in
// its environment; the binary's TestMain sees it (IsWorker) and does the
// worker's role instead of running the tests.

// workerEnv is the environment variable that carries a worker's Worker,
// encoded as JSON.
const workerEnv = "FAIRLOCK_TEST_WORKER"

// Worker is what a worker process is asked to do.
type Worker struct {
	Role   string            // the role: one of Run's, or the backend's own
	Server string            // what to dial: the backend's Backend.Server
	Prefix string            // the prefix of the Locker to make
	Key    string            // the key to work on
	TTL    time.Duration     // the Locker's TTL (WithTTL)
	Args   map[string]string // the role's own parameters
}

// IsWorker reports whether this process is a worker that Start started
// and, if so, returns its Worker. A backend's TestMain calls it before
// anything else, and runs the worker instead of the tests when it
// reports true.
func IsWorker() (Worker, bool) {
	s := os.Getenv(workerEnv)
	if s == "" {
		return Worker{}, false
	}
	var w Worker
	if err := json.Unmarshal([]byte(s), &w); err != nil {
		w.Role = "" // Run reports the bad environment
		w.Args = map[string]string{"error": err.Error()}
	}
	return w, true
}

// Proc is a worker process that Start started.
type Proc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // its stdout, line by line; closed at EOF
	done  chan error  // its exit, once the lines are read; put back by whoever takes it
}

// Start starts the test binary as a worker doing w, with env (NAME=value)
// added to its environment, and returns at once. The worker's stderr is
// the test's; its stdout comes line by line through Line, Wait or
// Collect. t.Cleanup kills it (resuming it first, if it was stopped) if
// it still runs, and waits for it.
func Start(t testing.TB, w Worker, env ...string) *Proc {
	t.Helper()
	b, err := json.Marshal(w)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), workerEnv+"="+string(b)), env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Proc{cmd: cmd, stdin: in, lines: make(chan string, 100), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		resume(cmd.Process)
		_ = cmd.Process.Kill()
		for range p.lines {
		}
		<-p.done
		in.Close()
	})
	return p
}

// Pid returns the worker's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the worker.
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Kill kills the worker at once (SIGKILL), failing t if it cannot.
func (p *Proc) Kill(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
}

// Send writes line and a newline to the worker's standard input (where
// a role reads its cues, Worker.Cue), failing t if it cannot.
func (p *Proc) Send(t testing.TB, line string) {
	t.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		t.Fatal(err)
	}
}

// Line returns the worker's next line, failing t if the worker exits or
// says nothing within d.
func (p *Proc) Line(t testing.TB, d time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatal("worker exited")
		}
		return l
	case <-time.After(d):
		t.Fatalf("worker said nothing within %v", d)
	}
	return ""
}

// Wait waits for the worker to exit and returns the lines it said that
// Line had not returned; it fails t if the worker fails (a non-zero
// exit) or still runs after d.
func (p *Proc) Wait(t testing.TB, d time.Duration) []string {
	t.Helper()
	var lines []string
	timeout := time.After(d)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				err := <-p.done
				p.done <- err // for Cleanup
				if err != nil {
					t.Fatalf("worker: %v; output %q", err, lines)
				}
				return lines
			}
			lines = append(lines, line)
		case <-timeout:
			t.Fatalf("worker still running after %v; output %q", d, lines)
		}
	}
}

// Output is every line a worker said and its exit.
type Output struct {
	Lines []string
	Err   error // the exit: nil, or an *exec.ExitError
}

// Collect reads every line of the worker on a goroutine of its own,
// calling see with each as it comes (see must not block for long), and
// delivers them with the worker's exit on the channel it returns, once
// the worker has exited. Use it instead of Line and Wait, not beside
// them.
func (p *Proc) Collect(see func(string)) <-chan Output {
	ch := make(chan Output, 1)
	go func() {
		var o Output
		for line := range p.lines {
			see(line)
			o.Lines = append(o.Lines, line)
		}
		o.Err = <-p.done
		p.done <- o.Err // for Cleanup
		ch <- o
	}()
	return ch
}
