package debug

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/fairlock/fairlock/internal/registry"
)

// Handler returns an http.Handler that serves the registered Lockers'
// state, whatever path it is mounted at:
//
//   - no format, or format=text: the text of Dump (text/plain);
//   - format=json: a JSON array of LockerState (application/json), field
//     names as tagged on LockerState, KeyState and WaiterState;
//   - locker=NAME: only that Locker; 404 Not Found if none is registered
//     under NAME;
//   - any other format: 400 Bad Request.
//
// It sets X-Content-Type-Options: nosniff, answers only GET and HEAD (405
// otherwise), and stops without writing if the request's context is done
// before the state has been read.
func Handler() http.Handler { return http.HandlerFunc(serve) }

func serve(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "fairlock debug: method not allowed", http.StatusMethodNotAllowed)
		return
	}
	q := r.URL.Query()
	format := q.Get("format")
	if format != "" && format != "text" && format != "json" {
		http.Error(w, fmt.Sprintf("fairlock debug: unknown format %q (want text or json)", format), http.StatusBadRequest)
		return
	}
	name := q.Get("locker")
	states := registry.Snapshot(name, 0)
	if name != "" && len(states) == 0 {
		http.Error(w, fmt.Sprintf("fairlock debug: no locker named %q", name), http.StatusNotFound)
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
