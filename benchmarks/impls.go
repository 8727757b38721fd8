// Package benchmarks measures fairlock side by side with the keyed locks
// Go services would otherwise use. It is its own module, so the library
// gains no dependency from it. cmd/compare runs every scenario in
// interleaved rounds and prints each implementation's figures and
// fairlock's ratio to them; bench_test.go has the same scenarios as Go
// benchmarks.
package benchmarks

import (
	"context"
	"reflect"
	"sync"

	"github.com/containerd/containerd/pkg/kmutex"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/moby/locker"
	"golang.org/x/sync/semaphore"
	"k8s.io/utils/keymutex"
)

// Impl is one keyed lock under test.
type Impl struct {
	Name string
	// New makes a fresh exclusive lock, for scenarios 1 to 7. It is nil
	// for the peers of fairlock's other modes (ModePeers), which take part
	// only in the scenarios of their mode.
	New func() Keyed
	// NewRW makes a fresh lock with shared holds, for the scenarios of
	// RLock; nil if the implementation has none.
	NewRW func() RWKeyed
	// NewSemaphore makes a fresh keyed semaphore with n units per key, for
	// the scenarios of Semaphore; nil if the implementation is not one.
	NewSemaphore func(n int64) SemKeyed
	// The flags describe the exclusive lock that New makes.
	//
	// Cancellable: Lock honours its context (a waiter can give up).
	Cancellable bool
	// PerKeyState: the lock keeps state per key (so it can leak entries).
	PerKeyState bool
	// SingleKey: the lock ignores the key (the bare sync.Mutex floor); it
	// only takes part in single-key scenarios.
	SingleKey bool
	// Unbounded: one goroutine may hold many distinct keys at once without
	// deadlocking itself (false for hashed locks, where keys share mutexes).
	Unbounded bool
}

// Keyed is a lock instance. Handles are per goroutine so that adapters
// store what their Unlock needs without allocating.
type Keyed interface {
	Handle() Handle
	// Entries returns how many per-key entries the lock holds now, or -1
	// if it keeps none.
	Entries() int
}

// pad keeps each goroutine's handle on cache lines of its own, so that
// handles written on every operation do not share a line between cores.
type pad [128]byte

// Handle locks one key at a time for one goroutine.
type Handle interface {
	Lock(ctx context.Context, key string) error
	Unlock()
}

// Impls lists the exclusive keyed locks, fairlock first, then the peers:
// the two keyed locks of other projects, the map of sync.Mutex a service
// would write itself, k8s's hashed stripes, and one bare sync.Mutex.
// fairlock's entry also makes its RLock's lock and its Semaphore.
func Impls() []Impl {
	return []Impl{
		{
			Name: "fairlock", New: newFair, NewRW: newFairRW, NewSemaphore: newFairSemaphore,
			Cancellable: true, PerKeyState: true, Unbounded: true,
		},
		{Name: "moby/locker", New: newMoby, PerKeyState: true, Unbounded: true},
		{Name: "containerd/kmutex", New: newContainerd, Cancellable: true, PerKeyState: true, Unbounded: true},
		{Name: "sync.Mutex map", New: newTextbook, PerKeyState: true, Unbounded: true},
		{Name: "k8s/keymutex", New: newK8s},
		{Name: "sync.Mutex", New: newBare, SingleKey: true},
	}
}

// ModePeers lists the peers of fairlock's other modes, each written as a
// service would write it: a map of reference-counted sync.RWMutex behind a
// global mutex (for RLock and Lock), and a map of reference-counted
// golang.org/x/sync semaphores behind a global mutex (for Semaphore). They
// have no exclusive lock of their own (New is nil), and the flags, which
// describe that lock, are false. moby/locker's
// RWMutexMap, of its v2, is not here: the module proxy has no
// github.com/moby/locker/v2, only v1.0.1, which has no shared mode.
func ModePeers() []Impl {
	return []Impl{
		{Name: "sync.RWMutex map", NewRW: newRWMap},
		{Name: "x/sync semaphore map", NewSemaphore: newSemMap},
	}
}

// RWKeyed is a lock instance with shared holds.
type RWKeyed interface {
	RWHandle() RWHandle
	// Entries returns how many per-key entries the lock holds now.
	Entries() int
}

// RWHandle locks one key at a time for one goroutine: Lock exclusively,
// RLock shared; Unlock releases either.
type RWHandle interface {
	Handle
	RLock(ctx context.Context, key string) error
}

// SemKeyed is a keyed semaphore instance.
type SemKeyed interface {
	SemHandle() SemHandle
	// Entries returns how many per-key entries the semaphore holds now.
	Entries() int
}

// SemHandle takes units of one key at a time for one goroutine.
type SemHandle interface {
	// Acquire takes w units of key.
	Acquire(ctx context.Context, key string, w int64) error
	// Unlock gives back the units of the last Acquire.
	Unlock()
}

// fairlock

type fair struct{ l *fairlock.Locker[string] }

func newFair() Keyed     { return fair{fairlock.New[string]()} }
func newFairRW() RWKeyed { return fair{fairlock.New[string]()} }

func (f fair) Handle() Handle     { return &fairHandle{l: f.l} }
func (f fair) RWHandle() RWHandle { return &fairHandle{l: f.l} }
func (f fair) Entries() int       { return f.l.Len() }

type fairHandle struct {
	l *fairlock.Locker[string]
	g fairlock.Guard[string]
	_ pad
}

func (h *fairHandle) Lock(ctx context.Context, key string) (err error) {
	h.g, err = h.l.Lock(ctx, key)
	return err
}
func (h *fairHandle) RLock(ctx context.Context, key string) (err error) {
	h.g, err = h.l.RLock(ctx, key)
	return err
}
func (h *fairHandle) Unlock() {
	h.g.Unlock()
	h.g = fairlock.Guard[string]{} // a spent Guard must not keep its entry alive
}

// fairlock's Semaphore.

type fairSem struct{ s *fairlock.Semaphore[string] }

func newFairSemaphore(n int64) SemKeyed { return fairSem{fairlock.NewSemaphore[string](n)} }

func (f fairSem) SemHandle() SemHandle { return &fairSemHandle{s: f.s} }
func (f fairSem) Entries() int         { return f.s.Len() }

type fairSemHandle struct {
	s *fairlock.Semaphore[string]
	g fairlock.Guard[string]
	_ pad
}

func (h *fairSemHandle) Acquire(ctx context.Context, key string, w int64) (err error) {
	h.g, err = h.s.Acquire(ctx, key, w)
	return err
}
func (h *fairSemHandle) Unlock() {
	h.g.Unlock()
	h.g = fairlock.Guard[string]{}
}

// github.com/moby/locker: a map of refcounted sync.Mutex behind a global
// mutex; barging, no context.

type moby struct{ l *locker.Locker }

func newMoby() Keyed { return moby{locker.New()} }

func (m moby) Handle() Handle { return &mobyHandle{l: m.l} }
func (m moby) Entries() int   { return mapLen(m.l, "locks") }

type mobyHandle struct {
	l   *locker.Locker
	key string
	_   pad
}

func (h *mobyHandle) Lock(_ context.Context, key string) error {
	h.l.Lock(key)
	h.key = key
	return nil
}
func (h *mobyHandle) Unlock() { _ = h.l.Unlock(h.key) }

// github.com/containerd/containerd/pkg/kmutex: a map of refcounted
// x/sync semaphores (FIFO, context-aware).

type containerd struct{ l kmutex.KeyedLocker }

func newContainerd() Keyed { return containerd{kmutex.New()} }

func (c containerd) Handle() Handle { return &containerdHandle{l: c.l} }
func (c containerd) Entries() int   { return mapLen(c.l, "locks") }

type containerdHandle struct {
	l   kmutex.KeyedLocker
	key string
	_   pad
}

func (h *containerdHandle) Lock(ctx context.Context, key string) error {
	if err := h.l.Lock(ctx, key); err != nil {
		return err
	}
	h.key = key
	return nil
}
func (h *containerdHandle) Unlock() { h.l.Unlock(h.key) }

// k8s.io/utils/keymutex hashed: a fixed array of sync.Mutex indexed by the
// key's hash; no per-key state, unrelated keys can collide.

type k8s struct{ km keymutex.KeyMutex }

func newK8s() Keyed { return k8s{keymutex.NewHashed(0)} }

func (k k8s) Handle() Handle { return &k8sHandle{km: k.km} }
func (k k8s) Entries() int   { return -1 }

type k8sHandle struct {
	km  keymutex.KeyMutex
	key string
	_   pad
}

func (h *k8sHandle) Lock(_ context.Context, key string) error {
	h.km.LockKey(key)
	h.key = key
	return nil
}
func (h *k8sHandle) Unlock() { _ = h.km.UnlockKey(h.key) }

// The textbook design ("sync.Mutex map"): a map of refcounted sync.Mutex
// behind a global mutex, the entry deleted when the last user leaves.

type textbook struct {
	mu sync.Mutex
	m  map[string]*refMutex
}

type refMutex struct {
	sync.Mutex
	refs int
}

func newTextbook() Keyed { return &textbook{m: make(map[string]*refMutex)} }

func (t *textbook) Handle() Handle { return &textbookHandle{t: t} }
func (t *textbook) Entries() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

type textbookHandle struct {
	t   *textbook
	key string
	m   *refMutex
	_   pad
}

func (h *textbookHandle) Lock(_ context.Context, key string) error {
	t := h.t
	t.mu.Lock()
	m := t.m[key]
	if m == nil {
		m = new(refMutex)
		t.m[key] = m
	}
	m.refs++
	t.mu.Unlock()
	m.Lock()
	h.key, h.m = key, m
	return nil
}

func (h *textbookHandle) Unlock() {
	t := h.t
	h.m.Unlock()
	t.mu.Lock()
	if h.m.refs--; h.m.refs == 0 {
		delete(t.m, h.key)
	}
	t.mu.Unlock()
	h.m = nil // a kept handle must not keep the lock's memory (Churn)
}

// The textbook design with shared holds ("sync.RWMutex map"): a map of
// refcounted sync.RWMutex behind a global mutex, the entry deleted when
// the last user leaves. sync.RWMutex prefers writers: once a writer waits
// in Lock, new RLocks block until it has had its turn.

type rwMap struct {
	mu sync.Mutex
	m  map[string]*refRWMutex
}

type refRWMutex struct {
	sync.RWMutex
	refs int
}

func newRWMap() RWKeyed { return &rwMap{m: make(map[string]*refRWMutex)} }

func (t *rwMap) RWHandle() RWHandle { return &rwMapHandle{t: t} }
func (t *rwMap) Entries() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// ref takes a reference to key's entry, making it if there is none.
func (t *rwMap) ref(key string) *refRWMutex {
	t.mu.Lock()
	m := t.m[key]
	if m == nil {
		m = new(refRWMutex)
		t.m[key] = m
	}
	m.refs++
	t.mu.Unlock()
	return m
}

type rwMapHandle struct {
	t      *rwMap
	key    string
	m      *refRWMutex
	shared bool
	_      pad
}

func (h *rwMapHandle) Lock(_ context.Context, key string) error {
	m := h.t.ref(key)
	m.Lock()
	h.key, h.m, h.shared = key, m, false
	return nil
}

func (h *rwMapHandle) RLock(_ context.Context, key string) error {
	m := h.t.ref(key)
	m.RLock()
	h.key, h.m, h.shared = key, m, true
	return nil
}

func (h *rwMapHandle) Unlock() {
	t := h.t
	if h.shared {
		h.m.RUnlock()
	} else {
		h.m.Unlock()
	}
	t.mu.Lock()
	if h.m.refs--; h.m.refs == 0 {
		delete(t.m, h.key)
	}
	t.mu.Unlock()
	h.m = nil
}

// The textbook keyed semaphore ("x/sync semaphore map"): a map of
// refcounted golang.org/x/sync/semaphore.Weighted behind a global mutex,
// the entry deleted when the last user leaves. Weighted is head-of-line
// FIFO, as fairlock's Semaphore is.

type semMap struct {
	n  int64
	mu sync.Mutex
	m  map[string]*refWeighted
}

type refWeighted struct {
	*semaphore.Weighted
	refs int
}

func newSemMap(n int64) SemKeyed { return &semMap{n: n, m: make(map[string]*refWeighted)} }

func (t *semMap) SemHandle() SemHandle { return &semMapHandle{t: t} }
func (t *semMap) Entries() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// unref drops a reference to key's entry s, deleting it with the last.
func (t *semMap) unref(key string, s *refWeighted) {
	t.mu.Lock()
	if s.refs--; s.refs == 0 {
		delete(t.m, key)
	}
	t.mu.Unlock()
}

type semMapHandle struct {
	t   *semMap
	key string
	s   *refWeighted
	w   int64
	_   pad
}

func (h *semMapHandle) Acquire(ctx context.Context, key string, w int64) error {
	t := h.t
	t.mu.Lock()
	s := t.m[key]
	if s == nil {
		s = &refWeighted{Weighted: semaphore.NewWeighted(t.n)}
		t.m[key] = s
	}
	s.refs++
	t.mu.Unlock()
	if err := s.Acquire(ctx, w); err != nil {
		t.unref(key, s)
		return err
	}
	h.key, h.s, h.w = key, s, w
	return nil
}

func (h *semMapHandle) Unlock() {
	h.s.Release(h.w)
	h.t.unref(h.key, h.s)
	h.s = nil
}

// A bare sync.Mutex: the floor for one key.

type bare struct{ mu *sync.Mutex }

func newBare() Keyed { return bare{new(sync.Mutex)} }

func (b bare) Handle() Handle { return b }
func (b bare) Entries() int   { return -1 }
func (b bare) Lock(context.Context, string) error {
	b.mu.Lock()
	return nil
}
func (b bare) Unlock() { b.mu.Unlock() }

// mapLen reads the length of the unexported map field of a peer's lock, to
// count its entries. The peers' lock mutex is not held: call it only when
// the lock is idle.
func mapLen(x any, field string) int {
	v := reflect.ValueOf(x)
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		v = v.Elem()
	}
	return v.FieldByName(field).Len()
}
