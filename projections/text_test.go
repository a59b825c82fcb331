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
		got := resultText(tc.raw)
		if !strings.HasPrefix(got, tc.want) || (tc.want == "" && got != "") {
			t.Errorf("%s: got %.40q…, want it to start with %.40q", tc.name, got, tc.want)
		}
		if !utf8.ValidString(got) || strings.ContainsRune(got, utf8.RuneError) {
			t.Errorf("%s: %.40q… is not valid text", tc.name, got)
		}
	}
}
