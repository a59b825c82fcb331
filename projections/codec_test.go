package projections

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"
	"github.com/turnstone-dev/turnstone/events"
)

// TestSnapshotCodec checks the stored form: a snapshot decodes to the
// state it was made of (as JSON, byte for byte, and folding on alike), its
// body is smaller than its JSON, and every body that is not a snapshot of
// this version is told apart: another version (including the plain JSON
// of versions before 6) from a corrupt one.
func TestSnapshotCodec(t *testing.T) {
	evs := synth(t, 5, 300, true)
	s := FoldLog(evs[:len(evs)/2])
	taken := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	body, err := EncodeSnapshot(s, taken)
	if err != nil {
		t.Fatal(err)
	}
	j := mustJSON(t, s)
	t.Logf("state of %d events: %d bytes of JSON, a body of %d", s.Events, len(j), len(body))
	if len(body) >= len(j)/2 {
		t.Errorf("the body (%d bytes) is not compressed (JSON %d bytes)", len(body), len(j))
	}
	snap, err := DecodeSnapshot(body)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Version != Version || snap.CoversSeq != s.LastSeq || !snap.TakenAt.Equal(taken) {
		t.Errorf("decoded %d %d %s", snap.Version, snap.CoversSeq, snap.TakenAt)
	}
	if got := mustJSON(t, snap.State); string(got) != string(j) {
		t.Fatalf("the state changed through its snapshot:\n%s", diffAt(got, j))
	}

	encode := func(v any) []byte {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	type ordered struct { // the members in the order EncodeSnapshot writes them
		Version   int    `json:"version"`
		CoversSeq uint64 `json:"covers_seq,omitempty"`
		State     any    `json:"state,omitempty"`
	}
	wrong := s.Clone()
	wrong.LastSeq++
	wrongSeq := s2.Encode(nil, encode(ordered{Version, s.LastSeq, wrong}))
	huge := binary.AppendUvarint(nil, MaxSnapshotBytes+1)
	for _, tc := range []struct {
		name string
		body []byte
		want error
	}{
		{"version 5, plain JSON", encode(map[string]any{"version": 5, "covers_seq": 1, "state": map[string]any{"last_seq": 1}}), ErrSnapshotVersion},
		{"a later version", s2.Encode(nil, encode(map[string]any{"version": Version + 1, "covers_seq": 1, "state": "anything"})), ErrSnapshotVersion},
		{"no version", s2.Encode(nil, encode(map[string]any{"covers_seq": 1})), ErrSnapshotVersion},
		{"empty", nil, ErrSnapshotCorrupt},
		{"not S2", []byte("\x05garbage"), ErrSnapshotCorrupt},
		{"cut short", body[:len(body)/2], ErrSnapshotCorrupt},
		{"too large once decompressed", append(huge, 0), ErrSnapshotCorrupt},
		{"not an object", s2.Encode(nil, []byte(`[1,2]`)), ErrSnapshotCorrupt},
		{"no state", s2.Encode(nil, encode(ordered{Version: Version, CoversSeq: 1})), ErrSnapshotCorrupt},
		{"state before version", s2.Encode(nil, encode(map[string]any{"version": Version, "state": s})), ErrSnapshotVersion},
		{"covers another sequence", wrongSeq, ErrSnapshotCorrupt},
		{"state of the wrong shape", s2.Encode(nil, encode(ordered{Version: Version, State: []int{1}})), ErrSnapshotCorrupt},
	} {
		if _, err := DecodeSnapshot(tc.body); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestCompressState checks the projector's compressed form of an idle state:
// it expands to the same state, and an idle session's state is a few
// hundred bytes.
func TestCompressState(t *testing.T) {
	idle := &Session{}
	at := time.Date(2026, 5, 1, 9, 30, 0, 123456789, time.UTC)
	for i, p := range []events.Payload{
		&events.SessionStarted{Runtime: "bench", Model: "claude-sonnet-4-5", Provider: "anthropic"},
		&events.TurnStarted{Prompt: "fix the failing test", Trigger: "user"},
		&events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockText, Text: "fix the failing test"}}},
		&events.MessageAppended{Role: events.RoleAssistant, Model: "claude-sonnet-4-5", StopReason: "end_turn",
			Content: []events.ContentBlock{{Type: events.BlockText, Text: "Done: the test expected the old error text."}}},
		&events.TurnCompleted{Reason: "end_turn", DurationMS: 3100},
	} {
		turn := "t0"
		if i == 0 {
			turn = ""
		}
		ev, err := events.NewAt(at, events.NewID(), "bench", "m004242", turn, p)
		if err != nil {
			t.Fatal(err)
		}
		ev.Seq, ev.Stored = 5000+uint64(i)*9, at.Add(time.Duration(i)*time.Millisecond)
		idle.Apply(ev)
	}
	for _, s := range []*Session{idle, FoldLog(synth(t, 9, 1, false)), FoldLog(synth(t, 9, 200, true)), {}} {
		c, err := compressState(s)
		if err != nil {
			t.Fatal(err)
		}
		back, err := decompressState(c)
		if err != nil {
			t.Fatal(err)
		}
		j := mustJSON(t, s)
		if got := mustJSON(t, back); string(got) != string(j) {
			t.Fatalf("the state changed through its compressed form:\n%s", diffAt(got, j))
		}
		t.Logf("%d events: %d bytes of JSON, %d compact", s.Events, len(j), len(c))
		if s == idle && len(c) > 512 {
			t.Errorf("an idle session's compressed state is %d bytes", len(c))
		}
	}
}
