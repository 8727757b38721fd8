package debug

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/fairlock/fairlock/debug/registry"
)

// defaultLimit is how many keys per locker Handler shows when the request
// has no limit parameter: the longest held first, the rest only counted.
// A locker with 100,000 held keys would otherwise fill tens of megabytes.
const defaultLimit = 1000

// knownParams are the query parameters Handler reads; any other is refused.
var knownParams = []string{"format", "limit", "locker"}

// Handler returns an http.Handler that serves the registered lockers'
// state. Query parameters:
//
//   - format=text (the default): the text of Dump (text/plain), with a
//     "… N more keys left out" line under a locker that has more live keys
//     than the limit;
//   - format=json: a JSON array of LockerState (application/json), field
//     names as listed on LockerState, KeyState, HolderState and
//     WaiterState; a locker's
//     omitted_keys counts the live keys left out of held;
//   - limit=N: at most N keys per locker, the longest held first; N is a
//     positive integer, 1000 when limit is absent;
//   - locker=NAME: only the locker registered as NAME.
//
// A parameter with an empty value counts as absent. It answers:
//
//   - 200 OK with the state; the request's context is checked after the
//     state has been read, and if it is done nothing is written;
//   - 400 Bad Request for a query that does not parse (url.ParseQuery),
//     a parameter other than format, limit and locker, one given twice,
//     a format other than text or json, or a limit that is not a positive
//     integer;
//   - 404 Not Found for a path below the one it is mounted at (see below),
//     or for a locker=NAME under which no locker is registered (only
//     lockers built with a WithDebug option are: fairlock's, etcdlock's,
//     redislock's; and only while open; the message lists those that
//     are);
//   - 405 Method Not Allowed, with an Allow header, for a method other
//     than GET and HEAD.
//
// Every answer carries X-Content-Type-Options: nosniff.
//
// Mounted on a ServeMux under a pattern that ends in "/" or in a
// "{name...}" wildcard, such as "/debug/fairlock/", it serves the
// pattern's own path only, not the paths below it that the pattern also
// matches, with or without http.StripPrefix before or after the mux: it
// compares the request's path, and the path it came with
// (Request.RequestURI), with the pattern. Under a StripPrefix after the
// mux, a path below the mount that repeats the pattern ("/d/d/" for "/d/"
// stripped of "/d") is served. Reached without a pattern, it serves
// paths that end in "/" and the empty path. A read takes each locker's shard mutexes
// in turn; it allocates in proportion to the keys it shows.
func Handler() http.Handler { return http.HandlerFunc(serve) }

func serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "fairlock debug: method not allowed", http.StatusMethodNotAllowed)
		return
	}
	if !ownPath(r) {
		http.Error(w, fmt.Sprintf("fairlock debug: no page at %q", r.URL.Path), http.StatusNotFound)
		return
	}
	format, limit, name, err := parseQuery(r.URL.RawQuery)
	if err != nil {
		http.Error(w, "fairlock debug: "+err.Error(), http.StatusBadRequest)
		return
	}
	states := registry.Snapshot(name, limit)
	if name != "" && len(states) == 0 {
		http.Error(w, notFound(name), http.StatusNotFound)
		return
	}
	if err := r.Context().Err(); err != nil {
		return // the client is gone; nothing to write
	}
	if format == "json" {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(states) // a write error means the client left
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_ = writeText(w, states)
}

// parseQuery reads and checks the query; the error says what is wrong.
func parseQuery(raw string) (format string, limit int, locker string, err error) {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return "", 0, "", fmt.Errorf("malformed query: %v", err)
	}
	for _, p := range slices.Sorted(maps.Keys(q)) {
		vs := q[p]
		if !slices.Contains(knownParams, p) {
			return "", 0, "", fmt.Errorf("unknown parameter %q (known: %s)", p, strings.Join(knownParams, ", "))
		}
		if len(vs) > 1 {
			return "", 0, "", fmt.Errorf("parameter %q given %d times", p, len(vs))
		}
	}
	format, locker, limit = q.Get("format"), q.Get("locker"), defaultLimit
	if format != "" && format != "text" && format != "json" {
		return "", 0, "", fmt.Errorf("unknown format %q (want text or json)", format)
	}
	if s := q.Get("limit"); s != "" {
		if limit, err = strconv.Atoi(s); err != nil || limit < 1 {
			return "", 0, "", fmt.Errorf("limit %q is not a positive integer", s)
		}
	}
	return format, limit, locker, nil
}

// notFound is the 404 message for a locker=NAME that is not registered.
func notFound(name string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "fairlock debug: no open locker named %q; only lockers built with a WithDebug option (fairlock.WithDebug, etcdlock.WithDebug, redislock.WithDebug) appear here, while they are open. ", name)
	names := registry.Names()
	if len(names) == 0 {
		b.WriteString("None is open.")
		return b.String()
	}
	b.WriteString("Open: ")
	for i, n := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(n))
	}
	b.WriteString(".")
	return b.String()
}

// ownPath reports whether r asks for the handler's own page rather than a
// path below it. A ServeMux pattern that ends in "/" (or in a "{name...}"
// wildcard) matches every path under it, so the path must be the
// pattern's own: either r.URL.Path is (the mux matched it, possibly after
// a StripPrefix or a rewrite before the mux), or the path the request
// came with, r.RequestURI, is and r.URL.Path is what a StripPrefix after
// the mux left of it. Segments are compared unescaped, a wildcard segment
// ("{id}") matching any one segment. A pattern that does not end in "/"
// matched the path exactly. Without a pattern, the path must end in "/"
// or be empty. One request is read both ways: when the path below a
// StripPrefix mount repeats the pattern ("/d/d/" for "/d/" stripped of
// "/d"), it is served.
func ownPath(r *http.Request) bool {
	pattern := patternPath(r.Pattern)
	if pattern == "" {
		return r.URL.Path == "" || strings.HasSuffix(r.URL.Path, "/")
	}
	patSegs := strings.Split(strings.TrimPrefix(pattern, "/"), "/")
	if last := patSegs[len(patSegs)-1]; strings.HasPrefix(last, "{") && strings.HasSuffix(last, "...}") {
		patSegs[len(patSegs)-1] = "" // the rest of the path: empty on the own page
	} else if last != "" {
		return true // an exact pattern
	}
	path := r.URL.EscapedPath()
	if matchesPattern(path, patSegs) {
		return true
	}
	u, err := url.ParseRequestURI(r.RequestURI)
	if r.RequestURI == "" || err != nil {
		return false
	}
	orig := u.EscapedPath()
	return strings.HasSuffix(orig, path) && matchesPattern(orig, patSegs)
}

// matchesPattern reports whether path has the pattern's segments, as many
// and each equal (unescaped), a wildcard segment matching any one.
func matchesPattern(path string, patSegs []string) bool {
	reqSegs := strings.Split(strings.TrimPrefix(path, "/"), "/")
	if len(reqSegs) != len(patSegs) {
		return false
	}
	for i, ps := range patSegs {
		if len(ps) > 2 && ps[0] == '{' && ps[len(ps)-1] == '}' {
			continue // a wildcard: any one segment
		}
		rs, err1 := url.PathUnescape(reqSegs[i])
		ps, err2 := url.PathUnescape(ps)
		if err1 != nil || err2 != nil || rs != ps {
			return false
		}
	}
	return true
}

// patternPath returns the path part of a ServeMux pattern
// ("[METHOD ][HOST]/[PATH]"), or "" if there is none.
func patternPath(pattern string) string {
	if i := strings.IndexAny(pattern, " \t"); i >= 0 {
		pattern = strings.TrimLeft(pattern[i:], " \t")
	}
	if i := strings.IndexByte(pattern, '/'); i >= 0 {
		return pattern[i:]
	}
	return ""
}
