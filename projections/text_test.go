package projections

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// TestResultText checks the text a tool_result's preview is made of: a
// string (only its first rawPrefix bytes decoded, cut at a rune, an escape
// or a surrogate pair, never inside one) or an array's text blocks.
func TestResultText(t *testing.T) {
	quote := func(s string) []byte { b, _ := json.Marshal(s); return b }
	long := func(unit string) string { return strings.Repeat(unit, rawPrefix) }
	for _, tc := range []struct {
		name string
		raw  []byte
		want string // a prefix of the result
	}{
		{"plain", quote("ok"), "ok"},
		{"white space before", []byte(" \n\"ok\""), "ok"},
		{"escapes", []byte(`"a\nb\u00e9\"c"`), "a\nbé\"c"},
		{"long ASCII", quote(long("a")), strings.Repeat("a", 300)},
		{"long two-byte runes", quote(long("é")), strings.Repeat("é", 300)},
		{"long four-byte runes", quote(long("😀")), strings.Repeat("😀", 300)},
		{"long escaped surrogate pairs", []byte(`"` + long(`\ud83d\ude00`) + `"`), strings.Repeat("😀", 150)},
		{"long odd offset", quote("x" + long("é")), "x" + strings.Repeat("é", 300)},
		{"blocks", []byte(`[{"type":"text","text":"a"},{"type":"image","source":{}},{"type":"text","text":"b"}]`), "a\nb"},
		{"not text", []byte(`{"x":1}`), ""},
		{"empty", nil, ""},
	} {
		got := string(appendResultText(nil, tc.raw))
		if !strings.HasPrefix(got, tc.want) || (tc.want == "" && got != "") {
			t.Errorf("%s: got %.40q…, want it to start with %.40q", tc.name, got, tc.want)
		}
		if !utf8.ValidString(got) || strings.ContainsRune(got, utf8.RuneError) {
			t.Errorf("%s: %.40q… is not valid text", tc.name, got)
		}
	}
}

// TestClipMatchesItsDefinition compares clip, clipBytes and plainKey with
// their definitions, rune by rune, on random strings of every kind of
// character JSON writes differently (and invalid UTF-8), among runs of
// plain ASCII.
func TestClipMatchesItsDefinition(t *testing.T) {
	slow := func(s string, runes, maxJSON int) string {
		s = validKey(s)
		n, size := 0, 0
		for j, r := range s {
			c := jsonRuneLen(r)
			if n == runes || size+c > maxJSON {
				return s[:j] + "…"
			}
			n++
			size += c
		}
		return s
	}
	slowPlainKey := func(s string) bool {
		for _, r := range s {
			if r == utf8.RuneError || jsonRuneLen(r) != utf8.RuneLen(r) {
				return false
			}
		}
		return true
	}
	// Runs of plain ASCII long and short (plainASCII reads eight bytes
	// at a time), and each character it must stop at.
	pieces := []string{"a", " ", "\"", "\\", "\n", "\x01", "<", ">", "&", "'", "\x7f", "é", "😀", "\u2028", "\xff", "\xe2\x82",
		"abcdefgh", "0123456789 ABCDEFGHIJ", "the quick brown fox jumps over the lazy dog; "}
	r := newRand(11)
	for i := 0; i < 20000; i++ {
		var b strings.Builder
		for k := r.IntN(60); k > 0; k-- {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		s, runes, max := b.String(), 1+r.IntN(300), 1+r.IntN(1200)
		if got, want := clip(s, runes, max), slow(s, runes, max); got != want {
			t.Fatalf("clip(%q, %d, %d) = %q, want %q", s, runes, max, got, want)
		}
		if got, want := clipBytes([]byte(s), runes, max), slow(s, runes, max); got != want {
			t.Fatalf("clipBytes(%q, %d, %d) = %q, want %q", s, runes, max, got, want)
		}
		if got, want := plainKey(s), slowPlainKey(s); got != want {
			t.Fatalf("plainKey(%q) = %v, want %v", s, got, want)
		}
	}
}
