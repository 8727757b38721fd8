package fairlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fairlock/fairlock/fairlock"
)

// TestLongKeyCutInErrors: an error about a key far too long to read
// (etcdlock refuses a 2 MiB key) shows its first bytes and its size, not
// all of it; a key of ordinary length is shown whole; a cut never splits
// a UTF-8 sequence.
func TestLongKeyCutInErrors(t *testing.T) {
	long := strings.Repeat("k", 2<<20)
	e := &fairlock.LockError{Op: "Lock", Key: long, Err: context.DeadlineExceeded}
	msg := e.Error()
	if len(msg) > 400 {
		t.Errorf("message of %d bytes for a 2 MiB key: %.80q...", len(msg), msg)
	}
	want := `fairlock: Lock "` + strings.Repeat("k", 256) + `"… (2097152 bytes): context deadline exceeded`
	if msg != want {
		t.Errorf("Error() = %.120q..., want %.120q...", msg, want)
	}
	if !errors.Is(e, context.DeadlineExceeded) {
		t.Error("the cut error no longer wraps its cause")
	}

	short := &fairlock.LockError{Op: "Lock", Key: strings.Repeat("k", 256), Err: context.Canceled}
	if got := short.Error(); !strings.Contains(got, `"`+strings.Repeat("k", 256)+`":`) {
		t.Errorf("a key of 256 bytes is cut: %q", got)
	}

	// 255 ASCII bytes and then a 3-byte rune across the 256-byte mark.
	runes := &fairlock.LockError{Op: "Lock", Key: strings.Repeat("k", 255) + strings.Repeat("€", 10), Err: context.Canceled}
	if got := runes.Error(); !strings.Contains(got, `"`+strings.Repeat("k", 255)+`"… (285 bytes)`) {
		t.Errorf("cut inside a rune: %q", got)
	}

	type big struct{ A, B string }
	other := &fairlock.LockError{Op: "Lock", Key: big{long[:300], "b"}, Err: context.Canceled}
	if got := other.Error(); len(got) > 400 || !strings.Contains(got, "bytes rendered)") {
		t.Errorf("a long non-string key: %.120q... (%d bytes)", got, len(got))
	}
}

// TestLongKeyCutInALockersErrors: the error a Locker returns for a long
// key is cut as a LockError built by hand is (the quoted first bytes and
// the key's size), for a named string type too, and its slog form carries
// the cut key without the text form's quotes.
func TestLongKeyCutInALockersErrors(t *testing.T) {
	type userID string
	long := strings.Repeat("k", 2<<20)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	want := `"` + strings.Repeat("k", 256) + `"… (2097152 bytes)`

	l := fairlock.New[string]()
	defer l.Close(context.Background())
	_, err := l.Lock(ctx, long)
	named := fairlock.New[userID]()
	defer named.Close(context.Background())
	_, errNamed := named.Lock(ctx, userID(long))
	for _, err := range []error{err, errNamed} {
		if msg := err.Error(); !strings.Contains(msg, " "+want+" (") {
			t.Errorf("Error() = %.40q...%q, want the key as %.40q...%q", msg, msg[max(0, len(msg)-60):], want, want[len(want)-30:])
		}
		var le *fairlock.LockError
		if !errors.As(err, &le) {
			t.Fatalf("%T is not a *LockError", err)
		}
		key := le.LogValue().Group()[1]
		if got, wantJSON := key.Value.String(), want[1:256+1]+want[256+2:]; key.Key != "key" || got != wantJSON {
			t.Errorf("LogValue key = %.40q...%q, want %.40q...%q", got, got[max(0, len(got)-30):], wantJSON, wantJSON[len(wantJSON)-30:])
		}
	}
}
