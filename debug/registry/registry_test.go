package registry_test

import (
	"encoding/json"
	"strconv"
	"testing"

	"github.com/fairlock/fairlock/debug/registry"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestJSONKey(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{`"user-13"`, `user-13`},
		{strconv.Quote("a\nb"), `a\nb`},         // stays escaped: no forged line
		{strconv.Quote(`say "hi"`), `say "hi"`}, // JSON escapes the quotes itself
		{strconv.Quote("é\x00"), `é\x00`},
		{strconv.Quote("bad\xffbyte"), `bad\xffbyte`},
		{`42`, `42`},
		{`{"a" 1}`, `{"a" 1}`}, // a struct's rendering: not one quoted string
		{`(*main.T)(0xc000012345)`, `(*main.T)(0xc000012345)`},
		{`"`, `"`},
		{`"a" "b"`, `"a" "b"`},
		{`"abc"… (2097152 bytes)`, `abc… (2097152 bytes)`}, // a long key, cut
		{strconv.Quote("a\nb") + `… (300 bytes)`, `a\nb… (300 bytes)`},
		{`{abc… (300 bytes rendered)`, `{abc… (300 bytes rendered)`},
	} {
		if got := registry.JSONKey(c.text); got != c.want {
			t.Errorf("JSONKey(%s) = %s; want %s", c.text, got, c.want)
		}
	}
}

// The JSON of a KeyState carries a string key without the text form's
// quotes.
func TestKeyStateJSONKeyHasNoExtraQuotes(t *testing.T) {
	k := registry.KeyState{Key: `"user-13"`, Holders: []registry.HolderState{{Owner: "flow#3", Label: "req-42"}}}
	b, err := json.Marshal([]registry.KeyState{k})
	if err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got[0]["key"] != "user-13" {
		t.Fatalf("key in %s = %q; want user-13", b, got[0]["key"])
	}
	h := got[0]["holders"].([]any)[0].(map[string]any)
	if h["owner"] != "flow#3" || h["label"] != "req-42" {
		t.Fatalf("holder in %s: want owner flow#3, label req-42", b)
	}
}
