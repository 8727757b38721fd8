package pgcmp

import (
	"context"
	"errors"

	"github.com/fairlock/fairlock/benchmarks/internal/proccmp"
)

// engine is what the harness calls this comparison.
var engine = &proccmp.Engine{
	Name:    "pgcmp",
	Program: "pg-compare",
	Env:     "PGCMP_WORKER",
	Names:   Names[:],
}

// Comparison is a running comparison: a pool of the server, this
// process's locks, and three worker processes. Its scenarios and Run are
// proccmp.Comparison's.
type Comparison struct {
	*proccmp.Comparison
	cfg Config
}

// Start starts a comparison on the PostgreSQL server of dsn with cfg
// (zero fields take Defaults): it creates the rank counters' table
// (pgcmp_rank) and pglock's tables if missing, reads the server's
// version for the table's header, makes this process's locks and starts
// three workers by running argv (the program itself; see IsWorker).
// Close stops them.
func Start(dsn string, argv []string, cfg Config) (*Comparison, error) {
	cfg = cfg.withDefaults()
	ls, err := open(dsn, cfg)
	if err != nil {
		return nil, err
	}
	ctx := context.Background()
	var version string
	if _, err := ls.pool.Exec(ctx, rankTable); err != nil {
		return nil, errors.Join(err, ls.Close())
	}
	if err := ls.pool.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return nil, errors.Join(err, ls.Close())
	}
	c, err := proccmp.Start(engine, proccmp.Setup{
		Config:  cfg.Config,
		Locks:   ls,
		Argv:    argv,
		Spec:    workerSpec{DSN: dsn, Config: cfg},
		Server:  "PostgreSQL server (PostgreSQL " + version + ")",
		Waiting: waiting(cfg),
	})
	if err != nil {
		return nil, err
	}
	return &Comparison{c, cfg}, nil
}

// Config returns the comparison's configuration, defaults filled in.
func (c *Comparison) Config() Config { return c.cfg }
