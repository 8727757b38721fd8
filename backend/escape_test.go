package backend_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fairlock/fairlock/backend"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestEscape: Escape keeps every special byte and '%' out of a key's
// part of a name, so that no two keys share a name ("a/b" is not "a"
// then "b"), and Unescape gives the key back.
func TestEscape(t *testing.T) {
	for _, c := range []struct{ in, special, want string }{
		{"plain", "/", "plain"},
		{"a/b", "/", "a%2Fb"},
		{"100%", "/", "100%25"},
		{"%2F", "/", "%252F"},
		{"{tag}", "/{}", "%7Btag%7D"},
		{"", "/", ""},
		{"héllo/wörld", "/", "héllo%2Fwörld"},
	} {
		got := backend.Escape(c.in, c.special)
		if got != c.want {
			t.Errorf("Escape(%q, %q) = %q, want %q", c.in, c.special, got, c.want)
		}
		if strings.ContainsAny(got, c.special) {
			t.Errorf("Escape(%q, %q) = %q still holds a special byte", c.in, c.special, got)
		}
		back, ok := backend.Unescape(got, c.special)
		if !ok || back != c.in {
			t.Errorf("Unescape(%q) = %q, %v; want %q", got, back, ok, c.in)
		}
	}
	// Names Escape could not have made are refused.
	for _, bad := range []string{"%", "%2", "%zz", "%2f", "%41"} {
		if got, ok := backend.Unescape(bad, "/"); ok {
			t.Errorf("Unescape(%q) = %q, true; want false", bad, got)
		}
	}
}

// FuzzEscape: Escape and Unescape are inverses, and distinct keys never
// share an escaped form.
func FuzzEscape(f *testing.F) {
	f.Add("a/b", "c")
	f.Add("%2F", "/")
	f.Fuzz(func(t *testing.T, a, b string) {
		ea, eb := backend.Escape(a, "/{}"), backend.Escape(b, "/{}")
		if (ea == eb) != (a == b) {
			t.Fatalf("Escape(%q) = %q, Escape(%q) = %q", a, ea, b, eb)
		}
		if back, ok := backend.Unescape(ea, "/{}"); !ok || back != a {
			t.Fatalf("Unescape(Escape(%q)) = %q, %v", a, back, ok)
		}
	})
}

// TestLogKey: a long key is cut at 256 bytes, on a rune boundary, with
// its size; a short one is whole.
func TestLogKey(t *testing.T) {
	if got := backend.LogKey("short"); got != "short" {
		t.Errorf("LogKey(short) = %q", got)
	}
	long := strings.Repeat("é", 300) // 600 bytes
	got := backend.LogKey(long)
	if !strings.HasSuffix(got, "… (600 bytes)") || len(got) > 256+len("… (600 bytes)") {
		t.Errorf("LogKey of a 600-byte key = %q", got)
	}
	if strings.ContainsRune(strings.TrimSuffix(got, "… (600 bytes)"), '\uFFFD') {
		t.Errorf("LogKey cut a rune: %q", got)
	}
}

// TestReachable: an endpoint that accepts is reachable; endpoints that
// refuse connections are not, with the dial's error; a unix socket is
// taken as reachable (it cannot be dialled over TCP).
func TestReachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := refused.Addr().String()
	refused.Close()
	ctx := context.Background()
	if err := backend.Reachable(ctx, []string{closedAddr, "http://" + ln.Addr().String()}, time.Second); err != nil {
		t.Errorf("one endpoint accepts: %v, want nil", err)
	}
	if err := backend.Reachable(ctx, []string{closedAddr}, time.Second); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("an endpoint that refuses: %v, want connection refused", err)
	}
	if err := backend.Reachable(ctx, []string{"unix:///tmp/nothing.sock"}, time.Second); err != nil {
		t.Errorf("a unix socket: %v, want nil (not dialled)", err)
	}
}
