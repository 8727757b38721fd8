//go:build !unix

package disttest

import (
	"os"
	"testing"
)

// Stop skips t: a process cannot be stopped and resumed here.
func (p *Proc) Stop(t testing.TB) { t.Skip("disttest: SIGSTOP needs a Unix system") }

// Cont skips t: a process cannot be stopped and resumed here.
func (p *Proc) Cont(t testing.TB) { t.Skip("disttest: SIGCONT needs a Unix system") }

// resume does nothing: no process is stopped here.
func resume(*os.Process) {}

// notifyCont returns a channel that never receives.
func notifyCont() (<-chan os.Signal, func()) { return nil, func() {} }

// canStop is whether Stop and Cont work on this system.
const canStop = false
