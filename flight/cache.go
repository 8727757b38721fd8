package flight

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"time"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/keylock"
	"github.com/fairlock/fairlock/owner"
)

// ErrFenced is what a Store's Set returns when it refused a write because
// a grant with a larger token has written the key (Kleppmann's fencing):
// the writing grant was lost and the key taken over. Cache treats it as
// the expected end of a lost fill, not as a failure of the store.
var ErrFenced = errors.New("flight: store write refused: a later grant has written the key")

// storeTimeout bounds a store write that Cache makes on a context
// detached from its callers': a fill whose callers all left just as it
// returned still stores its value, for the next callers, but an
// unreachable store cannot hold the run forever.
const storeTimeout = 5 * time.Second

// defaultErrorTTL is how long a failed fill's error record lasts unless
// WithErrorTTL says otherwise.
const defaultErrorTTL = time.Second

// Entry is what a Store keeps for a key: a value and when it expires, or
// the record of a failed fill. A Store keeps its fields as they are (an
// adapter may encode it with encoding/json: every field is exported).
type Entry[V any] struct {
	// Value is the value a fill returned; the zero V in an error record.
	Value V
	// Err, when not empty, makes the entry an error record: the message
	// of the fill's error. Until Expires, Get returns a *FillError with
	// it instead of filling again.
	Err string
	// Expires is when the entry stops being served: the fill's end plus
	// the Cache's TTL (WithErrorTTL's, for an error record), on the
	// clock of the process that filled it. Every process compares it
	// with its own clock, so their wall clocks must agree to well within
	// the TTL.
	Expires time.Time
	// Delta is how long the fill ran: XFetch's δ, the recompute time that
	// scales early refresh (WithEarlyRefresh).
	Delta time.Duration
}

// Store is where a Cache keeps its values: a cache, a database, anything
// several processes share. Its methods are called concurrently; Cache
// calls Get outside any lock and Set only under the key's grant.
type Store[V any] interface {
	// Get returns key's entry and true, or false if the store holds none
	// (a missing key is not an error). Cache decides freshness from the
	// entry's Expires, so Get may return entries that have expired.
	Get(ctx context.Context, key string) (Entry[V], bool, error)
	// Set writes e as key's entry, to be kept for at least ttl (after it,
	// the store may drop the entry or keep it: Cache no longer serves it
	// either way). l is the grant under which the value was made: a store
	// that can should fence the write, keeping the largest l.Token() it
	// accepted for key and refusing a smaller one with an error wrapping
	// ErrFenced, in one atomic step (a Lua script on Redis, a
	// transaction on etcd guarded by etcdlock's IsOwner, UPDATE … WHERE
	// token <= $1 in SQL). A store that cannot fence writes anyway: then
	// a fill whose grant was lost (a paused process) can overwrite a
	// newer value with its older one.
	Set(ctx context.Context, key string, e Entry[V], ttl time.Duration, l keylock.Lease) error
}

// FillError is the error Cache.Get returns when it found the record of a
// failed fill in the store: a fill of key failed, in this process or
// another, and until the record expires no call fills again. The callers
// of the failed fill's own run get its error itself instead.
type FillError struct {
	Key   string    // the key whose fill failed
	Msg   string    // the fill's error message
	Until time.Time // when the record expires, on the filler's clock
}

// Error returns `flight: the fill of "KEY" failed: MSG (recorded until
// TIME)`.
func (e *FillError) Error() string {
	return fmt.Sprintf("flight: the fill of %q failed: %s (recorded until %s)", e.Key, e.Msg, e.Until.Format(time.RFC3339Nano))
}

// Option configures a Cache.
type Option func(*options)

type options struct {
	errorTTL time.Duration
	beta     float64
	logger   *slog.Logger
}

// WithErrorTTL sets how long the record of a failed fill stays in the
// store (default 1 s). Calls of the key that find it, in every process,
// return a *FillError until then instead of filling: the processes that
// waited on a failed fill do not each retry at once, and a failing
// backend sees one fill per d, not one per caller. d <= 0 writes no
// record: the waiters then queue for the key and fill one after another.
// A fill that ended because its grant was lost or every caller left
// writes no record either way: it did not fail, it stopped.
func WithErrorTTL(d time.Duration) Option { return func(o *options) { o.errorTTL = d } }

// WithEarlyRefresh turns on probabilistic early expiration (XFetch:
// Vattani, Chierichetti and Lowenstein, "Optimal Probabilistic Cache
// Stampede Prevention", PVLDB 8(8), 2015) with parameter beta: a call that
// finds a fresh value refills it anyway when
//
//	now − δ·beta·ln(rand()) ≥ expiry
//
// where δ is how long the value's fill ran (Entry.Delta) and rand() is
// uniform in (0, 1]. The chance grows as the expiry nears and with δ, so
// a value that takes long to compute is refreshed earlier, and with
// traffic, so on a hot key one call refreshes shortly before the expiry
// and no call ever finds the value missing. beta = 1 is the paper's
// optimum; above 1 refreshes earlier, below later; beta <= 0 (the
// default) turns it off.
//
// The call that draws an early refresh refills under the key's grant
// taken with TryLock, and waits for it; every other call, in this
// process or another, keeps getting the old value meanwhile, and one that
// also draws a refresh while the key is taken gets the old value at once.
// A refresh whose fill fails keeps the old value (it is still fresh) and
// writes no error record; the failure is logged.
func WithEarlyRefresh(beta float64) Option { return func(o *options) { o.beta = beta } }

// WithLogger sets where a Cache reports what it cannot return to a
// caller: a store write that failed after a successful fill, a failed
// early refresh, an Unlock that failed (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}

// Cache is one fill per key across processes: a read-through cache over
// a Store, whose fills are collapsed in this process (a Group) and across
// processes (a keylock.Locker's grant of the key). Every process that
// shares the store must use a Cache over the same lock (Lockers of one
// backend under one prefix) and the same keys. Its methods are safe for
// concurrent use; it starts no goroutine beyond its Groups' runs and
// needs no Close.
type Cache[V any] struct {
	locker keylock.Locker
	store  Store[V]
	ttl    time.Duration
	opts   options

	now  func() time.Time // the clock; tests set it
	rand func() float64   // uniform in (0, 1]; tests set it

	loads     Group[string, Entry[V]] // a key's read, and the wait or fill behind it
	refreshes Group[string, Entry[V]] // a key's early refresh
}

// NewCache returns a Cache that reads key's value from store and, when
// it is missing or expired, fills it under locker's grant of key with
// the fill function Get is given, storing it for ttl. The store's keys
// and the lock's keys are the same strings: give the Locker a prefix of
// its own. NewCache panics if locker or store is nil or ttl <= 0.
func NewCache[V any](locker keylock.Locker, store Store[V], ttl time.Duration, opts ...Option) *Cache[V] {
	if locker == nil || store == nil {
		panic("flight: NewCache with a nil Locker or Store")
	}
	if ttl <= 0 {
		panic(fmt.Sprintf("flight: NewCache with ttl %v: want a positive duration", ttl))
	}
	o := options{errorTTL: defaultErrorTTL, logger: slog.Default()}
	for _, opt := range opts {
		opt(&o)
	}
	return &Cache[V]{
		locker: locker, store: store, ttl: ttl, opts: o,
		now:  time.Now,
		rand: func() float64 { return 1 - rand.Float64() },
	}
}

// Get returns key's value: from the store if it is there and has not
// expired; otherwise from a fill, of which there is one at a time per
// key across the processes.
//
// The calls of one process for one key share one load (a Group: each
// caller keeps its own ctx, as Group.Do says), and the fill of the call
// that started it: give every call of a key the same fill. The load reads
// the store; if the value is missing or expired, it tries the key's lock
// (TryLock). Granted, it reads the store again (another process may have
// filled in between) and otherwise calls fill with the grant's Lease and
// a context that ends when every caller has left or the grant is lost
// (keylock.Do: its cause then wraps fairlock.ErrLost), and stores what
// fill returns, with the Lease for fencing, for the Cache's TTL. Refused
// because another process holds or awaits the key, it Waits for the
// key's release and reads the store. If that finds nothing fresh (the
// filler died, its callers all left, it could not store), it queues for
// the key with Lock, and the first in line fills; the others, granted in
// turn, find its value and release.
//
// Get returns fill's value, or fill's error to the callers of the load
// that ran it; a caller whose ctx ends returns at once with the
// context's error. While the record of a failed fill is in the store
// (WithErrorTTL), every call returns a *FillError without filling. The
// lock's errors are returned as they are (they name the key); the
// store's read errors are wrapped with the key. A panic in fill reaches
// each caller of the load as a *PanicError, after the key is released. A
// value that could not be stored is still returned to its callers, and
// the failure logged.
//
// fill is called with the Lease: a write it makes elsewhere can be fenced
// with Lease.Token. The value V is shared by the callers of a load. Each
// load uses the lock under a flow of its own (owner.NewContext): a caller
// that holds key through the same Locker would wait for itself until its
// ctx ends, so do not call Get of a key you hold.
func (c *Cache[V]) Get(ctx context.Context, key string, fill func(context.Context, keylock.Lease) (V, error)) (V, error) {
	var zero V
	e, _, err := c.loads.Do(ctx, key, func(ctx context.Context) (Entry[V], error) {
		return c.load(ctx, key, fill)
	})
	if err != nil {
		return zero, err
	}
	if e.Err != "" {
		return zero, &FillError{Key: key, Msg: e.Err, Until: e.Expires}
	}
	if c.early(e) {
		// The refresh returns the old entry unless it stored a new one;
		// its errors are a caller's context or a panic in fill. It
		// reads its own copy: this call may return while it runs.
		old := e
		if e, _, err = c.refreshes.Do(ctx, key, func(ctx context.Context) (Entry[V], error) {
			return c.refresh(ctx, key, old, fill), nil
		}); err != nil {
			return zero, err
		}
	}
	return e.Value, nil
}

// Forget makes the next Get of key in this process start a load (and an
// early refresh) of its own, as Group.Forget does; the calls already
// waiting keep waiting for theirs. The store is not touched.
func (c *Cache[V]) Forget(key string) {
	c.loads.Forget(key)
	c.refreshes.Forget(key)
}

// fresh reports whether e may still be served.
func (c *Cache[V]) fresh(e Entry[V]) bool { return c.now().Before(e.Expires) }

// early reports whether a call that found e fresh refreshes it (XFetch).
func (c *Cache[V]) early(e Entry[V]) bool {
	if c.opts.beta <= 0 || e.Err != "" || e.Delta <= 0 {
		return false
	}
	gap := -float64(e.Delta) * c.opts.beta * math.Log(c.rand())
	return !c.now().Add(time.Duration(gap)).Before(e.Expires)
}

// load is a load's run: read, and behind a missing or expired value the
// wait or the fill. It returns an entry that is fresh (a value or an
// error record), or an error.
func (c *Cache[V]) load(ctx context.Context, key string, fill func(context.Context, keylock.Lease) (V, error)) (Entry[V], error) {
	ctx = owner.NewContext(ctx)
	if e, ok, err := c.get(ctx, key); err != nil || ok {
		return e, err
	}
	f := &filling[V]{c: c, key: key, fill: fill, record: c.opts.errorTTL > 0}
	err := keylock.Do(ctx, c.locker.TryLock, key, f.underGrant)
	if errors.Is(err, fairlock.ErrWouldBlock) {
		// Another process holds the key (filling) or awaits it: wait
		// for the release and read what it left.
		if err := c.locker.Wait(ctx, key); err != nil {
			return Entry[V]{}, err
		}
		if e, ok, err := c.get(ctx, key); err != nil || ok {
			return e, err
		}
		// Nothing fresh: the filler died (its grant expired), was
		// abandoned, or could not store. Queue; the first in line fills.
		err = keylock.Do(ctx, c.locker.Lock, key, f.underGrant)
	}
	return f.result(err)
}

// refresh is an early refresh's run: under a grant taken with TryLock, a
// fill unless another process has stored a newer entry. It returns the
// new entry, or old if the key was taken, the refresh failed or was
// abandoned (old is still fresh). A panic in fill goes on to the Group.
func (c *Cache[V]) refresh(ctx context.Context, key string, old Entry[V], fill func(context.Context, keylock.Lease) (V, error)) Entry[V] {
	ctx = owner.NewContext(ctx)
	f := &filling[V]{c: c, key: key, fill: fill, newer: old.Expires}
	err := keylock.Do(ctx, c.locker.TryLock, key, f.underGrant)
	e, err := f.result(err)
	switch {
	case err == nil:
		return e
	case errors.Is(err, fairlock.ErrWouldBlock) || ctx.Err() != nil:
		// Taken (another refresh, a fill or a Wait) or abandoned.
	default:
		c.opts.logger.Warn("flight: early refresh failed; the old value is kept", "key", key, "err", err)
	}
	return old
}

// get reads key's entry and reports whether it is fresh; the store's
// error is wrapped with the key.
func (c *Cache[V]) get(ctx context.Context, key string) (Entry[V], bool, error) {
	e, ok, err := c.store.Get(ctx, key)
	if err != nil {
		return Entry[V]{}, false, fmt.Errorf("flight: reading %q from the store: %w", key, err)
	}
	return e, ok && c.fresh(e), nil
}

// filling is one attempt to fill a key under a grant (load or refresh).
type filling[V any] struct {
	c      *Cache[V]
	key    string
	fill   func(context.Context, keylock.Lease) (V, error)
	record bool      // store an error record if fill fails
	newer  time.Time // refresh: an entry expiring after this is newer than the one refreshed

	entry Entry[V] // the fresh entry found or made under the grant
	ok    bool     // entry is set: the grant's work succeeded
}

// underGrant is keylock.Do's fn: read again under the grant, and fill if
// nothing fresh (for a refresh, nothing newer) is there.
func (f *filling[V]) underGrant(ctx context.Context, l keylock.Lease) error {
	e, fresh, err := f.c.get(ctx, f.key)
	if err != nil {
		return err
	}
	if fresh && (f.newer.IsZero() || (e.Err == "" && e.Expires.After(f.newer))) {
		f.entry, f.ok = e, true // filled by another grant since we looked
		return nil
	}
	c := f.c
	start := c.now()
	v, err := f.fill(ctx, l)
	now := c.now()
	// Delta on the monotonic clock; Expires on the wall clock alone, as
	// every store that encodes it keeps it.
	delta, end := now.Sub(start), now.Round(0)
	if err != nil {
		// A fill cut off by its context (every caller left, the grant
		// lost) stopped rather than failed: no record.
		if f.record && ctx.Err() == nil {
			c.set(ctx, f.key, Entry[V]{Err: err.Error(), Expires: end.Add(c.opts.errorTTL)}, c.opts.errorTTL, l)
		}
		return err
	}
	f.entry = Entry[V]{Value: v, Expires: end.Add(c.ttl), Delta: delta}
	f.ok = true
	c.set(ctx, f.key, f.entry, c.ttl, l)
	return nil
}

// result turns keylock.Do's error into the attempt's: the entry if the
// work under the grant succeeded (an Unlock that failed after it is
// logged, not returned: the value is good), else the error.
func (f *filling[V]) result(err error) (Entry[V], error) {
	if f.ok {
		if err != nil {
			f.c.opts.logger.Warn("flight: the fill succeeded but releasing its key failed", "key", f.key, "err", err)
		}
		return f.entry, nil
	}
	return Entry[V]{}, err
}

// set stores e under grant l, unless l has been lost (a fenced store
// would refuse it; one that cannot fence must not get it), on a context
// detached from the callers' and bounded. A failure is logged: the
// value still goes to this load's callers.
func (c *Cache[V]) set(ctx context.Context, key string, e Entry[V], ttl time.Duration, l keylock.Lease) {
	select {
	case <-l.Lost():
		c.opts.logger.Warn("flight: not storing a fill whose grant was lost", "key", key, "token", l.Token())
		return
	default:
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), storeTimeout)
	defer cancel()
	if err := c.store.Set(sctx, key, e, ttl, l); err != nil {
		level := slog.LevelWarn
		if errors.Is(err, ErrFenced) {
			level = slog.LevelInfo // a lost grant, taken over: expected
		}
		c.opts.logger.Log(sctx, level, "flight: storing a fill failed", "key", key, "token", l.Token(), "err", err)
	}
}
