package disttest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/flight"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
)

// The worker's side: the roles every backend's workers share. A role
// reports on stdout, one line per event (Worker.Say), and the checks
// read those lines.

// Tools is what the shared roles use in a worker process: its Locker on
// Worker.Prefix (made with Worker.TTL), a fenced store of that prefix
// (Backend.Store), and, for the role "flight", a flight.Store
// (Backend.Cache).
type Tools struct {
	Locker keylock.Locker
	Store  Store
	Cache  flight.Store[string]
}

// Run does w's role with tools, and returns the worker's exit code: 0,
// or 1 once it has said "error" and the error. The roles of this
// package:
//
//   - "fifo": Lock Key once, append "ID:TOKEN" to Key's log fenced with
//     the grant (Args["id"]), say "granted ID TOKEN", Unlock.
//   - "hold": Lock Key, with a flow labelled Args["label"] if there is
//     one (owner.NewLabeledContext), say "held TOKEN", and stay until
//     killed.
//   - "queue": Lock Key (queue until granted or killed), say "granted",
//     Unlock.
//   - "paused": Lock Key, say "held TOKEN", then check keylock.Valid in
//     loops until the first checks after the process was stopped and
//     resumed, and say what they saw (see pausedRole); then wait for
//     Lost, try a fenced write, Unlock, and say each outcome.
//   - "flight": a process of the check FlightOneFill (see flightRole).
//   - "elect": a candidate of the election on Key, with the value
//     Args["value"], driven by the test's cues (see electRole).
//
// Any other role is other's, which runs with the worker's context; a nil
// other fails such a role.
func (w Worker) Run(tools Tools, other func(ctx context.Context) error) int {
	ctx := context.Background()
	var err error
	switch w.Role {
	case "":
		err = fmt.Errorf("no role in %s (%s)", workerEnv, w.Args["error"])
	case "fifo":
		err = w.fifoRole(ctx, tools)
	case "hold":
		var g keylock.Lease
		hctx := ctx
		if label, ok := w.Args["label"]; ok {
			hctx = owner.NewLabeledContext(ctx, label)
		}
		if g, err = tools.Locker.Lock(hctx, w.Key); err == nil {
			w.Say("held", g.Token())
			select {} // until killed
		}
	case "queue":
		var g keylock.Lease
		if g, err = tools.Locker.Lock(ctx, w.Key); err == nil {
			w.Say("granted")
			err = g.Unlock(ctx)
		}
	case "paused":
		err = w.pausedRole(ctx, tools)
	case "flight":
		err = w.flightRole(ctx, tools)
	case "elect":
		err = w.electRole(ctx, tools)
	default:
		if other == nil {
			err = fmt.Errorf("unknown role %q", w.Role)
		} else {
			err = other(ctx)
		}
	}
	if err != nil {
		w.Say("error", err)
		return 1
	}
	return 0
}

// Fail says "error" and err, and returns the exit code of a failed
// worker: for a worker that fails before Run (it cannot dial, or make
// its Locker).
func (w Worker) Fail(err error) int {
	w.Say("error", err)
	return 1
}

// stdout serialises the lines of a worker's goroutines.
var stdout sync.Mutex

// Say prints a line of a, separated by spaces (fmt.Println), on the
// worker's stdout, where the test reads it: safe for concurrent use.
func (w Worker) Say(a ...any) {
	stdout.Lock()
	defer stdout.Unlock()
	fmt.Println(a...)
}

// Cue waits for the next line the test sends (Proc.Send) and returns it,
// or the error that ended the worker's stdin.
func (w Worker) Cue() (string, error) {
	cueOnce.Do(func() { cue = bufio.NewReader(os.Stdin) })
	line, err := cue.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(line, "\n"), nil
}

var (
	cueOnce sync.Once
	cue     *bufio.Reader
)

// fifoRole locks the key once and logs "ID:TOKEN" through the fenced
// store: the log is the grant order.
func (w Worker) fifoRole(ctx context.Context, tools Tools) error {
	g, err := tools.Locker.Lock(ctx, w.Key)
	if err != nil {
		return err
	}
	id := w.Args["id"]
	ok, err := tools.Store.Append(ctx, w.Key, g.Token(), fmt.Sprintf("%s:%d", id, g.Token()))
	if err == nil && !ok {
		err = errors.New("fenced write refused")
	}
	if err != nil {
		return err
	}
	w.Say("granted", id, g.Token())
	return g.Unlock(ctx)
}

// pausedRole is the role "paused": the holder of the check
// ProcessPaused.
//
// It locks the key, says "held TOKEN", and then checks keylock.Valid in
// tight loops, one per P (runtime.GOMAXPROCS, raised to 4 at least, so
// that some loop's thread is likely among the first the kernel runs
// after SIGCONT), each reading the clock before and after each of its
// checks. The test stops the process (SIGSTOP) while they loop, until
// the engine has granted the key to another process, and then resumes
// it (SIGCONT). A gap of at least
// Args["gap"] between one check's end and the next one's start is the
// pause, and the check after it the loop's first to begin after the
// process resumed; if the pause fell inside a check instead (its start
// and end that far apart), that check straddled it, and the next one is
// the first. The loops never yield and keep every P busy, so the
// runtime's timers (the one that closes Lost among them) run only once
// the scheduler preempts a loop, and a loop's first check after resuming
// comes first in most runs. It then says
//
//	check valid=V lost=L pause=P
//
// V: whether any loop's first check after resuming found the grant
// Valid; L: whether Lost was closed when every one of those checks
// returned (if so, the run proves nothing: Valid may have read it); P:
// the pause as the loops measured it, at least. If a loop found Valid
// false before any pause (the grant was lost while the process ran), it
// says "invalid before the pause" instead. Then it says "continued" if
// the runtime delivers the SIGCONT within the gap of the checks (the
// pause was the test's), "continued late" if later, "no SIGCONT" if not
// within a minute; it waits up to a minute for Lost and says "lost";
// tries a fenced write and says "write accepted: OK ERR"; Unlocks and
// says "unlock lost: B", B whether Unlock's error wraps
// fairlock.ErrLost.
func (w Worker) pausedRole(ctx context.Context, tools Tools) error {
	gap, err := time.ParseDuration(w.Args["gap"])
	if err != nil {
		return fmt.Errorf("gap: %v", err)
	}
	cont, stop := notifyCont()
	defer stop()
	loops := max(4, runtime.GOMAXPROCS(0))
	runtime.GOMAXPROCS(loops)
	g, err := tools.Locker.Lock(ctx, w.Key)
	if err != nil {
		return err
	}
	if !keylock.Valid(g) {
		return errors.New("a grant just taken is not Valid")
	}
	var (
		mu      sync.Mutex // protects the results below
		valid   bool       // a first check after resuming found the grant Valid
		seen    = true     // every first check after resuming returned with Lost closed
		pause   time.Duration
		before  bool // a loop found the grant not Valid before any pause
		checked time.Time
	)
	held := time.Now() // before the test can stop the process: it stops it once it has read "held"
	w.Say("held", g.Token())
	var wg sync.WaitGroup
	for range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, lost, p := firstCheckAfterPause(g, held, gap)
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if p == 0 {
				before = true
				return
			}
			valid = valid || v
			seen = seen && lost
			pause = max(pause, p)
			checked = now
		}()
	}
	wg.Wait()
	if before {
		w.Say("invalid before the pause")
	} else {
		w.Say("check", "valid="+strconv.FormatBool(valid), "lost="+strconv.FormatBool(seen), "pause="+pause.String())
	}
	select {
	case <-cont:
		if before || time.Since(checked) > gap {
			w.Say("continued late")
		} else {
			w.Say("continued")
		}
	case <-time.After(time.Minute):
		w.Say("no SIGCONT")
	}
	select {
	case <-g.Lost():
		w.Say("lost")
	case <-time.After(time.Minute):
		return errors.New("lost not closed within a minute")
	}
	ok, werr := tools.Store.Append(ctx, w.Key, g.Token(), "paused")
	w.Say("write accepted:", ok, werr)
	uerr := g.Unlock(ctx)
	w.Say("unlock lost:", errors.Is(uerr, fairlock.ErrLost))
	return nil
}

// firstCheckAfterPause checks keylock.Valid(g) in a loop until its first
// check that begins after a pause of at least gap (the clock read at
// end, the start of the loop, counts as a check's end), and returns what
// Valid returned then, whether Lost was closed once Valid had returned,
// and the pause. It returns a zero pause if Valid returned false before
// any pause.
func firstCheckAfterPause(g keylock.Lease, end time.Time, gap time.Duration) (valid, lost bool, pause time.Duration) {
	for {
		start := time.Now()
		valid = keylock.Valid(g)
		lost = isClosed(g.Lost())
		now := time.Now()
		before := start.Sub(end)
		end = now
		switch {
		case now.Sub(start) >= gap: // the pause fell inside this check
			pause = now.Sub(start)
		case before >= gap:
			return valid, lost, before
		case pause > 0: // the first check after one that straddled the pause
			return valid, lost, pause
		case !valid:
			return valid, lost, 0
		}
	}
}

// isClosed reports whether ch is closed, without waiting.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
