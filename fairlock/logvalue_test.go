package fairlock_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"testing"

	"github.com/fairlock/fairlock/fairlock"
	"github.com/fairlock/fairlock/owner"
)

// jsonRecords decodes the records a slog.JSONHandler wrote to b.
func jsonRecords(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("record %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// TestLockErrorLogsAsFields: a *LockError logged through slog's JSON
// handler carries op, key, owner, label and cause as fields, the key
// without the quotes of the text forms.
func TestLockErrorLogsAsFields(t *testing.T) {
	l := fairlock.New[string]()
	defer l.Close(context.Background())
	ctx := owner.NewLabeledContext(context.Background(), "req-42")
	g, err := l.Lock(ctx, "user-13")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Unlock()
	_, err = l.Lock(ctx, "user-13")
	var lerr *fairlock.LockError
	if !errors.As(err, &lerr) {
		t.Fatalf("Lock by the holder: %v; want a *LockError", err)
	}
	var b bytes.Buffer
	slog.New(slog.NewJSONHandler(&b, nil)).Error("lock failed", "err", err)
	got, ok := jsonRecords(t, &b)[0]["err"].(map[string]any)
	if !ok {
		t.Fatalf("err logged as %s; want an object", b.String())
	}
	want := map[string]any{
		"op":    "Lock",
		"key":   "user-13",
		"owner": owner.Of(ctx).Name(),
		"label": "req-42",
		"cause": "reentrant lock: the owner already holds the key",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("err.%s = %v; want %v (record %s)", k, got[k], v, b.String())
		}
	}
	if len(got) != len(want) {
		t.Errorf("err has fields %v; want exactly %v", got, want)
	}
}

// TestLockErrorLogValueKeys: keys render in a log as in debug output,
// a string key unquoted, other keys as they are, control characters
// escaped; LockMany with no keys has no key field.
func TestLockErrorLogValueKeys(t *testing.T) {
	for _, c := range []struct {
		err  *fairlock.LockError
		want any // the key field; nil: none
	}{
		{&fairlock.LockError{Op: "Lock", Key: "a\nb", Err: fairlock.ErrClosed}, `a\nb`},
		{&fairlock.LockError{Op: "Lock", Key: 42, Err: fairlock.ErrClosed}, "42"},
		{&fairlock.LockError{Op: "Lock", Key: [2]int{1, 2}, Err: fairlock.ErrClosed}, "[1 2]"},
		{&fairlock.LockError{Op: "LockMany", Err: fairlock.ErrClosed}, nil},
	} {
		var b bytes.Buffer
		slog.New(slog.NewJSONHandler(&b, nil)).Info("m", "err", c.err)
		got := jsonRecords(t, &b)[0]["err"].(map[string]any)
		if got["key"] != c.want || got["op"] != c.err.Op || got["cause"] != "locker closed" {
			t.Errorf("%#v logged as %v; want key %v", c.err, got, c.want)
		}
		if _, ok := got["owner"]; ok {
			t.Errorf("owner 0 logged: %v", got)
		}
	}
}

// TestWarningKeyNotQuotedTwice: the deadlock warning, through slog's JSON
// handler, carries the key as "key":"b", not "key":"\"b\"".
func TestWarningKeyNotQuotedTwice(t *testing.T) {
	var b bytes.Buffer
	l := fairlock.New[string](fairlock.WithDeadlockDetection(), fairlock.WithLogger(slog.New(slog.NewJSONHandler(&b, nil))))
	defer l.Close(context.Background())
	x, y := owner.NewContext(context.Background()), owner.NewLabeledContext(context.Background(), "req-7")
	ga, _ := l.Lock(x, "a")
	gb, _ := l.Lock(y, "b")
	done := make(chan error, 1)
	go func() {
		g, err := l.Lock(x, "b")
		if err == nil {
			g.Unlock()
		}
		done <- err
	}()
	for l.Waiters("b") != 1 {
		runtime.Gosched()
	}
	if _, err := l.Lock(y, "a"); !errors.Is(err, fairlock.ErrDeadlock) {
		t.Fatalf("closing a cycle: %v", err)
	}
	gb.Unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ga.Unlock()
	r := jsonRecords(t, &b)[0]
	if r["key"] != "a" || r["owner"] != owner.Of(y).Name() || r["owner_label"] != "req-7" {
		t.Fatalf("deadlock warning %s: want key a, owner %s, owner_label req-7", b.String(), owner.Of(y).Name())
	}
	if strings.Contains(b.String(), `"key":"\"a\""`) {
		t.Fatalf("key quoted twice in %s", b.String())
	}
}
