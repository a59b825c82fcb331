package projections

import (
	"bytes"
	"fmt"
	"sync"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/klauspost/compress/s2"
	"github.com/turnstone-dev/turnstone/events"
)

// The state's encoded forms.
//
// The state's JSON (encodeState) is what `engine inspect --json` shows:
// github.com/go-json-experiment/json, members of maps sorted, <, > and &
// as they are, invalid UTF-8 (which no state the fold made holds)
// replaced by U+FFFD. The state's tags use omitzero for numbers and
// booleans, so encoding/json writes the same bytes.
//
// A snapshot's body (EncodeSnapshot) is the Snapshot as JSON, compressed
// with S2 (github.com/klauspost/compress/s2, block format): about a
// quarter of the JSON's size, decompressed at well over a GB/s. Its JSON
// is at most MaxSnapshotBytes, so the body is too. A body that starts
// with '{' is a snapshot of a version before 6: plain JSON. An S2 block
// starts with its decoded length as a uvarint, which is '{' only for 123
// bytes, and no snapshot's JSON is that short.
//
// An idle state the projector holds (compressState) is its JSON compressed
// with S2 against a dictionary, the JSON of a typical state made from a
// fixed session when the package loads, so that the names and shapes every
// state shares cost next to nothing: an idle session's state of 1.4 KB of
// JSON is held in about 300 bytes. That form never leaves the process,
// so the dictionary may change with any build.

// stateOptions are the options every encoding of the state uses.
var stateOptions = json.JoinOptions(json.Deterministic(true), jsontext.AllowInvalidUTF8(true))

// encodeState returns the JSON of v (a Session, or a Snapshot holding one).
func encodeState(v any) ([]byte, error) { return json.Marshal(v, stateOptions) }

// EncodeSnapshot returns the stored body of a snapshot of s taken at
// takenAt (see SnapshotStore): the Snapshot as JSON, compressed with S2.
// It returns ErrSnapshotTooLarge when the JSON is over MaxSnapshotBytes
// (which no state the fold made is: docs/limits.md).
func EncodeSnapshot(s *Session, takenAt time.Time) ([]byte, error) {
	j, err := encodeState(Snapshot{Version: Version, CoversSeq: s.LastSeq, TakenAt: takenAt, State: s})
	if err != nil {
		return nil, err
	}
	if len(j) > MaxSnapshotBytes {
		return nil, fmt.Errorf("%w: %d bytes of JSON, the limit is %d", ErrSnapshotTooLarge, len(j), MaxSnapshotBytes)
	}
	return s2.Encode(nil, j), nil
}

// DecodeSnapshot decodes a snapshot's stored body. It reads the version
// first and decodes the state only when it is this build's. Errors:
// ErrSnapshotVersion for a snapshot of another version (a plain JSON body
// of a version before 6 included); ErrSnapshotCorrupt when the body does
// not decompress or decode, its JSON is over MaxSnapshotBytes, it holds no
// state, or its covers_seq is not its state's LastSeq.
func DecodeSnapshot(body []byte) (*Snapshot, error) {
	if len(body) > 0 && body[0] == '{' {
		return decodeSnapshotJSON(body) // before version 6: its version tells
	}
	n, err := s2.DecodedLen(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSnapshotCorrupt, err)
	}
	if n > MaxSnapshotBytes {
		return nil, fmt.Errorf("%w: %d bytes of JSON, over MaxSnapshotBytes", ErrSnapshotCorrupt, n)
	}
	buf := getBuffer(n)
	defer putBuffer(buf)
	j, err := s2.Decode(buf, body)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSnapshotCorrupt, err)
	}
	return decodeSnapshotJSON(j)
}

// decodeSnapshotJSON decodes a snapshot's JSON in one pass, checking its
// version (written first) before it decodes the state, whose shape may
// differ in other versions.
func decodeSnapshotJSON(j []byte) (*Snapshot, error) {
	corrupt := func(err error) (*Snapshot, error) { return nil, fmt.Errorf("%w: %v", ErrSnapshotCorrupt, err) }
	dec := jsontext.NewDecoder(bytes.NewBuffer(j))
	if tok, err := dec.ReadToken(); err != nil || tok.Kind() != '{' {
		return corrupt(fmt.Errorf("not a JSON object (%v)", err))
	}
	snap := &Snapshot{Version: -1}
	for dec.PeekKind() == '"' {
		name, err := dec.ReadToken()
		if err != nil {
			return corrupt(err)
		}
		switch name.String() {
		case "version":
			if err := json.UnmarshalDecode(dec, &snap.Version); err != nil {
				return corrupt(err)
			}
			if snap.Version != Version {
				return nil, fmt.Errorf("%w: version %d, this build folds version %d", ErrSnapshotVersion, snap.Version, Version)
			}
		case "covers_seq":
			err = json.UnmarshalDecode(dec, &snap.CoversSeq)
		case "taken_at":
			err = json.UnmarshalDecode(dec, &snap.TakenAt)
		case "state":
			if snap.Version != Version {
				return nil, fmt.Errorf("%w: the state comes before version %d", ErrSnapshotVersion, Version)
			}
			snap.State = &Session{}
			err = json.UnmarshalDecode(dec, snap.State)
		default:
			err = dec.SkipValue()
		}
		if err != nil {
			return corrupt(err)
		}
	}
	if _, err := dec.ReadToken(); err != nil {
		return corrupt(err)
	}
	switch {
	case snap.Version != Version:
		return nil, fmt.Errorf("%w: no version %d", ErrSnapshotVersion, Version)
	case snap.State == nil:
		return corrupt(fmt.Errorf("no state"))
	case snap.State.LastSeq != snap.CoversSeq:
		return corrupt(fmt.Errorf("covers_seq %d but the state's last_seq is %d", snap.CoversSeq, snap.State.LastSeq))
	}
	return snap, nil
}

// buffers are reused for decompressed JSON, which the decoder copies out.
var buffers = sync.Pool{New: func() any { return new([]byte) }}

func getBuffer(n int) []byte {
	b := *buffers.Get().(*[]byte)
	if cap(b) < n {
		return make([]byte, 0, n)
	}
	return b[:0]
}

func putBuffer(b []byte) {
	if cap(b) <= MaxSnapshotBytes {
		buffers.Put(&b)
	}
}

// idleDict is the dictionary of the compressed form: the JSON of the state
// of a short session of every common shape (a turn with a prompt, a
// tool call and its result, an answer, labels, a distillation).
var idleDict = sync.OnceValue(func() *s2.Dict {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &Session{}
	seq := uint64(100000)
	add := func(turn string, p events.Payload) {
		ev, err := events.NewAt(at, events.DeterministicID(at, fmt.Sprint(seq)), "tenant", "session-0000", turn, p)
		if err != nil {
			return
		}
		ev.Seq, ev.Stored = seq, at
		seq += 7
		s.Apply(ev)
	}
	add("", &events.SessionStarted{Runtime: "claude-code 2.1.38", Model: "claude-sonnet-4-5", Provider: "anthropic", Kind: "main",
		Labels: map[string]string{"cwd": "/home/user/project", "branch": "main"}})
	add("", &events.DistillationCompleted{TokensBefore: 180000, TokensAfter: 12000, Trigger: "auto"})
	for i, prompt := range []string{"fix the failing test in the parser", "now run the whole suite"} {
		turn := fmt.Sprintf("turn-%d", i)
		id := fmt.Sprintf("toolu_01ABCDEFGHIJKLMNOPQRSTU%d", i)
		add(turn, &events.TurnStarted{Prompt: prompt, Trigger: "user"})
		add(turn, &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockText, Text: prompt}}})
		add(turn, &events.MessageAppended{Role: events.RoleAssistant, Model: "claude-sonnet-4-5", MessageID: "msg_01ABCDEFGHIJKLMNOPQRSTUV", StopReason: "tool_use",
			Content: []events.ContentBlock{{Type: events.BlockToolUse, ID: id, Name: "Bash", Input: []byte(`{"command":"go test ./...","description":"Run the tests"}`)}}})
		add(turn, &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockToolResult, ToolUseID: id, Content: []byte(`"ok  \tgithub.com/example/project\t0.012s"`)}}})
		add(turn, &events.MessageAppended{Role: events.RoleAssistant, Model: "claude-sonnet-4-5", MessageID: "msg_01ABCDEFGHIJKLMNOPQRSTUW", StopReason: "end_turn",
			Content: []events.ContentBlock{{Type: events.BlockText, Text: "Done: the tests pass."}}})
		add(turn, &events.TurnCompleted{Reason: "end_turn", DurationMS: 4200})
	}
	j, err := encodeState(s)
	if err != nil || len(j) < s2.MinDictSize {
		return nil
	}
	return s2.MakeDict(j, []byte(`{"version":`))
})

// compressState returns the compressed form of s (see above).
func compressState(s *Session) ([]byte, error) {
	j, err := encodeState(s)
	if err != nil {
		return nil, err
	}
	buf := getBuffer(s2.MaxEncodedLen(len(j)))
	defer putBuffer(buf)
	var c []byte
	if d := idleDict(); d != nil {
		c = d.EncodeBetter(buf[:cap(buf)], j)
	} else {
		c = s2.Encode(buf[:cap(buf)], j)
	}
	return bytes.Clone(c), nil // exactly its size: it is what memory holds
}

// decompressState decodes the compressed form of a state.
func decompressState(c []byte) (*Session, error) {
	n, err := s2.DecodedLen(c)
	if err != nil {
		return nil, err
	}
	buf := getBuffer(n)
	defer putBuffer(buf)
	var j []byte
	if d := idleDict(); d != nil {
		j, err = d.Decode(buf[:cap(buf)], c)
	} else {
		j, err = s2.Decode(buf[:cap(buf)], c)
	}
	if err != nil {
		return nil, err
	}
	s := &Session{}
	if err := json.Unmarshal(j, s); err != nil {
		return nil, err
	}
	return s, nil
}
