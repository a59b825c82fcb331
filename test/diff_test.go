package test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/claudecode"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/forensics"
	"github.com/turnstone-dev/turnstone/projections"
)

// TestDiffOfARealTranscript runs `engine diff` on real transcripts between
// two sequences and checks each change against the two folds: the state
// as of --from and the state as of --to, each folded from the first event
// on its own.
func TestDiffOfARealTranscript(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	srv := embeddedtest.Start(t)
	_, js := embeddedtest.Connect(t, srv)
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cut, orphans := cutAfterToolUse(t, filepath.Join(transcriptsDir, "spotter/tool_heavy.jsonl"), 3)
	// The person's next prompt shows the tool never answered (a transcript's
	// end alone leaves the turn in flight: the runtime may still be at it).
	cut = nextPrompt(t, cut)
	for _, imp := range []struct {
		tenant string
		files  []string
	}{
		{"real", []string{filepath.Join(transcriptsDir, "spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl")}},
		{"crash", []string{cut}},
	} {
		if _, err := claudecode.Import(ctx, claudecode.LogStore(log), imp.files, claudecode.Options{Tenant: imp.tenant}, nil); err != nil {
			t.Fatal(err)
		}
	}
	read := func(tenant, session string) []events.Event {
		var evs []events.Event
		if err := log.ReadSession(ctx, tenant, session, events.ReadOptions{}, func(ev events.Event) error {
			evs = append(evs, ev)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return evs
	}
	foldUntil := func(evs []events.Event, seq uint64) *projections.Session {
		var upto []events.Event
		for _, ev := range evs {
			if seq == 0 || ev.Seq <= seq {
				upto = append(upto, ev)
			}
		}
		return projections.FoldLog(upto)
	}
	realEvs := read("real", "258c7280-ae70-4798-800f-63464d01a85d")
	crashRefs, _ := log.Sessions(ctx, "crash")
	crashEvs := read("crash", crashRefs[0].Session)
	cases := []struct {
		name          string
		session       string
		evs           []events.Event
		from, to      uint64
		wantEnded     bool
		wantAnswered  bool
		wantRaised    int
		wantDistilled bool
	}{
		{"the middle of a real session", "real/258c7280-ae70-4798-800f-63464d01a85d", realEvs, realEvs[len(realEvs)/5].Seq, realEvs[len(realEvs)*4/5].Seq, true, true, 0, true},
		{"a crash: the cut turn from its start to the end", "crash/" + crashRefs[0].Session, crashEvs, crashEvs[len(crashEvs)/2].Seq, 0, true, false, len(orphans), false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"diff", c.session, "--from", strconv.FormatUint(c.from, 10)}
			if c.to != 0 {
				args = append(args, "--to", strconv.FormatUint(c.to, 10))
			}
			var d forensics.Diff
			if err := json.Unmarshal([]byte(run(t, srv.ClientURL(), append(slices.Clone(args), "--json")...)), &d); err != nil {
				t.Fatal(err)
			}
			a, b := foldUntil(c.evs, c.from), foldUntil(c.evs, c.to)
			if d.From.LastSeq != a.LastSeq || d.To.LastSeq != b.LastSeq || d.From.Status != string(a.Status()) || d.To.Status != string(b.Status()) ||
				d.From.Events != a.Events || d.To.Events != b.Events {
				t.Errorf("points %+v -> %+v; the folds: seq %d %s (%d events) -> seq %d %s (%d events)", d.From, d.To, a.LastSeq, a.Status(), a.Events, b.LastSeq, b.Status(), b.Events)
			}
			// Turns ended: in flight (or not started) in the first fold,
			// ended in the second.
			var wantEnded, gotEnded []string
			for _, tn := range b.Turns {
				if before := a.Turn(tn.ID); tn.Ended() && (before == nil || !before.Ended()) {
					wantEnded = append(wantEnded, tn.ID+" "+string(tn.Status))
				}
			}
			for _, tn := range d.TurnsEnded {
				gotEnded = append(gotEnded, tn.ID+" "+tn.After)
			}
			// Tool calls answered: not answered in the first fold, answered
			// (or repaired) in the second.
			answered := func(s *projections.Session, id string) bool {
				tc := s.ToolCall(id)
				return tc != nil && (tc.Status == projections.ToolAnswered || tc.Status == projections.ToolRepaired)
			}
			var wantAnswered, gotAnswered []string
			for _, tc := range b.ToolCalls {
				if answered(b, tc.ToolUseID) && !answered(a, tc.ToolUseID) {
					wantAnswered = append(wantAnswered, tc.ToolUseID)
				}
			}
			for _, tc := range d.ToolCallsAnswered {
				gotAnswered = append(gotAnswered, tc.ToolUseID)
			}
			if !slices.Equal(sorted(gotEnded), sorted(wantEnded)) || (len(wantEnded) > 0) != c.wantEnded {
				t.Errorf("turns ended %v, the folds say %v", gotEnded, wantEnded)
			}
			if !slices.Equal(sorted(gotAnswered), sorted(wantAnswered)) || (len(wantAnswered) > 0) != c.wantAnswered {
				t.Errorf("tool calls answered %v, the folds say %v", gotAnswered, wantAnswered)
			}
			if d.MessagesAdded != b.Totals.Messages-a.Totals.Messages || d.MessagesAdded == 0 {
				t.Errorf("messages added %d, the folds say %d", d.MessagesAdded, b.Totals.Messages-a.Totals.Messages)
			}
			if d.RaisedCount != b.Totals.Violations-a.Totals.Violations || d.RaisedCount != c.wantRaised || len(d.Raised) != c.wantRaised ||
				d.ResolvedCount != b.Totals.Resolved-a.Totals.Resolved {
				t.Errorf("violations raised %d (%d listed), resolved %d; the folds say %d and %d", d.RaisedCount, len(d.Raised), d.ResolvedCount,
					b.Totals.Violations-a.Totals.Violations, b.Totals.Resolved-a.Totals.Resolved)
			}
			for _, v := range d.Raised {
				if v.Seq <= a.LastSeq || v.Seq > b.LastSeq {
					t.Errorf("violation raised at seq %d, outside %d..%d", v.Seq, a.LastSeq, b.LastSeq)
				}
			}
			if c.wantRaised > 0 && (len(d.Orphans) != c.wantRaised || d.From.Orphans != 0 || d.To.Orphans != c.wantRaised) {
				t.Errorf("orphans %+v, open %d -> %d", d.Orphans, d.From.Orphans, d.To.Orphans)
			}
			if distilled := slices.ContainsFunc(d.Distillations, func(x forensics.DistillChange) bool { return x.Step == "completed" }); distilled != c.wantDistilled {
				t.Errorf("distillations %+v", d.Distillations)
			}
			// The text form names the same changes.
			text := run(t, srv.ClientURL(), args...)
			if !strings.Contains(text, "TURNS ENDED") || (c.wantRaised > 0 && !strings.Contains(text, "tool_use_without_result")) {
				t.Errorf("engine diff text:\n%s", text)
			}
		})
	}
	// A range backwards is refused, saying why.
	if _, errOut, err := runErr(srv.ClientURL(), "diff", "real/258c7280", "--from", "900", "--to", "800"); err == nil || !strings.Contains(errOut, "--from is after --to") {
		t.Errorf("a backwards range: %v %s", err, errOut)
	}
}
