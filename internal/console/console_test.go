package console

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

func TestEscape(t *testing.T) {
	tests := []struct {
		name, in, want, keepLayout string
	}{
		{"plain text stays", "fix the parser: ok", "fix the parser: ok", "fix the parser: ok"},
		{"unicode stays", "café ✓ 日本", "café ✓ 日本", "café ✓ 日本"},
		{"backslashes stay", `C:\dir\x1b`, `C:\dir\x1b`, `C:\dir\x1b`},
		{"title change", "hi\x1b]0;pwned\x07there", `hi\x1b]0;pwned\x07there`, `hi\x1b]0;pwned\x07there`},
		{"screen clear", "\x1b[2J\x1b[H", `\x1b[2J\x1b[H`, `\x1b[2J\x1b[H`},
		{"colour", "\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`, `\x1b[31mred\x1b[0m`},
		{"newline and tab", "a\nb\tc\r", `a\nb\tc\r`, "a\nb\tc\\r"},
		{"other C0 and DEL", "\x00\x08\x7f", `\x00\x08\x7f`, `\x00\x08\x7f`},
		{"C1 CSI", "a\u009b2Jb", `a\u009b2Jb`, `a\u009b2Jb`},
		{"bidi override", "abc\u202edcba", `abc\u202edcba`, `abc\u202edcba`},
		{"invalid UTF-8", "a\xffb\x9b", `a\xffb\x9b`, `a\xffb\x9b`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Escape(tt.in); got != tt.want {
				t.Errorf("Escape(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if got := EscapeKeepLayout(tt.in); got != tt.keepLayout {
				t.Errorf("EscapeKeepLayout(%q) = %q, want %q", tt.in, got, tt.keepLayout)
			}
			for _, out := range []string{Escape(tt.in), EscapeKeepLayout(tt.in)} {
				if strings.ContainsAny(out, "\x1b\x07\x00\x7f\r") || strings.ContainsRune(out, '\u009b') || strings.ContainsRune(out, '\u202e') {
					t.Errorf("%q still holds a control character", out)
				}
			}
		})
	}
}

func TestWriterEscapesAcrossWrites(t *testing.T) {
	var b bytes.Buffer
	w := NewWriter(&b)
	// "é" split across two writes stays one rune; ESC is escaped.
	for _, p := range []string{"prompt: caf\xc3", "\xa9 \x1b]0;x\x07\n", "row\tcell\n"} {
		if n, err := w.Write([]byte(p)); err != nil || n != len(p) {
			t.Fatalf("Write(%q) = %d, %v", p, n, err)
		}
	}
	if got, want := b.String(), "prompt: café \\x1b]0;x\\x07\nrow\tcell\n"; got != want {
		t.Errorf("wrote %q, want %q", got, want)
	}
}

func TestColorOnlyOnATerminal(t *testing.T) {
	var b bytes.Buffer
	if Color(&b) {
		t.Error("a buffer gets colour")
	}
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if Color(f) {
		t.Error("a file gets colour")
	}
	if LogWriter(f).NoColor != true {
		t.Error("LogWriter on a file has colour")
	}
	t.Setenv("NO_COLOR", "1")
	if Color(os.Stderr) {
		t.Error("NO_COLOR=1 still gets colour")
	}
}
