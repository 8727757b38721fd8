//go:build unix

package disttest

import (
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// Stop stops the worker (SIGSTOP): none of its threads runs, its timers
// included, until Cont, as a long GC pause or a suspended VM would.
func (p *Proc) Stop(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
}

// Cont resumes the worker that Stop stopped (SIGCONT).
func (p *Proc) Cont(t testing.TB) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// resume sends SIGCONT to a process that may be stopped, before it is
// killed, ignoring errors (a process that has exited cannot be
// signalled).
func resume(p *os.Process) { _ = p.Signal(syscall.SIGCONT) }

// notifyCont returns a channel that receives when this process is
// resumed (SIGCONT), and a function that stops the notification.
func notifyCont() (<-chan os.Signal, func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGCONT)
	return ch, func() { signal.Stop(ch) }
}

// canStop is whether Stop and Cont work on this system.
const canStop = true
