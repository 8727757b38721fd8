package fairlock

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Rendering keys for people: errors, debug output, warnings.
//
// A key is rendered only outside every shard mutex, because rendering may
// run user code (a formatter from WithKeyFormatter, a key's String method)
// that may block on anything, this Locker included. And it never reads
// memory a key points to: the holder of a pointer key owns what it points
// at, and reading it while the holder writes is a data race. So:
//
//   - keys of string kind (named string types too) are quoted, so that a
//     key cannot forge a line of a dump, a log record or an error;
//   - pointers, channels and unsafe.Pointers render as type and address,
//     (*main.Account)(0xc000012345), also inside structs, arrays and
//     interfaces; no String method of a key holding one is called;
//   - keys holding no pointer render as fmt's %v does, String method
//     included;
//   - whatever the result, control and other non-printing characters are
//     escaped as in a Go string literal.

// keyTextMax is about how many bytes of a key an error or a log record
// shows: a key can be as long as a caller likes (a 2 MiB key that etcd
// refuses, say), and a message that embeds all of it is unreadable.
const keyTextMax = 256

// keyText renders k for an error or a log record, with render (renderKey
// if nil), cut to keyTextMax bytes when longer and followed by the size:
// a string key as its quoted first bytes, `"abc"… (2097152 bytes)`;
// another rendering as its first bytes, `{abc… (300 bytes rendered)`.
// A cut falls on a rune boundary.
func keyText(k any, render func(any) string) string {
	if v := reflect.ValueOf(k); v.Kind() == reflect.String && render == nil { // named string types too
		s := v.String()
		if len(s) <= keyTextMax {
			return strconv.Quote(s)
		}
		return strconv.Quote(s[:runeCut(s, keyTextMax)]) + "… (" + strconv.Itoa(len(s)) + " bytes)"
	}
	if render == nil {
		render = renderKey
	}
	r := render(k)
	if len(r) <= keyTextMax {
		return r
	}
	return r[:runeCut(r, keyTextMax)] + "… (" + strconv.Itoa(len(r)) + " bytes rendered)"
}

// runeCut returns the largest n <= max at which s can be cut without
// splitting a UTF-8 sequence.
func runeCut(s string, max int) int {
	n := max
	for n > 0 && n > max-utf8.UTFMax && !utf8.RuneStart(s[n]) {
		n--
	}
	return n
}

// renderKey renders k by the rules above.
func renderKey(k any) string {
	if s, ok := k.(string); ok {
		return strconv.Quote(s)
	}
	v := reflect.ValueOf(k)
	if !v.IsValid() {
		return "<nil>"
	}
	var b strings.Builder
	writeValue(&b, v)
	return escapeNonPrinting(b.String())
}

// writeValue writes v, reading no memory v points to.
func writeValue(b *strings.Builder, v reflect.Value) {
	if !holdsPointer(v.Type()) {
		if v.Kind() == reflect.String {
			b.WriteString(strconv.Quote(v.String()))
			return
		}
		fmt.Fprint(b, v) // for an exported value, its String method if any
		return
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.UnsafePointer, reflect.Chan:
		fmt.Fprintf(b, "(%s)(%#x)", v.Type(), v.Pointer())
	case reflect.Interface:
		if v.IsNil() {
			b.WriteString("<nil>")
			return
		}
		writeValue(b, v.Elem())
	case reflect.Struct:
		b.WriteByte('{')
		for i := range v.NumField() {
			if i > 0 {
				b.WriteByte(' ')
			}
			writeValue(b, v.Field(i))
		}
		b.WriteByte('}')
	case reflect.Array:
		b.WriteByte('[')
		for i := range v.Len() {
			if i > 0 {
				b.WriteByte(' ')
			}
			writeValue(b, v.Index(i))
		}
		b.WriteByte(']')
	default: // map, slice, func: not comparable, so never a key's part
		fmt.Fprintf(b, "(%s)(?)", v.Type())
	}
}

// holdsPointer reports whether a value of type t can point to memory
// other than an immutable string's bytes.
func holdsPointer(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Pointer, reflect.UnsafePointer, reflect.Chan, reflect.Interface,
		reflect.Map, reflect.Slice, reflect.Func:
		return true
	case reflect.Struct:
		for i := range t.NumField() {
			if holdsPointer(t.Field(i).Type) {
				return true
			}
		}
	case reflect.Array:
		return t.Len() > 0 && holdsPointer(t.Elem())
	}
	return false
}

// escapeNonPrinting returns s with control characters, other non-printing
// runes and invalid UTF-8 escaped as in a Go string literal, or s itself
// if it has none.
func escapeNonPrinting(s string) string {
	for i, r := range s {
		invalid := r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD")
		if invalid || !unicode.IsPrint(r) {
			q := strconv.Quote(s)
			return q[1 : len(q)-1]
		}
	}
	return s
}
