// Package importer is what Turnstone's transcript importers share: the
// interface a transcript format implements (Format, Converter), the result
// of a conversion (Result, Session, Diagnostic), the session event builder
// with deterministic event ids (Emitter), the rules by which an assistant
// response cut by the end of a file is recorded and later continued
// (Emitter.Pieces, PieceKey), the import of many files into a Store
// (Import), and the follower that records transcripts live as a runtime
// writes them (Follower).
//
// Two formats implement it: internal/claudecode (Claude Code's
// ~/.claude/projects transcripts) and internal/codex (OpenAI Codex's
// ~/.codex/sessions rollouts). docs/importers.md describes both.
//
// # What every importer promises
//
// A conversion is a function of the file's bytes and of the ids the log
// already holds for its sessions (Input.Stored): converting a file twice
// gives the same events, and Import appends only those the log does not
// hold, so a second import adds nothing. Event ids are
// events.DeterministicID(time, "<tenant>/<session>/<key>") with keys from
// the file's own content (record uuids, line numbers, turn ids).
//
// A file may be cut anywhere: a copy taken while the runtime writes it, or
// a live file read by the Follower. A conversion records everything the
// file holds that later lines cannot change, and never withholds a model
// response or a tool result, even one the file shows still open: an
// assistant response cut by the end of the file is recorded as far as it
// goes (a piece, keyed by its first and last records, PieceKey), and the
// conversion of the grown file continues it from the first record no
// stored piece holds (Emitter.Pieces), as later message.appended events of
// the same message_id, which the projection merges into one API message.
// Importing a cut file and then the whole file gives the projection that
// importing the whole file once gives, and flags nothing it does not.
//
// Importers have no stage events from the runtime: a turn whose model
// answered (its first assistant message, tool call or model error) is in
// its execute stage, and the importers record that as
// turn.stage_completed for context and history (Emitter.Stages), as a live
// runtime would.
package importer

import (
	"errors"
	"fmt"
	"io"

	"github.com/turnstone-dev/turnstone/events"
)

// DefaultTenant is the tenant Options uses when none is set.
const DefaultTenant = "default"

// DefaultMaxLineBytes is the longest transcript line read, in bytes (64
// MiB): runtimes write a tool result of hundreds of KiB on one line.
const DefaultMaxLineBytes = 64 << 20

// Sentinel errors of the importers. Diagnostics wrap them; match them with
// errors.Is.
var (
	// ErrMalformedRecord: a transcript line is not a record the format can
	// read: bad JSON, a field of the wrong JSON type, a blank line, or a
	// field the conversion needs missing.
	ErrMalformedRecord = errors.New("malformed record")
	// ErrLineTooLong: a transcript line is longer than
	// Options.MaxLineBytes; it is skipped unread.
	ErrLineTooLong = errors.New("line too long")
	// ErrInvalidOptions: Options.Validate (or a configuration's Validate)
	// found a problem.
	ErrInvalidOptions = errors.New("invalid options")
)

// Options sets how transcripts are converted. The zero value is ready to
// use: tenant "default", source per session, 64 MiB lines.
type Options struct {
	// Tenant is the tenant token every event is stored under (see
	// events.ValidToken). Default DefaultTenant.
	Tenant string
	// Source, when set, is the envelope source of every event (a
	// URI-reference); by default each format names it per session
	// ("urn:claude-code:<session>", "urn:codex:<session>").
	Source string
	// MaxLineBytes bounds one transcript line, in bytes; a longer line is
	// skipped with a Diagnostic wrapping ErrLineTooLong. Default
	// DefaultMaxLineBytes.
	MaxLineBytes int
}

// SetDefaults fills the zero fields of o with their defaults.
func (o *Options) SetDefaults() {
	if o.Tenant == "" {
		o.Tenant = DefaultTenant
	}
	if o.MaxLineBytes == 0 {
		o.MaxLineBytes = DefaultMaxLineBytes
	}
}

// Validate reports every problem with the options (after defaults), each
// wrapping ErrInvalidOptions, joined; nil when they are usable.
func (o Options) Validate() error {
	o.SetDefaults()
	var errs []error
	if !events.ValidToken(o.Tenant) {
		errs = append(errs, fmt.Errorf("%w: tenant %q must be 1-%d characters of [A-Za-z0-9_-]", ErrInvalidOptions, o.Tenant, events.MaxTokenLen))
	}
	if o.MaxLineBytes < 0 {
		errs = append(errs, fmt.Errorf("%w: max line bytes must not be negative, got %d", ErrInvalidOptions, o.MaxLineBytes))
	}
	return errors.Join(errs...)
}

// Diagnostic reports one problem with a transcript that did not stop the
// conversion: the line (or, with Line 0, the whole file) was skipped and
// every other record was converted. File is the name the transcript was
// read under (its path for files) and Line is 1-based.
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

// Session kinds, as in events.SessionStarted.Kind.
const (
	KindMain       = "main"
	KindSubagent   = "subagent"
	KindCompaction = "compaction"
)

// Session is one converted session. Events are in log order and each
// passes events.Validate; the first is session.started. Session is the
// session token; Kind is KindMain, KindSubagent or KindCompaction; Parent
// and ParentToolUseID link a sidechain to its parent session and the tool
// call that started it (empty when unknown).
type Session struct {
	Tenant          string
	Session         string
	File            string
	Kind            string
	Parent          string
	ParentToolUseID string
	Events          []events.Event
}

// Result is what converting one transcript file produced: its sessions,
// the problems found (each line skipped), the number of records read
// (lines that parsed), the records that produce no event counted by what
// they are (Skipped), and the records of types the format does not know
// (Unknown, by type: a newer runtime's records; they are counted, never
// fatal).
type Result struct {
	Sessions    []Session
	Diagnostics []Diagnostic
	Records     int
	Skipped     map[string]int
	Unknown     map[string]int
}

// NewResult returns an empty Result with its maps made.
func NewResult() *Result {
	return &Result{Skipped: map[string]int{}, Unknown: map[string]int{}}
}

// EventCount is the number of events in all sessions of r.
func (r *Result) EventCount() int {
	n := 0
	for i := range r.Sessions {
		n += len(r.Sessions[i].Events)
	}
	return n
}

// StoredIDs returns the ids of the events the log holds for a session: an
// empty set (or nil) when it holds none. A conversion calls it at most once
// per session, when a response may continue a piece stored earlier, and
// treats the set as read-only. An error stops the conversion.
type StoredIDs func(tenant, session string) (map[string]struct{}, error)

// Input says how one transcript is read.
type Input struct {
	// Live says the file is being written as it is read (a followed file):
	// its sessions are live (events.SessionStarted.History false), and
	// what the next lines decide waits for them, except model responses
	// and tool results, which are recorded as far as they go. By default
	// a file is history: its sessions are marked so.
	Live bool
	// Stored, when set, tells which events the log holds already, so that
	// a response recorded in pieces by earlier reads continues where the
	// stored pieces end (see Emitter.Pieces). Nil: the log holds nothing
	// of these sessions.
	Stored StoredIDs
}

// Converter converts transcripts of one format. A Converter may remember
// what earlier files told (Claude Code links a subagent's file to its
// parent's tool call), so convert a session's files in the order
// Format.Expand gives. A Converter is not safe for concurrent use.
type Converter interface {
	// Convert converts the transcript read from r, the content of the
	// file at path as far as it was read (a followed file is read up to
	// its last complete line). A format may read files beside path. It
	// returns an error only when reading r fails or in.Stored fails;
	// problems with the content are Diagnostics in the Result, and it
	// never panics on its input.
	Convert(r io.Reader, path string, in Input) (*Result, error)
}

// Format is one transcript format.
type Format interface {
	// Name is the format's name, the value of `engine import --format`.
	Name() string
	// Expand turns command-line arguments (files or directories) into the
	// ordered list of transcript files to convert. It returns an error
	// wrapping the fs error for an argument that cannot be read.
	Expand(args []string) ([]string, error)
	// Transcript reports whether a file found under a followed directory
	// is a transcript of this format.
	Transcript(path string) bool
	// Companions lists the directories where the runtime writes other
	// transcripts of the session a transcript file holds (Claude Code's
	// <session>/subagents): a Follower given the file follows them too.
	Companions(path string) []string
	// Sidechain reports whether a transcript is converted after the
	// others read at the same time (a subagent's file after its parent's).
	Sidechain(path string) bool
	// NewConverter returns a Converter for opts, or an error wrapping
	// ErrInvalidOptions.
	NewConverter(opts Options) (Converter, error)
}
