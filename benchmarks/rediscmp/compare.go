package rediscmp

import (
	"github.com/fairlock/fairlock/benchmarks/internal/proccmp"
)

// engine is what the harness calls this comparison.
var engine = &proccmp.Engine{
	Name:    "rediscmp",
	Program: "redis-compare",
	Env:     "REDISCMP_WORKER",
	Names:   Names[:],
}

// Comparison is a running comparison: a client of the server, this
// process's locks, and three worker processes. Its scenarios and Run are
// proccmp.Comparison's.
type Comparison struct {
	*proccmp.Comparison
	cfg Config
}

// Start starts a comparison on the Redis server at addr with cfg (zero
// fields take Defaults): it makes this process's locks and starts three
// workers by running argv (the program itself; see IsWorker). Close
// stops them.
func Start(addr string, argv []string, cfg Config) (*Comparison, error) {
	cfg = cfg.withDefaults()
	ls, err := open(addr, cfg)
	if err != nil {
		return nil, err
	}
	c, err := proccmp.Start(engine, proccmp.Setup{
		Config:  cfg.Config,
		Locks:   ls,
		Argv:    argv,
		Spec:    workerSpec{Addr: addr, Config: cfg},
		Server:  "redis-server",
		Waiting: waiting(cfg),
	})
	if err != nil {
		return nil, err
	}
	return &Comparison{c, cfg}, nil
}

// Config returns the comparison's configuration, defaults filled in.
func (c *Comparison) Config() Config { return c.cfg }
