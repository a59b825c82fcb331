// Package console holds what Turnstone's commands need to write safely to
// a person's terminal: colour only when the output is a terminal and
// NO_COLOR is not set, and text in which no control character from the
// log (a stored prompt, a tool's output, an error message) reaches the
// terminal raw, where an escape sequence could retitle the window, clear
// the screen or rewrite what was printed before (issue 8).
package console

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
)

// Color reports whether w should get ANSI colour: it is a terminal
// (isatty), the NO_COLOR environment variable is unset or empty
// (https://no-color.org), and TERM is not "dumb". Files and pipes get no
// colour.
func Color(w io.Writer) bool {
	if os.Getenv("NO_COLOR") != "" || os.Getenv("TERM") == "dumb" {
		return false
	}
	return IsTerminal(w)
}

// IsTerminal reports whether w is an *os.File open on a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fd := f.Fd()
	return isatty.IsTerminal(fd) || isatty.IsCygwinTerminal(fd)
}

// LogWriter returns the zerolog console writer the commands log through:
// human-readable lines with the time of day, coloured only when Color(w).
func LogWriter(w io.Writer) zerolog.ConsoleWriter {
	return zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, NoColor: !Color(w)}
}

// Escape returns s with every character that is not safe to print on a
// terminal written as an escape, so that s prints on one line and as
// text: the C0 controls (tab, newline and carriage return as \t, \n, \r;
// the others, ESC and BEL among them, as \x1b, \x07), DEL (\x7f), the C1
// controls (U+0080-U+009F, as \u009b), the bidirectional formatting
// characters (U+202A-U+202E, U+2066-U+2069, as \u202e), and each byte
// that is not valid UTF-8 (as \xff). Everything else, backslashes
// included, is kept. s is returned as it is when nothing needs escaping.
func Escape(s string) string { return escape(s, false) }

// EscapeKeepLayout is Escape that keeps tabs and newlines: for text whose
// lines and columns are the printer's own (a table, a timeline).
func EscapeKeepLayout(s string) string { return escape(s, true) }

func escape(s string, layout bool) string {
	i := firstUnsafe(s, layout)
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case layout && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// firstUnsafe is the index of the first byte of s that escape changes, or
// -1.
func firstUnsafe(s string, layout bool) int {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if (c < 0x20 && !(layout && (c == '\n' || c == '\t'))) || c == 0x7f {
				return i
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || unsafeRune(r) {
			return i
		}
		i += size
	}
	return -1
}

// unsafeRune reports the non-ASCII runes a terminal may act on: the C1
// controls and the bidirectional formatting characters.
func unsafeRune(r rune) bool {
	return (r >= 0x80 && r <= 0x9f) || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
}

// NewWriter returns a writer that writes to w what it is given with
// EscapeKeepLayout applied: every text printer of the CLI writes through
// one, so that nothing it prints, whatever the log holds, reaches the
// terminal as a control sequence. A UTF-8 sequence split across two
// writes is held until it is complete. It reports len(p) written when w
// took everything.
func NewWriter(w io.Writer) io.Writer { return &writer{w: w} }

type writer struct {
	w    io.Writer
	tail []byte // an incomplete UTF-8 sequence at the end of the last write
}

func (w *writer) Write(p []byte) (int, error) {
	buf := p
	if len(w.tail) > 0 {
		buf = append(w.tail, p...)
		w.tail = nil
	}
	// Hold back an incomplete UTF-8 sequence at the end (at most 3 bytes).
	cut := len(buf)
	for k := 1; k <= 3 && k <= len(buf); k++ {
		c := buf[len(buf)-k]
		if c < utf8.RuneSelf {
			break
		}
		if utf8.RuneStart(c) {
			if !utf8.FullRune(buf[len(buf)-k:]) {
				cut = len(buf) - k
			}
			break
		}
	}
	if cut < len(buf) {
		w.tail = append([]byte(nil), buf[cut:]...)
	}
	if _, err := io.WriteString(w.w, EscapeKeepLayout(string(buf[:cut]))); err != nil {
		return 0, err
	}
	return len(p), nil
}
