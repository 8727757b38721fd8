package backend

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// Keys in an engine's names. A backend writes a user's key into the
// names of its engine's records (an etcd key, a Redis hash tag), where
// some bytes have a meaning of their own ('/' separates an etcd key's
// segments; '{' and '}' delimit a Redis hash tag); Escape keeps those
// out of the key's part, so that no key's records can fall under
// another key's ("a" and "a/b" stay apart). LogKey keeps a long key
// from filling a log record.

// Escape returns s with '%' and every byte of special percent-encoded
// (as %25, %2F, …, upper-case hex) and nothing else; s itself, without
// allocating, if it holds none of them.
func Escape(s, special string) string {
	if !strings.ContainsAny(s, special) && !strings.Contains(s, "%") {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '%' || strings.IndexByte(special, c) >= 0 {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// Unescape reverses Escape for the same special bytes, and reports false
// for a string Escape could not have made (a '%' not followed by the code
// of '%' or of a special byte).
func Unescape(s, special string) (string, bool) {
	if !strings.Contains(s, "%") {
		return s, true
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", false
		}
		c, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil || strings.ToUpper(s[i+1:i+3]) != s[i+1:i+3] || (c != '%' && strings.IndexByte(special, byte(c)) < 0) {
			return "", false
		}
		b.WriteByte(byte(c))
		i += 2
	}
	return b.String(), true
}

// logKeyMax is how many bytes of a key a log record shows.
const logKeyMax = 256

// LogKey returns key for a log record: whole, or, if longer than 256
// bytes, its first bytes and its size (a key too large for the engine
// must not fill the log), as fairlock's errors render keys.
func LogKey(key string) string {
	if len(key) <= logKeyMax {
		return key
	}
	n := logKeyMax
	for n > logKeyMax-utf8.UTFMax && !utf8.RuneStart(key[n]) {
		n--
	}
	return key[:n] + "… (" + strconv.Itoa(len(key)) + " bytes)"
}
