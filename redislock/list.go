package redislock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fairlock/fairlock/backend"
	"github.com/fairlock/fairlock/keylock"
)

// Who holds a key, from any process. The enqueue script records with
// each call what a listing in another process shows, at the cost of what
// it writes anyway: the session marker it sets holds the Locker's
// process, `host:pid "name"` (the name quoted as Go quotes strings, so
// that no name can forge a field), in place of a constant; and a call
// with a label (owner.NewLabeledContext) adds one field to the key's
// label hash, which every removal of the entry deletes (scripts.go). A
// listing is one script (listScript): the entries in queue order, those
// that hold the key by the walk's rule, and each one's process, label
// and token. The token is the server's clock in microseconds when the
// call queued, or a little ahead of it (scripts.go), so a call's age is
// the server's clock against its token: no client clock takes part.

// List runs the listing script on key's queue and reads its reply.
func (e *engine) List(ctx context.Context, key string) ([]keylock.CallInfo, error) {
	n := namesOf(e.esc, key)
	v, err := listScript.Run(ctx, e.client, []string{n.queue}, n.markers, e.channel).StringSlice()
	if err != nil {
		return nil, err
	}
	if len(v) < 2 || (len(v)-2)%5 != 0 {
		return nil, fmt.Errorf("redislock: unexpected reply of %d strings from the listing script", len(v))
	}
	sec, err1 := strconv.ParseInt(v[0], 10, 64)
	usec, err2 := strconv.ParseInt(v[1], 10, 64)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("redislock: unexpected TIME %q %q from the listing script", v[0], v[1])
	}
	now := sec*1_000_000 + usec
	var out []keylock.CallInfo
	for i := 2; i < len(v); i += 5 {
		member, score, proc, label, held := v[i], v[i+1], v[i+2], v[i+3], v[i+4] == "1"
		token, _ := strconv.ParseUint(score, 10, 64)
		mode, units := modeOf(member)
		c := keylock.CallInfo{Label: label, Process: parseProc(proc), Mode: mode, Units: units, Held: held}
		if held {
			c.Token = token
		}
		if d := now - int64(token); token > 0 && d > 0 {
			c.Age = time.Duration(d) * time.Microsecond
		}
		out = append(out, c)
	}
	return out, nil
}

// modeOf reads an entry's mode, and its units for a semaphore's, from the
// entry ("sid|seq|mode|w|n").
func modeOf(member string) (mode string, units int64) {
	f := strings.Split(member, "|")
	if len(f) != 5 {
		return keylock.ModeExclusive, 0
	}
	switch f[2] {
	case string(modeShared):
		return keylock.ModeShared, 0
	case string(modeWait):
		return keylock.ModeWait, 0
	case string(modeUnits):
		w, _ := strconv.ParseInt(f[3], 10, 64)
		return keylock.ModeUnits, w
	}
	return keylock.ModeExclusive, 0
}

var _ backend.Lister = (*engine)(nil)
