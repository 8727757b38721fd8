package ctxerr_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fairlock/fairlock/ctxerr"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestOf(t *testing.T) {
	sentinel := errors.New("sentinel")
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(sentinel)
	err := ctxerr.Of(ctx)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, sentinel) {
		t.Errorf("Of a ctx canceled with a cause: %v, want both context.Canceled and the cause", err)
	}
	if got := ctxerr.How(err); got != context.Canceled {
		t.Errorf("How = %v, want context.Canceled", got)
	}
	if err.Error() != "context canceled: sentinel" {
		t.Errorf("message %q", err)
	}

	plain, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if err := ctxerr.Of(plain); err != context.Canceled || ctxerr.How(err) != context.Canceled {
		t.Errorf("Of a plainly canceled ctx: %v", err)
	}

	timed, cancel3 := context.WithTimeoutCause(context.Background(), time.Nanosecond, sentinel)
	defer cancel3()
	<-timed.Done()
	err = ctxerr.Of(timed)
	if got := ctxerr.How(err); got != context.DeadlineExceeded || !errors.Is(err, sentinel) {
		t.Errorf("Of a ctx past its deadline with a cause: %v (How %v)", err, got)
	}
	// How looks through wrapping, and leaves other errors alone.
	wrapped := errors.Join(errors.New("outer"), err)
	if got := ctxerr.How(wrapped); got != context.DeadlineExceeded {
		t.Errorf("How of a wrapped error: %v", got)
	}
	if got := ctxerr.How(sentinel); got != sentinel {
		t.Errorf("How of an unrelated error: %v", got)
	}
}
