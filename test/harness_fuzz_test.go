package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/claudecode"
	"github.com/turnstone-dev/turnstone/projections"
)

// Every fuzzed event is read as stored under this session.
const (
	fuzzTenant  = "fz"
	fuzzSession = "s"
)

// sliceLog is a projections.SessionReader over events held in memory.
type sliceLog []events.Event

func (l sliceLog) ReadSession(_ context.Context, tenant, session string, opts events.ReadOptions, fn func(events.Event) error) error {
	if len(l) == 0 || tenant != fuzzTenant || session != fuzzSession {
		return fmt.Errorf("read session: %w", events.ErrSessionNotFound)
	}
	for _, ev := range l {
		if ev.Seq < opts.FromSeq || opts.UntilSeq != 0 && ev.Seq > opts.UntilSeq {
			continue
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	return nil
}

// fuzzEvents reads data as a session's log: one stored body per line, at
// stream sequences 1, 2, ...
func fuzzEvents(data []byte) sliceLog {
	var evs sliceLog
	subject := events.StoredEventSubject(0, fuzzTenant, fuzzSession)
	for i, line := range bytes.Split(data, []byte("\n")) {
		evs = append(evs, events.DecodeStored(subject, uint64(i+1), line))
	}
	return evs
}

// fuzzSeeds returns logs (one body per line) for the fold's corpus: the
// events of a real transcript, and a hand-written session with a rewind,
// an orphan and its repair, a distillation, an unknown type and bad
// bodies.
func fuzzSeeds(tb testing.TB) [][]byte {
	tb.Helper()
	var seeds [][]byte
	lines := func(evs []events.Event) []byte {
		var b bytes.Buffer
		for _, ev := range evs {
			ev.Tenant, ev.Session = fuzzTenant, fuzzSession
			body, err := ev.Encode()
			if err != nil {
				tb.Fatal(err)
			}
			b.Write(body)
			b.WriteByte('\n')
		}
		return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
	}
	for _, rel := range []string{"spotter/short.jsonl", "ccviewer/agent-test-hash-123.jsonl"} {
		res, err := claudecode.ConvertFile(filepath.Join(transcriptsDir, rel), claudecode.Options{Tenant: fuzzTenant})
		if err != nil {
			tb.Fatalf("convert %s (the shared data sits beside the repository): %v", rel, err)
		}
		for _, s := range res.Sessions {
			seeds = append(seeds, lines(s.Events))
		}
	}

	at := time.Date(2026, 2, 19, 10, 0, 0, 0, time.UTC)
	n := 0
	ev := func(turn string, p events.Payload) events.Event {
		n++
		e, err := events.NewAt(at.Add(time.Duration(n)*time.Second), events.DeterministicID(at, fmt.Sprint(n)), fuzzTenant, fuzzSession, turn, p)
		if err != nil {
			tb.Fatal(err)
		}
		return e
	}
	msg := func(role events.Role, blocks ...events.ContentBlock) *events.MessageAppended {
		return &events.MessageAppended{Role: role, Content: blocks}
	}
	txt := func(s string) events.ContentBlock { return events.ContentBlock{Type: events.BlockText, Text: s} }
	use := func(id string) events.ContentBlock {
		return events.ContentBlock{Type: events.BlockToolUse, ID: id, Name: "Bash", Input: json.RawMessage(`{"command":"ls"}`)}
	}
	result := func(id string) events.ContentBlock {
		return events.ContentBlock{Type: events.BlockToolResult, ToolUseID: id, IsError: true, Content: json.RawMessage(`"interrupted"`)}
	}
	session := []events.Event{
		ev("", &events.SessionStarted{Runtime: "fuzz", Provider: "anthropic"}),                                        // 1
		ev("t1", &events.TurnStarted{Prompt: "go"}),                                                                   // 2
		ev("t1", msg(events.RoleUser, txt("go"))),                                                                     // 3
		ev("t1", msg(events.RoleAssistant, use("toolu_1"))),                                                           // 4
		ev("t1", &events.ToolCallStarted{ToolUseID: "toolu_1", Name: "Bash"}),                                         // 5
		ev("t1", &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: "crash"}}),           // 6: orphan
		ev("", msg(events.RoleUser, result("toolu_1"))),                                                               // 7
		ev("", &events.SnapshotTaken{CoversSeq: 6, Version: projections.Version}),                                     // 8
		ev("t2", &events.TurnStarted{Prompt: "again"}),                                                                // 9
		ev("t2", msg(events.RoleUser, txt("again"))),                                                                  // 10
		ev("t2", &events.ErrorRecorded{ErrorInfo: events.ErrorInfo{Message: "529", HTTPStatus: 529}, Consecutive: 1}), // 11
		ev("", &events.SessionRewound{ToSeq: 8, Reason: "retry from the snapshot"}),                                   // 12
		ev("t3", &events.TurnStarted{Prompt: "third"}),                                                                // 13
		ev("t3", msg(events.RoleUser, txt("third"))),                                                                  // 14
		ev("", &events.DistillationRequested{Reason: "auto"}),                                                         // 15
		ev("t3", &events.DistillationStarted{FromSeq: 1, ToSeq: 14}),                                                  // 16
		ev("t3", &events.DistillationCompleted{FromSeq: 1, ToSeq: 14, Summary: "s"}),                                  // 17
		ev("t3", msg(events.RoleAssistant, txt("done"))),                                                              // 18
		ev("t3", &events.TurnCompleted{}),                                                                             // 19
		ev("", &events.SessionForked{ForkSession: "s2", AtSeq: 19}),                                                   // 20
		ev("", &events.RecoveryAttempted{CommandID: "c1", Kind: "retry_turn", Attempt: 1, Result: "ok"}),              // 21
		ev("", &events.RecoveryCompleted{CommandID: "c1", Kind: "retry_turn", Outcome: events.OutcomeRecovered}),      // 22
		ev("", &events.SessionPaused{Reason: "person"}),                                                               // 23
		ev("t4", &events.TurnStarted{}),                                                                               // 24: while paused
	}
	seeds = append(seeds, lines(session))
	unknown := session[20]
	unknown.Type = "agent.thought"
	withBad := append(bytes.Clone(lines(session[:8])), []byte("\n{\"specversion\":\"1.0\"\nnot json\n")...)
	withBad = append(withBad, lines([]events.Event{unknown, session[0]})...)
	seeds = append(seeds, withBad, []byte(""), []byte("\n\n"))
	return seeds
}

// FuzzFold reads arbitrary bytes as a session's log (one stored body per
// line) and checks the fold's promises: folding never panics; the state
// survives its JSON (a snapshot) unchanged; a state restored from the
// snapshot of any prefix and folded on (refolding at rewinds) equals the
// fold of the whole log; and projections.Restore equals FoldLog.
func FuzzFold(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s, uint8(128))
	}
	f.Fuzz(func(t *testing.T, data []byte, cut uint8) {
		evs := fuzzEvents(data)
		full := projections.FoldLog(evs)
		if full.NeedsRefold {
			t.Fatal("FoldLog left NeedsRefold set")
		}
		want, err := json.Marshal(full)
		if err != nil {
			t.Fatalf("marshal the state: %v", err)
		}
		var back projections.Session
		if err := json.Unmarshal(want, &back); err != nil {
			t.Fatalf("unmarshal the state: %v", err)
		}
		if got, _ := json.Marshal(&back); !bytes.Equal(got, want) {
			t.Fatalf("the state changed through its JSON:\n%s", firstDiff(got, want))
		}
		for _, ev := range evs {
			_ = ev.Summary()
		}

		// A snapshot of a prefix, folded on as Restore does.
		k := int(cut) * len(evs) / 256
		prefix := projections.FoldLog(evs[:k])
		snap, err := json.Marshal(prefix)
		if err != nil {
			t.Fatal(err)
		}
		s := &projections.Session{}
		if err := json.Unmarshal(snap, s); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		for _, ev := range evs[k:] {
			s.Apply(ev)
			if s.NeedsRefold {
				if err := s.RefoldLog(ctx, evs); err != nil {
					t.Fatalf("refold: %v", err)
				}
			}
		}
		if got, _ := json.Marshal(s); !bytes.Equal(got, want) {
			t.Fatalf("the snapshot of the first %d of %d events, folded on, differs from the full fold:\n%s", k, len(evs), firstDiff(got, want))
		}

		restored, err := projections.Restore(ctx, evs, nil, fuzzTenant, fuzzSession)
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
		if got, _ := json.Marshal(restored); !bytes.Equal(got, want) {
			t.Fatalf("Restore differs from FoldLog:\n%s", firstDiff(got, want))
		}
		if strings.Contains(string(want), `"needs_refold":true`) {
			t.Fatal("state marshalled with needs_refold")
		}
	})
}
