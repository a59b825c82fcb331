package importer

import (
	"bufio"
	"bytes"
	"io"

	"github.com/turnstone-dev/turnstone/events"
)

// Token makes s a valid subject token (events.ValidToken): characters
// outside [A-Za-z0-9_-] become '-', and it is cut to events.MaxTokenLen
// bytes; an empty s becomes "unknown".
func Token(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			b[i] = '-'
		}
	}
	if len(b) > events.MaxTokenLen {
		b = b[:events.MaxTokenLen]
	}
	if len(b) == 0 {
		return "unknown"
	}
	return string(b)
}

// Clip returns the first n runes of s.
func Clip(s string, n int) string {
	i := 0
	for j := range s {
		if i == n {
			return s[:j]
		}
		i++
	}
	return s
}

// LineReader reads a transcript one line at a time, with no limit below
// max on a line's length; a longer line is consumed and reported as too
// long instead of failing the read.
type LineReader struct {
	br  *bufio.Reader
	max int
	buf []byte
}

// NewLineReader returns a LineReader of r for lines of at most max bytes.
func NewLineReader(r io.Reader, max int) *LineReader {
	return &LineReader{br: bufio.NewReaderSize(r, 64<<10), max: max}
}

// Next returns the next line without its line ending ("\n" or "\r\n"). ok
// is false at the end of the input; err is an I/O error other than io.EOF.
// tooLong reports a line longer than max (line is then nil). The line is
// valid until the next call.
func (lr *LineReader) Next() (line []byte, tooLong, ok bool, err error) {
	lr.buf = lr.buf[:0]
	read := false
	for {
		frag, rerr := lr.br.ReadSlice('\n')
		if len(frag) > 0 {
			read = true
		}
		if !tooLong {
			if len(lr.buf)+len(frag) > lr.max+2 { // room for "\r\n"
				tooLong = true
				lr.buf = lr.buf[:0]
			} else {
				lr.buf = append(lr.buf, frag...)
			}
		}
		switch {
		case rerr == bufio.ErrBufferFull:
			continue
		case rerr == io.EOF:
			if !read {
				return nil, false, false, nil
			}
		case rerr != nil:
			return nil, false, false, rerr
		}
		if tooLong {
			return nil, true, true, nil
		}
		l := bytes.TrimSuffix(lr.buf, []byte("\n"))
		l = bytes.TrimSuffix(l, []byte("\r"))
		if len(l) > lr.max {
			return nil, true, true, nil
		}
		return l, false, true, nil
	}
}
