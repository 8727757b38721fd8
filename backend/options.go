package backend

import (
	"log/slog"
	"time"

	"github.com/fairlock/fairlock/fairlock"
)

// The options every distributed backend takes, and their defaults. A
// backend declares `type Option = backend.Option` and wraps each of these
// in a function of its own whose doc says what the setting means on its
// engine (etcd rounds a lease's TTL to whole seconds, for instance); its
// own options append their values to Settings.Engine.

// DefaultTTL is the session TTL of a Locker built without WithTTL: how
// long the grants and queue places of a process that stopped renewing
// (crashed, paused, partitioned from its engine) keep blocking others, and
// the margin a live process has before a stall costs it its grants. Ten
// seconds sits between Consul's lock (15 s session TTL) and redsync (8 s
// expiry); etcd's concurrency.Session defaults to 60 s.
const DefaultTTL = 10 * time.Second

// Settings is every setting of a Locker or Semaphore: what the Options
// passed to a backend's New wrote. Defaults are set in one place,
// NewSettings.
type Settings struct {
	TTL      time.Duration     // the session TTL: DefaultTTL unless WithTTL set it
	Name     string            // from WithName; "" until New picks the default
	Observer fairlock.Observer // from WithObserver; nil for none
	Debug    bool              // WithDebug
	Logger   *slog.Logger      // from WithLogger; nil means slog.Default()
	// Engine holds the values of a backend's own options (redislock's
	// WithReplicas, say), in the order given; the backend reads them
	// with a type switch.
	Engine []any
}

// An Option configures a Locker or Semaphore in a backend's New or
// NewSemaphore. A nil Option is ignored.
type Option func(*Settings)

// NewSettings returns the defaults with opts applied in order.
func NewSettings(opts []Option) Settings {
	s := Settings{TTL: DefaultTTL}
	for _, o := range opts {
		if o != nil {
			o(&s)
		}
	}
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	return s
}

// WithTTL sets the session TTL; d <= 0 means DefaultTTL. A backend rounds
// it to its engine's unit.
func WithTTL(d time.Duration) Option {
	return func(s *Settings) {
		if d <= 0 {
			d = DefaultTTL
		}
		s.TTL = d
	}
}

// WithName names the Locker in debug output (package debug) and in the
// observer's fairlock.locker attribute. The name is local to the process:
// no engine sees it.
func WithName(name string) Option { return func(s *Settings) { s.Name = name } }

// WithObserver sets the hook that receives the Locker's metrics (package
// otelmetrics implements it): every call that asks for a key reports its
// result and how long it waited, every Unlock of a held grant how long it
// was held, and the stats callback counts this process's held keys and
// queued calls. Wait is not reported: it acquires nothing. A nil Observer
// means none.
func WithObserver(o fairlock.Observer) Option { return func(s *Settings) { s.Observer = o } }

// WithDebug registers the Locker in the process-wide debug registry
// (debug/registry) while it is open.
func WithDebug() Option { return func(s *Settings) { s.Debug = true } }

// WithLogger sets where the Locker reports what it cannot return to a
// caller. A nil logger means slog.Default().
func WithLogger(l *slog.Logger) Option { return func(s *Settings) { s.Logger = l } }

// EngineOption returns an Option that appends v to Settings.Engine: how a
// backend makes an option of its own.
func EngineOption(v any) Option {
	return func(s *Settings) { s.Engine = append(s.Engine, v) }
}
