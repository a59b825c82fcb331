package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/claudecode"
)

// badInput is a running engine that bad input is thrown at, with a client
// that publishes raw messages (as a service in another language would) and
// one that appends through events.Log.
type badInput struct {
	eng *engineProc
	nc  *nats.Conn
	js  jetstream.JetStream
	log *events.Log
}

const badTenant = "bad"

// event builds a valid event of the bad-input tenant.
func (b *badInput) event(t testing.TB, session, turn string, p events.Payload) events.Event {
	t.Helper()
	ev, err := events.New(badTenant, session, turn, p)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func textMsg(role events.Role, s string) *events.MessageAppended {
	return &events.MessageAppended{Role: role, Content: []events.ContentBlock{{Type: events.BlockText, Text: s}}}
}

// before and after are the valid events around each bad one: a turn that
// starts, a prompt, an answer, the turn's end.
func (b *badInput) before(t testing.TB, session string) []events.Event {
	return []events.Event{
		b.event(t, session, "", &events.SessionStarted{Runtime: "harness"}),
		b.event(t, session, "t1", &events.TurnStarted{Prompt: "hello"}),
		b.event(t, session, "t1", textMsg(events.RoleUser, "hello")),
	}
}

func (b *badInput) after(t testing.TB, session string) []events.Event {
	return []events.Event{
		b.event(t, session, "t1", textMsg(events.RoleAssistant, "hi there")),
		b.event(t, session, "t1", &events.TurnCompleted{}),
	}
}

// append appends evs through the log; it must succeed.
func (b *badInput) append(t testing.TB, evs ...events.Event) []events.Ack {
	t.Helper()
	acks, err := b.log.Append(context.Background(), evs)
	if err != nil {
		t.Fatalf("append: %v", err)
	}
	return acks
}

// publish sends body to subject with a JetStream publish, with id as
// Nats-Msg-Id when it is set, as a service in another language would.
func (b *badInput) publish(subject, id string, body []byte) (*jetstream.PubAck, error) {
	m := nats.NewMsg(subject)
	m.Data = body
	if id != "" {
		m.Header.Set(jetstream.MsgIDHeader, id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5e9)
	defer cancel()
	return b.js.PublishMsg(ctx, m)
}

// publishOK is publish to the session's stored subject, as a writer with
// access to the stream (an older version, a bug in a trusted process)
// would: it must be stored, and every reader must cope with it.
// Publishers send to the wire subject instead, where the engine refuses
// bad input at the door (TestUntrustedPublishersAreRefusedAtTheDoor).
func (b *badInput) publishOK(t testing.TB, session, id string, body []byte) uint64 {
	t.Helper()
	ack, err := b.publish(b.log.SessionSubject(badTenant, session), id, body)
	if err != nil {
		t.Fatalf("raw publish to %s: %v", session, err)
	}
	return ack.Sequence
}

func encode(t testing.TB, ev events.Event) []byte {
	t.Helper()
	body, err := ev.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// replayed is one line of `engine replay --json`.
type replayed struct {
	Seq       uint64 `json:"seq"`
	Type      string `json:"type"`
	ID        string `json:"id"`
	Summary   string `json:"summary"`
	Invalid   string `json:"invalid"`
	Anomalies []struct {
		Rule      string `json:"rule"`
		ToolUseID string `json:"tool_use_id"`
	} `json:"anomalies"`
}

func (r replayed) flagged(rule string) bool {
	return slices.ContainsFunc(r.Anomalies, func(a struct {
		Rule      string `json:"rule"`
		ToolUseID string `json:"tool_use_id"`
	}) bool {
		return a.Rule == rule
	})
}

// replay runs `engine replay --json` on the session and returns its lines
// by sequence.
func (b *badInput) replay(t testing.TB, session string) map[uint64]replayed {
	t.Helper()
	out, errOut, err := runErr(b.eng.url, "replay", badTenant+"/"+session, "--json")
	if err != nil {
		t.Fatalf("engine replay %s: %v\n%s", session, err, errOut)
	}
	lines := map[uint64]replayed{}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var r replayed
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("replay --json line %q: %v", l, err)
		}
		lines[r.Seq] = r
	}
	text := runOK(t, b.eng.url, "replay", badTenant+"/"+session)
	if !strings.Contains(text, "events replayed") {
		t.Errorf("replay %s does not end with its summary:\n%s", session, text)
	}
	return lines
}

// inspected is what the tests read of `engine inspect --json`.
type inspected struct {
	Tenant  string `json:"tenant"`
	Session string `json:"session"`
	Status  string `json:"status"`
	Events  int    `json:"events"`
	Turns   []struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	} `json:"turns"`
	Messages      []json.RawMessage `json:"messages"`
	InvalidEvents []struct {
		Seq   uint64 `json:"seq"`
		ID    string `json:"id"`
		Error string `json:"error"`
	} `json:"invalid_events"`
	UnknownTypes []struct {
		Type     string `json:"type"`
		Count    int    `json:"count"`
		FirstSeq uint64 `json:"first_seq"`
	} `json:"unknown_types"`
	Violations []struct {
		Seq       uint64 `json:"seq"`
		Rule      string `json:"rule"`
		ToolUseID string `json:"tool_use_id"`
	} `json:"violations"`
}

func (b *badInput) inspect(t testing.TB, session string) inspected {
	t.Helper()
	var s inspected
	if err := json.Unmarshal([]byte(runOK(t, b.eng.url, "inspect", badTenant+"/"+session, "--json")), &s); err != nil {
		t.Fatal(err)
	}
	if s.Tenant != badTenant || s.Session != session {
		t.Fatalf("inspect %s shows %s/%s", session, s.Tenant, s.Session)
	}
	return s
}

// checkKept checks that the valid events around the bad ones are kept:
// in the replay, and the turn they make completed.
func (b *badInput) checkKept(t testing.TB, session string, lines map[uint64]replayed, acks ...[]events.Ack) {
	t.Helper()
	for _, as := range acks {
		for _, a := range as {
			if l, ok := lines[a.Seq]; !ok || l.ID != a.ID || l.Invalid != "" {
				t.Errorf("%s: valid event %s (seq %d) is not replayed as it was appended: %+v", session, a.ID, a.Seq, l)
			}
		}
	}
	s := b.inspect(t, session)
	if len(s.Turns) == 0 || s.Turns[0].ID != "t1" || s.Turns[0].Status != "completed" {
		t.Errorf("%s: turns %+v, want t1 completed", session, s.Turns)
	}
}

// checkFlaggedInvalid checks that the event at seq is reported as invalid
// with its session and sequence by replay and inspect, with why contained
// in the report.
func (b *badInput) checkFlaggedInvalid(t testing.TB, session string, seq uint64, lines map[uint64]replayed, why string) {
	t.Helper()
	l, ok := lines[seq]
	switch {
	case !ok:
		t.Errorf("%s: replay does not show the bad event at seq %d", session, seq)
	case !l.flagged("invalid_event"):
		t.Errorf("%s: replay does not flag seq %d as invalid: %+v", session, seq, l)
	case !strings.Contains(l.Invalid, fmt.Sprintf("%s/%s seq %d", badTenant, session, seq)) || !strings.Contains(l.Invalid, why):
		t.Errorf("%s: replay reports seq %d as %q; want its session, sequence and %q", session, seq, l.Invalid, why)
	}
	s := b.inspect(t, session)
	if !slices.ContainsFunc(s.InvalidEvents, func(e struct {
		Seq   uint64 `json:"seq"`
		ID    string `json:"id"`
		Error string `json:"error"`
	}) bool {
		return e.Seq == seq && strings.Contains(e.Error, why)
	}) {
		t.Errorf("%s: inspect lists invalid events %+v; want seq %d (%s)", session, s.InvalidEvents, seq, why)
	}
}

// checkAlive checks that the engine still serves and its projector has
// folded past the bad input.
func (b *badInput) checkAlive(t testing.TB) {
	t.Helper()
	waitProjectorIdle(t, b.js)
	if _, errOut, err := runErr(b.eng.url, "sessions", "--tenant", badTenant); err != nil {
		t.Fatalf("the engine no longer serves: %v\n%s\nengine:\n%s", err, errOut, b.eng.out)
	}
	if out := b.eng.out.String(); strings.Contains(out, "panic") {
		t.Fatalf("the engine panicked:\n%s", out)
	}
}

func wantErr(t testing.TB, err, sentinel error, says ...string) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Errorf("got %v, want %v", err, sentinel)
		return
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
}

// TestBadInput throws each kind of bad input at a running engine, raw
// (js.Publish to agent.evt.<tenant>.<session>) and through
// events.Log.Append: the write path refuses what it can tell is wrong,
// with an error naming the field or the limit; what reaches the log is
// kept and reported by `engine replay` and `engine inspect` with its
// session and sequence; the valid events around it are kept; and the
// engine neither crashes nor stops folding.
func TestBadInput(t *testing.T) {
	skipShort(t, "runs an engine process over every bad input")
	parallel(t)
	eng := startEngine(t, t.TempDir(), "--sync", "1s")
	nc, js, log := connectJS(t, eng.url)
	b := &badInput{eng: eng, nc: nc, js: js, log: log}
	ctx := context.Background()

	t.Run("malformed JSON", func(t *testing.T) {
		const session = "malformed"
		broken := b.event(t, session, "t1", textMsg(events.RoleUser, "x"))
		broken.Data = json.RawMessage(`{"role":"user","content":[`)
		_, err := b.log.Append(ctx, []events.Event{broken})
		wantErr(t, err, events.ErrInvalid, `"data"`)

		pre := b.append(t, b.before(t, session)...)
		id := events.NewID()
		seq := b.publishOK(t, session, id, []byte(`{"specversion":"1.0","id":"`+id+`","type":"message.appended","data":{"role":`))
		post := b.append(t, b.after(t, session)...)
		lines := b.replay(t, session)
		b.checkFlaggedInvalid(t, session, seq, lines, "malformed event")
		b.checkKept(t, session, lines, pre, post)
		b.checkAlive(t)
	})

	t.Run("wrong field types", func(t *testing.T) {
		const session = "types"
		bad := b.event(t, session, "t1", &events.TurnStageCompleted{Stage: events.StageContext})
		bad.Data = json.RawMessage(`{"stage":7,"duration_ms":"fast"}`)
		_, err := b.log.Append(ctx, []events.Event{bad})
		wantErr(t, err, events.ErrInvalid, `"data"`, "stage")

		pre := b.append(t, b.before(t, session)...)
		payload := b.event(t, session, "t1", &events.TurnStageCompleted{Stage: events.StageContext})
		payload.Data = json.RawMessage(`{"stage":"context","duration_ms":"fast"}`)
		seqPayload := b.publishOK(t, session, payload.ID, encode(t, payload))
		env := b.event(t, session, "t1", &events.TurnStageCompleted{Stage: events.StageHistory})
		body := bytes.Replace(encode(t, env), []byte(`"time":"`), []byte(`"time":12345,"x":"`), 1)
		seqEnvelope := b.publishOK(t, session, env.ID, body)
		post := b.append(t, b.after(t, session)...)
		lines := b.replay(t, session)
		b.checkFlaggedInvalid(t, session, seqPayload, lines, "duration_ms")
		b.checkFlaggedInvalid(t, session, seqEnvelope, lines, "malformed event")
		b.checkKept(t, session, lines, pre, post)
		b.checkAlive(t)
	})

	t.Run("unknown event types", func(t *testing.T) {
		const session = "unknown"
		pre := b.append(t, b.before(t, session)...)
		thought := b.event(t, session, "t1", textMsg(events.RoleAssistant, "x"))
		thought.Type, thought.Data = "agent.thought", json.RawMessage(`{"text":"let me think","tokens":12}`)
		viaAppend := b.append(t, thought)
		plan := b.event(t, session, "t1", textMsg(events.RoleAssistant, "x"))
		plan.Type, plan.Data = "agent.plan.v2", json.RawMessage(`{"steps":[{"n":1}]}`)
		seqRaw := b.publishOK(t, session, plan.ID, encode(t, plan))
		post := b.append(t, b.after(t, session)...)

		lines := b.replay(t, session)
		for _, seq := range []uint64{viaAppend[0].Seq, seqRaw} {
			l := lines[seq]
			if l.Invalid != "" || len(l.Anomalies) != 0 || !strings.Contains(l.Summary, "unknown event type") {
				t.Errorf("unknown type at seq %d replayed as %+v; want kept, named unknown, not flagged", seq, l)
			}
		}
		s := b.inspect(t, session)
		if len(s.UnknownTypes) != 2 || s.UnknownTypes[0].Type != "agent.thought" || s.UnknownTypes[0].FirstSeq != viaAppend[0].Seq ||
			s.UnknownTypes[1].Type != "agent.plan.v2" || s.UnknownTypes[1].FirstSeq != seqRaw {
			t.Errorf("unknown_types %+v; want agent.thought at %d and agent.plan.v2 at %d", s.UnknownTypes, viaAppend[0].Seq, seqRaw)
		}
		if len(s.Violations) != 0 || len(s.InvalidEvents) != 0 || s.Status != "idle" {
			t.Errorf("unknown types are flagged as anomalies: status %s, violations %+v, invalid %+v", s.Status, s.Violations, s.InvalidEvents)
		}
		b.checkKept(t, session, lines, pre, post)
		b.checkAlive(t)
	})

	t.Run("events out of order", func(t *testing.T) {
		const session = "order"
		pre := b.append(t, b.before(t, session)...)
		pre = append(pre, b.append(t, b.event(t, session, "t1", textMsg(events.RoleAssistant, "let me look")))...)
		result := func() *events.MessageAppended {
			return &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{
				{Type: events.BlockToolResult, ToolUseID: "toolu_X", Content: json.RawMessage(`"file.go"`)},
			}}
		}
		early := b.event(t, session, "t1", result())
		seqEarly := b.publishOK(t, session, early.ID, encode(t, early)) // the result before its tool_use
		mid := b.append(t,
			b.event(t, session, "t1", &events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{
				{Type: events.BlockToolUse, ID: "toolu_X", Name: "Glob", Input: json.RawMessage(`{}`)},
			}}),
			b.event(t, session, "t1", result()),
		)
		post := b.append(t, b.after(t, session)...)

		lines := b.replay(t, session)
		if l := lines[seqEarly]; !l.flagged("tool_result_without_tool_use") || l.Invalid != "" {
			t.Errorf("the early tool_result (seq %d) replayed as %+v; want flagged tool_result_without_tool_use", seqEarly, l)
		}
		s := b.inspect(t, session)
		for _, v := range s.Violations {
			if v.Seq != seqEarly {
				t.Errorf("violation %+v; want only the early tool_result's (seq %d)", v, seqEarly)
			}
		}
		if len(s.Violations) == 0 {
			t.Errorf("inspect shows no violation for the early tool_result (seq %d)", seqEarly)
		}
		b.checkKept(t, session, lines, pre, mid, post)
		b.checkAlive(t)
	})

	t.Run("duplicated ids", func(t *testing.T) {
		const session = "dups"
		pre := b.append(t, b.before(t, session)...)
		stored := tenantLog(t, b.log, badTenant)[session]
		retry, err := b.log.Append(ctx, stored)
		if err != nil {
			t.Fatalf("append the stored events again: %v", err)
		}
		for i, a := range retry {
			if !a.Duplicate || a.Seq != pre[i].Seq {
				t.Errorf("re-append of %s: %+v; want a duplicate of seq %d", a.ID, a, pre[i].Seq)
			}
		}
		for i, ev := range stored {
			ack, err := b.publish(events.EventSubject(badTenant, session), ev.ID, encode(t, ev))
			if err != nil || !ack.Duplicate || ack.Sequence != pre[i].Seq {
				t.Errorf("raw re-publish of %s with its Nats-Msg-Id: %+v, %v; want a duplicate of seq %d", ev.ID, ack, err, pre[i].Seq)
			}
		}
		// The same event twice in one call.
		twice := b.event(t, session, "t1", textMsg(events.RoleUser, "and again"))
		both := b.append(t, twice, twice)
		if both[0].Duplicate || !both[1].Duplicate || both[1].Seq != both[0].Seq {
			t.Errorf("one event twice in one append: acks %+v; want the second a duplicate of the first", both)
		}
		post := b.append(t, b.after(t, session)...)
		got := tenantLog(t, b.log, badTenant)[session]
		if len(got) != len(pre)+1+len(post) {
			t.Errorf("the session holds %d events, want %d", len(got), len(pre)+1+len(post))
		}
		checkNoDuplicateIDs(t, map[string][]events.Event{session: got})
		lines := b.replay(t, session)
		b.checkKept(t, session, lines, pre, both[:1], post)
		if s := b.inspect(t, session); len(s.Violations) != 0 || len(s.Messages) != 2 {
			t.Errorf("after re-sends: %d messages, violations %+v; want the 2 messages once, none", len(s.Messages), s.Violations)
		}
		b.checkAlive(t)
	})

	t.Run("oversized payloads", func(t *testing.T) {
		const session = "big"
		pre := b.append(t, b.before(t, session)...)
		huge := b.event(t, session, "t1", textMsg(events.RoleAssistant, strings.Repeat("y", 2<<20)))
		_, err := b.log.Append(ctx, []events.Event{huge})
		wantErr(t, err, events.ErrTooLarge, fmt.Sprint(events.DefaultMaxEventBytes))
		before := streamMsgs(b.js)
		// Over the stream's limit (1 MiB), under the server's max payload.
		big := b.event(t, session, "t1", textMsg(events.RoleAssistant, strings.Repeat("y", 3<<19)))
		if _, err := b.publish(events.EventSubject(badTenant, session), big.ID, encode(t, big)); err == nil {
			t.Error("a raw publish of 1.5 MiB was stored; the stream's limit is 1 MiB")
		} else {
			t.Logf("raw publish of 1.5 MiB: %v", err)
		}
		// Over the server's max payload.
		if _, err := b.publish(events.EventSubject(badTenant, session), huge.ID, bytes.Repeat([]byte("z"), 9<<20)); !errors.Is(err, nats.ErrMaxPayload) {
			t.Errorf("raw publish of 9 MiB: %v; want %v", err, nats.ErrMaxPayload)
		}
		if after := streamMsgs(b.js); after != before {
			t.Errorf("the stream grew from %d to %d messages on refused publishes", before, after)
		}
		post := b.append(t, b.after(t, session)...)
		b.checkKept(t, session, b.replay(t, session), pre, post)
		b.checkAlive(t)
	})

	t.Run("invalid subject tokens", func(t *testing.T) {
		const session = "tokens"
		for _, c := range []struct {
			field string
			mod   func(*events.Event)
		}{
			{"tenant", func(ev *events.Event) { ev.Tenant = "a.b" }},
			{"tenant", func(ev *events.Event) { ev.Tenant = strings.Repeat("t", events.MaxTokenLen+1) }},
			{"session", func(ev *events.Event) { ev.Session = "s*" }},
			{"session", func(ev *events.Event) { ev.Session = "" }},
			{"turn", func(ev *events.Event) { ev.Turn = "turn 1" }},
		} {
			ev := b.event(t, session, "t1", &events.TurnStarted{})
			c.mod(&ev)
			_, err := b.log.Append(ctx, []events.Event{ev})
			wantErr(t, err, events.ErrInvalid, `"`+c.field+`"`)
		}

		pre := b.append(t, b.before(t, session)...)
		before := streamMsgs(b.js)
		ev := b.event(t, session, "t1", textMsg(events.RoleUser, "x"))
		for _, subject := range []string{"agent.evt.a.b.c", "agent.evt." + badTenant, "agent.evt." + badTenant + "." + session + ".x"} {
			if _, err := b.publish(subject, ev.ID, encode(t, ev)); err == nil {
				t.Errorf("raw publish to %s was stored", subject)
			}
		}
		if after := streamMsgs(b.js); after != before {
			t.Errorf("the stream grew from %d to %d messages on publishes to invalid subjects", before, after)
		}
		// A body that names another session than its subject.
		other := b.event(t, "elsewhere", "t1", textMsg(events.RoleUser, "x"))
		seq := b.publishOK(t, session, other.ID, encode(t, other))
		post := b.append(t, b.after(t, session)...)
		lines := b.replay(t, session)
		b.checkFlaggedInvalid(t, session, seq, lines, "body names "+badTenant+"/elsewhere")
		b.checkKept(t, session, lines, pre, post)
		b.checkAlive(t)
	})

	t.Run("transcript with corrupt lines", func(t *testing.T) {
		src := filepath.Join(transcriptsDir, "spotter", "short.jsonl")
		raw, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
		if len(lines) < 10 {
			t.Fatalf("%s has %d lines", src, len(lines))
		}
		lines[2] = lines[2][:len(lines[2])/2]                                          // line 3: cut mid-record
		lines = slices.Insert(lines, 6, `not json at all`, `{"type":"user","uuid":7}`) // lines 7 and 8
		file := filepath.Join(t.TempDir(), "corrupt.jsonl")
		if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, errOut, err := runErr(b.eng.url, "import", "--format", "claude-code", "--tenant", "corrupt", "--quiet", file)
		if err != nil {
			t.Fatalf("import of a transcript with corrupt lines failed: %v\n%s", err, errOut)
		}
		for _, n := range []int{3, 7, 8} {
			if !strings.Contains(errOut, fmt.Sprintf("%s:%d:", file, n)) {
				t.Errorf("import does not report %s:%d:\n%s", file, n, errOut)
			}
		}
		if !strings.Contains(out, "3 lines skipped") {
			t.Errorf("import report: %s", out)
		}
		want, err := claudecode.ConvertFile(file, claudecode.Options{Tenant: "corrupt"})
		if err != nil {
			t.Fatal(err)
		}
		clean, err := claudecode.ConvertFile(src, claudecode.Options{Tenant: "corrupt"})
		if err != nil {
			t.Fatal(err)
		}
		if want.EventCount() < clean.EventCount()*3/4 {
			t.Errorf("3 corrupt lines cost %d of %d events", clean.EventCount()-want.EventCount(), clean.EventCount())
		}
		got := tenantLog(t, b.log, "corrupt")
		checkImportedOnce(t, want.Sessions, got)
		session := want.Sessions[0].Session
		var s inspected
		if err := json.Unmarshal([]byte(runOK(t, b.eng.url, "inspect", "corrupt/"+session, "--json")), &s); err != nil {
			t.Fatal(err)
		}
		if len(s.Turns) == 0 || len(s.InvalidEvents) != 0 {
			t.Errorf("imported session: %d turns, invalid events %+v", len(s.Turns), s.InvalidEvents)
		}
		b.checkAlive(t)
	})
	eng.stop(t)
}
