package rediscmp

import (
	"github.com/fairlock/fairlock/benchmarks/internal/proccmp"
)

// The scenarios across processes run the locks in worker processes: the
// program (cmd/redis-compare, or the test binary) re-executed with
// REDISCMP_WORKER set to the JSON of a workerSpec, which speak
// proccmp.RunWorker's protocol. A waiter's rank counter is an INCR; a
// holder that is killed keeps its grant alive with redsync's Extend,
// bsm/redislock's Refresh, or redislock's own session, every third of the
// TTL.

// workerSpec is what a worker is told.
type workerSpec struct {
	Addr   string
	Config Config
}

// IsWorker reports whether this process was started as a worker of a
// comparison; the program's main (or TestMain) then calls RunWorker and
// exits with its result.
func IsWorker() bool { return engine.IsWorker() }

// RunWorker runs a worker process (IsWorker) until its stdin closes, and
// returns its exit code.
func RunWorker() int {
	return proccmp.RunWorker(engine, func(s workerSpec) (proccmp.Locks, error) {
		return open(s.Addr, s.Config)
	})
}
