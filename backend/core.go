package backend

import (
	"context"
	"strconv"
	"sync"

	"github.com/fairlock/fairlock/keylock"
)

// A Core's life: New makes it and Start starts it, once the backend has
// set up its engine (Abort if that failed); Close (close.go) ends it.

// names counts the Lockers made per default-name stem.
var names struct {
	mu sync.Mutex
	n  map[string]int64
}

// New returns a Core for a Locker or Semaphore configured by cfg and s
// (NewSettings). It starts nothing: the backend sets up its engine, which
// may start goroutines of its own with Go, then calls Start, or Abort if
// its setup failed.
func New(cfg Config, s Settings) *Core {
	name := s.Name
	if name == "" {
		names.mu.Lock()
		if names.n == nil {
			names.n = make(map[string]int64)
		}
		names.n[cfg.DefaultName]++
		name = cfg.DefaultName + "-" + strconv.FormatInt(names.n[cfg.DefaultName], 10)
		names.mu.Unlock()
	}
	k := &Core{
		pkg:       cfg.Package,
		kind:      cfg.Kind,
		size:      cfg.Size,
		name:      name,
		ttl:       s.TTL,
		logger:    s.Logger,
		observe:   s.Observer,
		debug:     s.Debug,
		process:   keylock.LocalProcess(name),
		closed:    make(chan struct{}),
		kick:      make(chan struct{}, 1),
		reread:    make(chan struct{}, 1),
		renewKick: make(chan struct{}, 1),
		keys:      make(map[string][]*Call),
		ids:       make(map[string]*Call),
		sessions:  make(map[string]*Session),
		janitor:   make(map[string]cleanup),
		idle:      make(chan struct{}, 1),
	}
	k.closing, k.beginClose = context.WithCancel(context.Background())
	k.bg, k.stopBg = context.WithCancel(context.Background())
	return k
}

// Start starts the kit's goroutines (the session renewal and the
// janitor) with e as the Core's engine, and registers the Locker with its
// Observer and, with WithDebug, the debug registry.
func (k *Core) Start(e Engine) {
	k.engine = e
	k.watcher, _ = e.(Watcher)
	k.checker, _ = e.(Checker)
	if en, ok := e.(SessionEnder); ok {
		k.ender = en // else the Keeper's, if NewKeeper made one
	}
	if k.observe != nil {
		k.obs = k.observe.Register(k.name, k.stats)
	}
	if k.debug {
		k.unreg = k.register()
	}
	k.Go(k.renewLoop)
	k.Go(k.janitorLoop)
}

// Abort stops what Go started, for a backend whose setup failed before
// Start.
func (k *Core) Abort() {
	k.beginClose()
	k.stopBg()
	k.wg.Wait()
}
