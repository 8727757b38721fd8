package keylock

import (
	"context"
	"os"
	"strconv"
	"sync"
	"time"
)

// Who holds a key, from any process: a Lister lists the calls on a key
// across every process that shares the lock (for the in-process lock,
// across the Locker's flows), in grant order, each with the label of the
// flow that made it (owner.NewLabeledContext) and the process it was made
// in. It is how a process that takes no part in a key's queue learns who
// holds it (package elect reads the leader so), and how a debug dump of a
// waiting call names the holder in another process that it waits for.

// The modes of a call, as CallInfo.Mode names them: the names the debug
// registry and package debug use.
const (
	ModeExclusive = "exclusive" // Lock, TryLock: the only holder
	ModeShared    = "shared"    // RLock, TryRLock: one of any number of readers
	ModeUnits     = "units"     // Semaphore.Acquire, TryAcquire: some of the key's units
	ModeWait      = "wait"      // Wait: a turn in the queue, holding nothing
)

// Process names where a call was made: the host, the process id and the
// name of the Locker (or Semaphore) that made it (the backend's WithName,
// or the name it generated). Two Lockers of one process are two
// Processes, told apart by their names.
type Process struct {
	Host   string // the host name, as os.Hostname returned it ("" if it failed)
	PID    int    // the process id on that host
	Locker string // the Locker's name
}

// String returns `host:pid "locker"`: the Locker's name quoted, control
// characters escaped, so that no name can forge a line of a dump.
func (p Process) String() string {
	return p.Host + ":" + strconv.Itoa(p.PID) + " " + strconv.Quote(p.Locker)
}

// hostname is os.Hostname, read once.
var hostname = sync.OnceValue(func() string {
	h, _ := os.Hostname()
	return h
})

// LocalProcess returns the Process of a Locker named locker in this
// process: this host's name (os.Hostname, read once) and this process's
// id. Backends record it with each call they write.
func LocalProcess(locker string) Process {
	return Process{Host: hostname(), PID: os.Getpid(), Locker: locker}
}

// CallInfo is one call on a key as a Lister lists it: a grant, or a call
// queued for one.
type CallInfo struct {
	// Label is the label of the flow that made the call
	// (owner.NewLabeledContext, read with owner.LabelOf when the call
	// began); "" for a flow without one, or where the backend did not
	// record it (see Lister). After a HandOff, an in-process listing
	// shows the new owner's; a distributed backend keeps the label the
	// call's entry was written with.
	Label string
	// Process is where the call was made.
	Process Process
	// Mode is what the call holds or asks for: ModeExclusive,
	// ModeShared, ModeUnits or ModeWait.
	Mode string
	// Units is what a Semaphore call holds or asks for; 0 outside a
	// Semaphore.
	Units int64
	// Held: the call holds the key (for a Wait: its turn has come, and
	// it is about to return). Every held call comes before every queued
	// one.
	Held bool
	// Token is a held call's fencing token (Lease.Token); 0 for a
	// queued call.
	Token uint64
	// Age is how long ago the call joined the key's queue (in process,
	// for a held call: how long ago it was granted), on the clock the
	// backend says (Lister); 0 where it is not known.
	Age time.Duration
}

// Lister is implemented by the Lockers and Semaphores that can list a
// key's calls: the in-process views (InProcess, InProcessSemaphore),
// etcdlock's and redislock's. A caller asserts it on its Locker:
//
//	if ls, ok := l.(keylock.Lister); ok { calls, err := ls.Calls(ctx, key) }
//
// What each records, and whose clock an Age is on:
//
//   - In process: every call's owner and mode; labels and ages are
//     recorded with fairlock.WithDebug (ages also with an Observer), and
//     otherwise a call's label is its owner's while a context carrying
//     the flow is reachable (owner.ID.Label), and its Age is 0. The
//     Process is this one's, with the Locker's name. A listing takes one
//     shard mutex.
//   - etcd: each call's key holds its label, its process and the wall
//     clock of the process that wrote it, so an Age is the reader's wall
//     clock against the writer's: off by the skew between their clocks.
//     A listing is one linearizable range read.
//   - Redis: each Locker's session marker on a key holds its process,
//     and a labelled call's label is kept beside its entry until the
//     entry goes; an Age is the server's clock against the call's token,
//     which is the server's clock in microseconds when the call queued
//     (or a little ahead of it). A listing is one script, which purges
//     the dead entries at the head of the queue first, as Locked does.
//
// A listing is one instant of the key's queue; calls may be granted,
// released or queued an instant later.
type Lister interface {
	// Calls returns key's calls in grant order, the held ones first
	// (for a Semaphore, or shared holds, in the order they were
	// granted), then the queued ones in the order they will be granted.
	// A key without calls gives a nil slice. It fails with an error
	// wrapping the context's if ctx ends first, fairlock.ErrClosed once
	// the Locker is closed (a distributed backend), or the backend's
	// error; it allocates the slice.
	Calls(ctx context.Context, key string) ([]CallInfo, error)
}
