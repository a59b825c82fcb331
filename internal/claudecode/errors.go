package claudecode

import (
	"errors"
	"fmt"
)

// Sentinel errors of the importer. Diagnostics wrap them; match them with
// errors.Is.
var (
	// ErrMalformedRecord: a transcript line is not a record this package can
	// read: bad JSON, a field of the wrong JSON type, a blank line, or a
	// field the conversion needs (uuid, timestamp, message content) missing.
	ErrMalformedRecord = errors.New("malformed record")
	// ErrLineTooLong: a transcript line is longer than Options.MaxLineBytes;
	// it is skipped unread.
	ErrLineTooLong = errors.New("line too long")
	// ErrInvalidOptions: Options.Validate found a problem.
	ErrInvalidOptions = errors.New("invalid options")
)

// Diagnostic reports one problem with a transcript that did not stop the
// conversion: the line (or, with Line 0, the whole file) was skipped and
// every other record was converted. File is the name the transcript was
// read under (its path for ConvertFile and Import) and Line is 1-based.
type Diagnostic struct {
	File string
	Line int
	Err  error
}

// Error implements error: "file:line: problem", or "file: problem" when
// Line is 0.
func (d Diagnostic) Error() string {
	if d.Line > 0 {
		return fmt.Sprintf("%s:%d: %v", d.File, d.Line, d.Err)
	}
	return fmt.Sprintf("%s: %v", d.File, d.Err)
}

// Unwrap returns the underlying error (ErrMalformedRecord, ErrLineTooLong,
// an I/O error, or an events.ErrInvalid chain).
func (d Diagnostic) Unwrap() error { return d.Err }
