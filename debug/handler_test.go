package debug_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fairlock/fairlock/debug"
	"github.com/fairlock/fairlock/debug/registry"
	"github.com/fairlock/fairlock/fairlock"
	"github.com/google/go-cmp/cmp"
)

func TestHandler(t *testing.T) {
	s := newScene(t, "http")
	defer s.release()
	mux := http.NewServeMux()
	mux.Handle("/debug/fairlock/", debug.Handler())
	srv := httptest.NewServer(mux)
	defer srv.Close()
	base := srv.URL + "/debug/fairlock/"

	t.Run("text", func(t *testing.T) {
		resp, body := get(t, base)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
		}
		if !strings.Contains(body, `fairlock "http" (Locker): 2 keys, 2 waiters`) {
			t.Fatalf("text body lacks the locker:\n%s", body)
		}
	})
	t.Run("json", func(t *testing.T) {
		resp, body := get(t, base+"?format=json&locker=http")
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
		}
		var got []debug.LockerState
		if err := json.Unmarshal([]byte(body), &got); err != nil {
			t.Fatal(err)
		}
		// JSON carries string keys without the quotes of the text dump.
		want := s.want("http")
		for i := range want.Held {
			want.Held[i].Key = registry.JSONKey(want.Held[i].Key)
		}
		if diff := cmp.Diff([]debug.LockerState{want}, got, ignoreTimes); diff != "" {
			t.Fatalf("JSON (-want +got):\n%s", diff)
		}
		if !strings.Contains(body, `"key": "hot"`) || strings.Contains(body, `\"hot\"`) {
			t.Fatalf("JSON quotes the key twice, or lacks it:\n%s", body)
		}
		if h := got[0].Held[0].Holders[0]; got[0].Held[0].HeldFor <= 0 || h.Since.IsZero() || h.Token == 0 {
			t.Fatalf("times or token lost in JSON: %+v", got[0].Held[0])
		}
		for _, field := range []string{`"held_for_ns"`, `"since"`, `"wait_for_ns"`, `"double_unlocks"`, `"reentrant"`, `"token"`, `"mode"`, `"omitted_keys"`} {
			if !strings.Contains(body, field) {
				t.Errorf("JSON lacks documented field %s", field)
			}
		}
	})
	t.Run("text filtered", func(t *testing.T) {
		other := fairlock.New[int](fairlock.WithName("other"), fairlock.WithDebug())
		defer other.Close(context.Background())
		_, body := get(t, base+"?locker=http")
		if !strings.Contains(body, `fairlock "http"`) || strings.Contains(body, `fairlock "other"`) {
			t.Fatalf("filter did not keep exactly the named locker:\n%s", body)
		}
	})
	for _, bad := range []struct {
		query  string
		status int
	}{
		{"?locker=nope", http.StatusNotFound},
		{"?format=xml", http.StatusBadRequest},
	} {
		resp, body := get(t, base+bad.query)
		if resp.StatusCode != bad.status || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: status %d (want %d), body %q", bad.query, resp.StatusCode, bad.status, body)
		}
	}
	resp, err := http.Post(base, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: status %d, want 405", resp.StatusCode)
	}
}

func TestHandlerHonoursRequestContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/debug/fairlock/", nil)
	rec := httptest.NewRecorder()
	debug.Handler().ServeHTTP(rec, req)
	if rec.Body.Len() != 0 {
		t.Fatalf("wrote %d bytes for a request whose client is gone", rec.Body.Len())
	}
}

// serveTo runs the handler (through mux if not nil) on a request for
// target and returns the recorded answer.
func serveTo(h http.Handler, target string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, target, nil))
	return rec
}

// TestHandlerLimitsKeys: a locker with 5,000 held keys shows the default
// 1,000 (longest held first) and counts the rest, in text and JSON, and
// limit=N changes how many it shows.
func TestHandlerLimitsKeys(t *testing.T) {
	const held, defaultLimit = 5000, 1000
	ctx := context.Background()
	l := fairlock.New[int](fairlock.WithName("many"), fairlock.WithDebug())
	guards := make([]fairlock.Guard[int], held)
	for i := range guards {
		g, err := l.Lock(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		guards[i] = g
	}
	defer func() {
		for _, g := range guards {
			g.Unlock()
		}
		if err := l.Close(ctx); err != nil {
			t.Error(err)
		}
	}()
	h := debug.Handler()
	for _, tc := range []struct {
		query string
		shown int
	}{
		{"", defaultLimit},
		{"&limit=10", 10},
		{"&limit=5000", held},
		{"&limit=9999", held},
	} {
		t.Run("json"+tc.query, func(t *testing.T) {
			rec := serveTo(h, "/?format=json&locker=many"+tc.query)
			if rec.Code != http.StatusOK {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			var got []debug.LockerState
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0].Keys != held || len(got[0].Held) != tc.shown || got[0].Omitted != held-tc.shown {
				t.Fatalf("got %d lockers, first with %d keys, %d shown, %d omitted; want 1, %d, %d, %d",
					len(got), got[0].Keys, len(got[0].Held), got[0].Omitted, held, tc.shown, held-tc.shown)
			}
			if want := fmt.Sprintf(`"omitted_keys": %d`, held-tc.shown); !strings.Contains(rec.Body.String(), want) {
				t.Errorf("JSON lacks %s", want)
			}
		})
		t.Run("text"+tc.query, func(t *testing.T) {
			rec := serveTo(h, "/?locker=many"+tc.query)
			if rec.Code != http.StatusOK {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			text := rec.Body.String()
			if n := strings.Count(text, " exclusive, held "); n != tc.shown {
				t.Errorf("text shows %d keys, want %d", n, tc.shown)
			}
			omitted := fmt.Sprintf("… %d more keys left out", held-tc.shown)
			if got := strings.Contains(text, omitted); got != (tc.shown < held) {
				t.Errorf("text has %q: %v, want %v", omitted, got, tc.shown < held)
			}
			if !strings.Contains(text, fmt.Sprintf(`fairlock "many" (Locker): %d keys`, held)) {
				t.Errorf("text header does not count every live key:\n%.200s", text)
			}
		})
	}
}

// TestHandlerRefusesBadQueries: a query that does not parse, an unknown
// or repeated parameter, a bad format or limit get 400 with a message
// that says what is wrong; nothing is served as text instead.
func TestHandlerRefusesBadQueries(t *testing.T) {
	h := debug.Handler()
	for _, tc := range []struct{ query, says string }{
		{"format=json;x=1", "malformed query"},
		{"%zz", "malformed query"},
		{"format=json&x=%zz", "malformed query"},
		{"bogus=1", `unknown parameter "bogus" (known: format, limit, locker)`},
		{"format=json&Format=json", `unknown parameter "Format"`},
		{"format=json&format=text", `parameter "format" given 2 times`},
		{"format=xml", `unknown format "xml"`},
		{"limit=0", `limit "0" is not a positive integer`},
		{"limit=-3", `limit "-3" is not a positive integer`},
		{"limit=ten", `limit "ten" is not a positive integer`},
	} {
		rec := serveTo(h, "/debug/fairlock/?"+tc.query)
		if rec.Code != http.StatusBadRequest || rec.Header().Get("X-Content-Type-Options") != "nosniff" ||
			!strings.Contains(rec.Body.String(), tc.says) {
			t.Errorf("?%s: status %d, body %q; want 400 saying %q", tc.query, rec.Code, rec.Body, tc.says)
		}
	}
}

// TestHandlerUnknownLocker: locker=NAME for a name nobody registered is a
// 404 that says which lockers appear and lists those open.
func TestHandlerUnknownLocker(t *testing.T) {
	ctx := context.Background()
	a := fairlock.New[int](fairlock.WithName("open-a"), fairlock.WithDebug())
	defer a.Close(ctx)
	b := fairlock.New[int](fairlock.WithName("open-b"), fairlock.WithDebug())
	defer b.Close(ctx)
	plain := fairlock.New[int](fairlock.WithName("plain"))
	defer plain.Close(ctx)
	for _, name := range []string{"nope", "plain"} {
		rec := serveTo(debug.Handler(), "/?locker="+name)
		body := rec.Body.String()
		if rec.Code != http.StatusNotFound {
			t.Errorf("locker=%s: status %d, want 404", name, rec.Code)
		}
		for _, want := range []string{fmt.Sprintf("no open locker named %q", name), "fairlock.WithDebug", `"open-a", "open-b"`} {
			if !strings.Contains(body, want) {
				t.Errorf("locker=%s: 404 body %q lacks %q", name, body, want)
			}
		}
	}
}

// TestHandlerServesOnlyItsOwnPath: a ServeMux pattern that ends in "/"
// matches every path under it; the handler answers 404 below its own.
func TestHandlerServesOnlyItsOwnPath(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("/debug/fairlock/", debug.Handler())
	mux.Handle("GET /ops/{env}/locks/", debug.Handler())
	mux.Handle("/stripped/", http.StripPrefix("/stripped", debug.Handler()))
	mux.Handle("/exact", debug.Handler())
	mux.Handle("/exact-dir/{$}", debug.Handler())
	mux.Handle("/mounted/fairlock/", http.StripPrefix("/mounted/fairlock", debug.Handler()))
	mux.Handle("/part/fairlock/", http.StripPrefix("/part", debug.Handler()))
	mux.Handle("/rest/{rest...}", debug.Handler())
	inner := http.NewServeMux()
	inner.Handle("/locks/", debug.Handler())
	mux.Handle("/admin/", http.StripPrefix("/admin", inner))
	root := http.NewServeMux()
	root.Handle("/", debug.Handler())
	hosted := http.NewServeMux()
	hosted.Handle("example.com/", debug.Handler())
	innerRoot := http.NewServeMux()
	innerRoot.Handle("/", debug.Handler())
	mux.Handle("/nested/", http.StripPrefix("/nested", innerRoot))
	alias := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/locks" { // a rewrite before the mux
			r.URL.Path = "/debug/fairlock/"
		}
		mux.ServeHTTP(w, r)
	})
	direct := debug.Handler()
	for _, tc := range []struct {
		h      http.Handler
		target string
		status int
	}{
		{mux, "/debug/fairlock/", 200},
		{mux, "/debug/fairlock/?format=json", 200},
		{mux, "/debug/fairlock/x", 404},
		{mux, "/debug/fairlock/x/", 404},
		{mux, "/debug/fairlock/goroutine?debug=1", 404},
		{mux, "/ops/prod/locks/", 200},
		{mux, "/ops/prod/locks/x", 404},
		{mux, "/stripped/", 200},
		{mux, "/stripped/x", 404},
		{mux, "/stripped/x/", 404},
		{mux, "/stripped/d/", 404},
		{mux, "/mounted/fairlock/", 200},
		{mux, "/mounted/fairlock/fairlock/", 404},
		{mux, "/mounted/fairlock/lock/", 404},
		{mux, "/part/fairlock/", 200},
		{mux, "/part/fairlock/fairlock/", 404},
		{mux, "/rest/", 200},
		{mux, "/rest/x", 404},
		{mux, "/rest/x/y/", 404},
		{mux, "/admin/locks/", 200},
		{mux, "/admin/locks/x/", 404},
		{root, "/", 200},
		{root, "/anything/", 404},
		{root, "/a/b/", 404},
		{hosted, "http://example.com/", 200},
		{hosted, "http://example.com/x/", 404},
		{mux, "/nested/", 200},
		{mux, "/nested/x/", 404},
		{alias, "/locks", 200},
		{mux, "/exact", 200},
		{mux, "/exact-dir/", 200},
		{direct, "/any/mount/", 200},
		{direct, "/any/mount/x", 404},
	} {
		rec := serveTo(tc.h, tc.target)
		if rec.Code != tc.status {
			t.Errorf("GET %s: status %d, want %d; body %q", tc.target, rec.Code, tc.status, rec.Body)
		}
	}
}
