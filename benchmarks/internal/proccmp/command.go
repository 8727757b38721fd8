package proccmp

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/fairlock/fairlock/redislock/redistest"
)

// Printer is a comparison's results as its command prints them.
type Printer interface {
	WriteText(io.Writer)
	WriteMarkdown(io.Writer)
}

// Command is the command line of a comparison's program: the flags every
// such program has, -quick, -markdown and -rounds, and its run.
type Command struct {
	name            string
	quick, markdown *bool
}

// NewCommand defines on flag.CommandLine the flags of the program name:
// -quick (with the usage quickUsage), -markdown, and -rounds, which sets
// *rounds. The program defines its own flags, then calls Main.
func NewCommand(name, quickUsage string, rounds *int) *Command {
	c := &Command{
		name:     name,
		quick:    flag.Bool("quick", false, quickUsage),
		markdown: flag.Bool("markdown", false, "print the table in Markdown"),
	}
	flag.IntVar(rounds, "rounds", *rounds, "interleaved rounds")
	return c
}

// DefineFlags defines on flag.CommandLine the flags of a lock
// comparison's program that set c: -handoffs and -duration.
func (c *Config) DefineFlags() {
	flag.IntVar(&c.HandOffs, "handoffs", c.HandOffs, "hand-offs per lock and round")
	flag.DurationVar(&c.HotDuration, "duration", c.HotDuration, "each hot-key run")
}

// Main parses the command line, calls quick if -quick was given (to set
// the program's configuration to its Quick one, whatever the other flags
// said), then run with the path of this program, which run starts as the
// comparison's workers. It prints run's results on stdout, as text or,
// with -markdown, as Markdown; on an error it prints "name: error" on
// stderr and exits with status 1.
func (c *Command) Main(quick func(), run func(exe string) (Printer, error)) {
	flag.Parse()
	if *c.quick {
		quick()
	}
	if err := c.run(run); err != nil {
		fmt.Fprintln(os.Stderr, c.name+":", err)
		os.Exit(1)
	}
}

func (c *Command) run(run func(exe string) (Printer, error)) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r, err := run(exe)
	if err != nil {
		return err
	}
	if *c.markdown {
		r.WriteMarkdown(os.Stdout)
	} else {
		r.WriteText(os.Stdout)
	}
	return nil
}

// StartRedis starts a redis-server (the binary must be on $PATH; see
// package redistest) in a temporary directory named for the program
// name, and returns its address and the function that stops it and
// removes the directory.
func StartRedis(name string) (addr string, stop func(), err error) {
	dir, err := os.MkdirTemp("", name)
	if err != nil {
		return "", nil, err
	}
	srv, err := redistest.NewServer(dir)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return srv.Addr(), func() {
		srv.Stop()
		os.RemoveAll(dir)
	}, nil
}
