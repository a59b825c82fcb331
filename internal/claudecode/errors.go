package claudecode

import "github.com/turnstone-dev/turnstone/internal/importer"

// Sentinel errors of the importer (the importers' shared ones). Diagnostics
// wrap them; match them with errors.Is.
var (
	// ErrMalformedRecord: a transcript line is not a record this package can
	// read: bad JSON, a field of the wrong JSON type, a blank line, or a
	// field the conversion needs (uuid, timestamp, message content) missing.
	ErrMalformedRecord = importer.ErrMalformedRecord
	// ErrLineTooLong: a transcript line is longer than Options.MaxLineBytes;
	// it is skipped unread.
	ErrLineTooLong = importer.ErrLineTooLong
	// ErrInvalidOptions: Options.Validate found a problem.
	ErrInvalidOptions = importer.ErrInvalidOptions
)

// Diagnostic reports one problem with a transcript that did not stop the
// conversion (importer.Diagnostic): "file:line: problem".
type Diagnostic = importer.Diagnostic
