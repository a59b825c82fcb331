package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
)

func openLog(t *testing.T, cfg events.Config) (*events.Log, jetstream.JetStream) {
	t.Helper()
	s := embeddedtest.Start(t)
	_, js := embeddedtest.Connect(t, s)
	l, err := events.Open(context.Background(), js, cfg, nil)
	if err != nil {
		t.Fatalf("open log: %v", err)
	}
	return l, js
}

func ev(t *testing.T, tenant, session, turn string, p events.Payload) events.Event {
	t.Helper()
	e, err := events.New(tenant, session, turn, p)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func readAll(t *testing.T, l *events.Log, tenant, session string, opts events.ReadOptions) []events.Event {
	t.Helper()
	var out []events.Event
	if err := l.ReadSession(context.Background(), tenant, session, opts, func(e events.Event) error {
		out = append(out, e)
		return nil
	}); err != nil {
		t.Fatalf("read %s/%s: %v", tenant, session, err)
	}
	return out
}

func TestOpenIsIdempotentAndKeepsPartitions(t *testing.T) {
	t.Parallel()
	s := embeddedtest.Start(t)
	_, js := embeddedtest.Connect(t, s)
	ctx := context.Background()
	l1, err := events.Open(ctx, js, events.Config{Partitions: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatalf("second open: %v", err)
	}
	if l1.Partitions() != 4 || l2.Partitions() != 4 {
		t.Fatalf("partitions %d, %d; want 4 and the existing 4", l1.Partitions(), l2.Partitions())
	}
	if _, err := events.Open(ctx, js, events.Config{Partitions: 8}, nil); err == nil || !strings.Contains(err.Error(), "fixed") {
		t.Fatalf("changing the partition count: want an error, got %v", err)
	}
	st, err := js.Stream(ctx, events.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	c := st.CachedInfo().Config
	if !c.DenyDelete || c.DenyPurge || c.Storage != jetstream.FileStorage || c.Duplicates != events.DefaultDuplicateWindow {
		t.Fatalf("stream config: %+v", c)
	}
	// Deleting one event is denied to everyone; purge (erasure) is left
	// to NATS permissions, which give it to the operator only.
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.LastSeq > 0 {
		if err := st.DeleteMsg(ctx, info.State.LastSeq); err == nil {
			t.Fatal("message delete allowed on the event stream")
		}
	}
	if _, err := js.Stream(ctx, events.SnapshotsStream); err != nil {
		t.Fatalf("snapshot stream: %v", err)
	}
}

func TestAppendStoresUnderPartitionedSubject(t *testing.T) {
	t.Parallel()
	l, js := openLog(t, events.Config{Partitions: 16})
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		session := fmt.Sprintf("s%d", i)
		acks, err := l.Append(ctx, []events.Event{ev(t, "acme", session, "", &events.SessionStarted{})})
		if err != nil {
			t.Fatal(err)
		}
		st, _ := js.Stream(ctx, events.EventsStream)
		msg, err := st.GetMsg(ctx, acks[0].Seq)
		if err != nil {
			t.Fatal(err)
		}
		if want := l.SessionSubject("acme", session); msg.Subject != want {
			t.Fatalf("stored under %s; Partition() computes %s", msg.Subject, want)
		}
	}
}

func TestAppendDedupsRepeatedID(t *testing.T) {
	t.Parallel()
	l, _ := openLog(t, events.Config{})
	ctx := context.Background()
	e := ev(t, "acme", "s1", "", &events.SessionStarted{Runtime: "r"})
	first, err := l.Append(ctx, []events.Event{e})
	if err != nil {
		t.Fatal(err)
	}
	again, err := l.Append(ctx, []events.Event{e})
	if err != nil {
		t.Fatal(err)
	}
	if !again[0].Duplicate || again[0].Seq != first[0].Seq {
		t.Fatalf("second append: %+v, want duplicate of seq %d", again[0], first[0].Seq)
	}
	if got := readAll(t, l, "acme", "s1", events.ReadOptions{}); len(got) != 1 {
		t.Fatalf("stored %d events, want 1", len(got))
	}
}

func TestAppendConflictOnStaleExpectedSequence(t *testing.T) {
	t.Parallel()
	l, _ := openLog(t, events.Config{})
	ctx := context.Background()
	acks, err := l.Append(ctx, []events.Event{ev(t, "acme", "s1", "", &events.SessionStarted{})}, events.ExpectLastSeq(0))
	if err != nil {
		t.Fatalf("first conditional append: %v", err)
	}
	read := acks[0].Seq
	// Another writer appends after our read.
	if _, err := l.Append(ctx, []events.Event{ev(t, "acme", "s1", "t1", &events.TurnStarted{})}); err != nil {
		t.Fatal(err)
	}
	_, err = l.Append(ctx, []events.Event{ev(t, "acme", "s1", "", &events.DistillationRequested{})}, events.ExpectLastSeq(read))
	if !errors.Is(err, events.ErrConflict) {
		t.Fatalf("stale expected sequence: want ErrConflict, got %v", err)
	}
	last, err := l.LastSeq(ctx, "acme", "s1")
	if err != nil {
		t.Fatal(err)
	}
	// Re-read and decide again: succeeds, and chains through a batch.
	acks, err = l.Append(ctx, []events.Event{
		ev(t, "acme", "s1", "t1", &events.TurnStageCompleted{Stage: events.StageContext}),
		ev(t, "acme", "s1", "t1", &events.TurnCompleted{}),
	}, events.ExpectLastSeq(last))
	if err != nil || len(acks) != 2 || acks[1].Seq <= acks[0].Seq {
		t.Fatalf("fresh expected sequence: acks %+v, err %v", acks, err)
	}
	if _, err := l.Append(ctx, []events.Event{ev(t, "acme", "other", "", &events.SessionStarted{})}, events.ExpectLastSeq(0)); err != nil {
		t.Fatalf("expected sequence is per session: %v", err)
	}
}

func TestAppendRejectsInvalidAndOversizedBeforeSending(t *testing.T) {
	t.Parallel()
	l, _ := openLog(t, events.Config{MaxEventBytes: 4096})
	ctx := context.Background()
	good := ev(t, "acme", "s1", "", &events.SessionStarted{})
	bad := ev(t, "acme", "s1", "", &events.TurnStarted{}) // no turn
	big := ev(t, "acme", "s1", "t1", &events.TurnStarted{Prompt: strings.Repeat("x", 5000)})
	_, err := l.Append(ctx, []events.Event{good, bad, big})
	if !errors.Is(err, events.ErrInvalid) || !errors.Is(err, events.ErrTooLarge) {
		t.Fatalf("want ErrInvalid and ErrTooLarge, got %v", err)
	}
	var ee *events.EventError
	if !errors.As(err, &ee) || ee.Session != "s1" {
		t.Fatalf("error does not name the session: %v", err)
	}
	if !strings.Contains(err.Error(), "4096") {
		t.Fatalf("error does not name the limit: %v", err)
	}
	if _, err := l.LastSeq(ctx, "acme", "s1"); !errors.Is(err, events.ErrSessionNotFound) {
		t.Fatalf("a rejected batch stored something: %v", err)
	}
}

// TestAppendMasksSecrets appends secrets of every form the masker knows
// in a tool_result, a tool_use input, an error's message and stack, and the
// envelope's source, and reads the stored bytes back raw: none is there.
func TestAppendMasksSecrets(t *testing.T) {
	t.Parallel()
	l, js := openLog(t, events.Config{})
	ctx := context.Background()
	// Each secret is a distinct marker, in one of the forms.
	forms := map[string]string{
		"hunter2":              "POST https://bot:hunter2@api.example.com failed",
		"abcdefgh12345678":     "401 for Bearer abcdefgh12345678",
		"AKIAIOSFODNN7EXAMPLE": "at call (key AKIAIOSFODNN7EXAMPLE)",
		"pw-colon-1":           "password: pw-colon-1",
		"pw-json-2":            `{"password":"pw-json-2"}`,
		"dXNlcjpodW50ZXIz":     "Authorization: Basic dXNlcjpodW50ZXIz",
		"SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c": "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c",
		"MIIEpAIBAAKCAQEA1c7":                         "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA1c7\nQ0ZrW4mUv8gYk\n-----END RSA PRIVATE KEY-----",
		"wJalrXUtnFEMIK7MDENG":                        "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMIK7MDENG",
		"db-pass-4":                                   "export DB_PASSWORD='db-pass-4'",
		"gh-env-5":                                    "GITHUB_TOKEN=gh-env-5",
		"sk_live_51H8aBcDeFgHiJkLmNoPq":               "charge with sk_live_51H8aBcDeFgHiJkLmNoPq",
		"glpat-aBcDeFgHiJkLmNoPqRsT":                  "git clone with glpat-aBcDeFgHiJkLmNoPqRsT",
		"xoxb-2048-1024-aBcDeFgHiJkLmNoPqRsT":         "slack xoxb-2048-1024-aBcDeFgHiJkLmNoPqRsT",
		"cookie-6":                                    "Cookie: session=cookie-6; theme=dark",
		"sk-ant-api03-AbCdEf0123456789":               "using sk-ant-api03-AbCdEf0123456789",
	}
	var text []string
	for _, f := range forms {
		text = append(text, f)
	}
	all := strings.Join(text, "\n")
	input, _ := json.Marshal(map[string]any{"command": "deploy", "env": map[string]string{"OPENAI_API_KEY": "env-key-7"}, "sk-ant-api03-KeyAsKey0123456": 1})
	content, _ := json.Marshal(all)
	msgs := []events.Event{
		ev(t, "acme", "s1", "", &events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{
			{Type: events.BlockToolUse, ID: "toolu_1", Name: "Bash", Input: input}}}),
		ev(t, "acme", "s1", "", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{
			{Type: events.BlockToolResult, ToolUseID: "toolu_1", Content: content}}}),
		ev(t, "acme", "s1", "", &events.ErrorRecorded{ErrorInfo: events.ErrorInfo{Message: all, Stack: all, Kind: events.KindLogic}}),
	}
	msgs[2].Source = "https://agent:src-pass-8@agents.example.com/x?token=src-token-9"
	acks, err := l.Append(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	secrets := []string{"env-key-7", "KeyAsKey0123456", "src-pass-8", "src-token-9"}
	for s := range forms {
		secrets = append(secrets, s)
	}
	st, err := js.Stream(ctx, events.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range acks {
		raw, err := st.GetMsg(ctx, a.Seq)
		if err != nil {
			t.Fatal(err)
		}
		for _, secret := range secrets {
			if strings.Contains(string(raw.Data), secret) {
				t.Errorf("secret %q reached the log: %s", secret, raw.Data)
			}
		}
	}
	got := readAll(t, l, "acme", "s1", events.ReadOptions{})
	if len(got) != 3 || got[2].Source != "https://agent:[REDACTED]@agents.example.com/x?token=[REDACTED]" {
		t.Fatalf("read back %d events, source %q", len(got), got[len(got)-1].Source)
	}
	for _, e := range got {
		if e.Err != nil {
			t.Errorf("stored event is invalid: %v", e.Err)
		}
	}
}

func TestReadBySequenceAndTime(t *testing.T) {
	t.Parallel()
	l, _ := openLog(t, events.Config{})
	ctx := context.Background()
	var seqs []uint64
	var mid time.Time
	for i := 0; i < 10; i++ {
		if i == 5 {
			time.Sleep(50 * time.Millisecond)
			mid = time.Now()
			time.Sleep(50 * time.Millisecond)
		}
		// Interleave another session so sequences are not contiguous.
		if _, err := l.Append(ctx, []events.Event{ev(t, "acme", "noise", "", &events.SessionResumed{})}); err != nil {
			t.Fatal(err)
		}
		acks, err := l.Append(ctx, []events.Event{ev(t, "acme", "s1", "t", &events.TurnStageCompleted{Stage: events.StageExecute, DurationMS: int64(i)})})
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, acks[0].Seq)
	}
	all := readAll(t, l, "acme", "s1", events.ReadOptions{})
	if len(all) != 10 {
		t.Fatalf("read %d events, want 10", len(all))
	}
	for i, e := range all {
		if e.Seq != seqs[i] || e.Session != "s1" || e.Err != nil {
			t.Fatalf("event %d: seq %d session %s err %v; want seq %d", i, e.Seq, e.Session, e.Err, seqs[i])
		}
	}
	from := readAll(t, l, "acme", "s1", events.ReadOptions{FromSeq: seqs[3]})
	if len(from) != 7 || from[0].Seq != seqs[3] {
		t.Fatalf("from seq %d: got %d events starting %d", seqs[3], len(from), from[0].Seq)
	}
	until := readAll(t, l, "acme", "s1", events.ReadOptions{UntilSeq: seqs[2]})
	if len(until) != 3 {
		t.Fatalf("until seq: got %d events, want 3", len(until))
	}
	byTime := readAll(t, l, "acme", "s1", events.ReadOptions{FromTime: mid})
	if len(byTime) != 5 || byTime[0].Seq != seqs[5] {
		t.Fatalf("from time: got %d events, want 5 starting at %d", len(byTime), seqs[5])
	}
	future := readAll(t, l, "acme", "s1", events.ReadOptions{FromTime: time.Now().Add(time.Hour)})
	if len(future) != 0 {
		t.Fatalf("from a future time: got %d events", len(future))
	}
	if err := l.ReadSession(ctx, "acme", "missing", events.ReadOptions{}, func(events.Event) error { return nil }); !errors.Is(err, events.ErrSessionNotFound) {
		t.Fatalf("missing session: want ErrSessionNotFound, got %v", err)
	}
}

func TestReadReportsInvalidStoredEventsAndKeepsTheRest(t *testing.T) {
	t.Parallel()
	l, js := openLog(t, events.Config{})
	ctx := context.Background()
	if _, err := l.Append(ctx, []events.Event{ev(t, "acme", "s1", "", &events.SessionStarted{})}); err != nil {
		t.Fatal(err)
	}
	// A writer with access to the stored subjects stores garbage.
	for _, body := range []string{`{"specversion":"1.0",`, `{"specversion":"1.0","type":"turn.started"}`} {
		if _, err := js.Publish(ctx, l.SessionSubject("acme", "s1"), []byte(body), jetstream.WithMsgID(nats.NewInbox())); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Append(ctx, []events.Event{ev(t, "acme", "s1", "t1", &events.TurnStarted{})}); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, l, "acme", "s1", events.ReadOptions{})
	if len(got) != 4 {
		t.Fatalf("read %d events, want 4 (2 valid, 2 invalid)", len(got))
	}
	for i, want := range []bool{false, true, true, false} {
		if (got[i].Err != nil) != want {
			t.Fatalf("event %d: Err = %v, want invalid=%v", i, got[i].Err, want)
		}
	}
	var ee *events.EventError
	if !errors.As(got[1].Err, &ee) || ee.Seq != got[1].Seq || ee.Session != "s1" || ee.Tenant != "acme" {
		t.Fatalf("invalid event error does not name session and sequence: %v", got[1].Err)
	}
}

func TestSessionsAndReadAll(t *testing.T) {
	t.Parallel()
	l, _ := openLog(t, events.Config{})
	ctx := context.Background()
	for _, s := range []string{"b", "a", "c"} {
		for i := 0; i < 3; i++ {
			if _, err := l.Append(ctx, []events.Event{ev(t, "acme", s, "", &events.SessionResumed{})}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := l.Append(ctx, []events.Event{ev(t, "other", "z", "", &events.SessionResumed{})}); err != nil {
		t.Fatal(err)
	}
	refs, err := l.Sessions(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range refs {
		names = append(names, fmt.Sprintf("%s/%s:%d", r.Tenant, r.Session, r.Events))
	}
	if got := strings.Join(names, " "); got != "acme/a:3 acme/b:3 acme/c:3 other/z:1" {
		t.Fatalf("sessions = %s", got)
	}
	refs, _ = l.Sessions(ctx, "other")
	if len(refs) != 1 {
		t.Fatalf("tenant filter: %v", refs)
	}
	n := 0
	var prev uint64
	if err := l.ReadAll(ctx, events.ReadOptions{}, func(e events.Event) error {
		if e.Seq <= prev {
			t.Fatalf("out of order: %d after %d", e.Seq, prev)
		}
		prev = e.Seq
		n++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n != 10 {
		t.Fatalf("ReadAll delivered %d events, want 10", n)
	}
}

// ReadAll hands events to fn in batches (64 at a time): every count
// around a batch's edge is delivered whole and in order, and fn's error
// stops the read at the event that returned it, even mid-batch.
func TestReadAllAcrossBatchEdges(t *testing.T) {
	t.Parallel()
	l, _ := openLog(t, events.Config{})
	ctx := context.Background()
	stored := 0
	for _, want := range []int{1, 63, 64, 65, 128, 129, 300} {
		var batch []events.Event
		for ; stored < want; stored++ {
			batch = append(batch, ev(t, "acme", fmt.Sprintf("s%d", stored%7), "", &events.SessionResumed{}))
		}
		if len(batch) > 0 {
			if _, err := l.Append(ctx, batch); err != nil {
				t.Fatal(err)
			}
		}
		n := 0
		var prev uint64
		if err := l.ReadAll(ctx, events.ReadOptions{}, func(e events.Event) error {
			if e.Seq <= prev || e.Err != nil {
				t.Fatalf("%d stored: event %d is seq %d after %d (%v)", want, n, e.Seq, prev, e.Err)
			}
			prev = e.Seq
			n++
			return nil
		}); err != nil || n != want {
			t.Fatalf("%d stored: ReadAll delivered %d, %v", want, n, err)
		}
	}
	stop := errors.New("enough")
	for _, at := range []int{1, 64, 70, 300} {
		n := 0
		err := l.ReadAll(ctx, events.ReadOptions{}, func(events.Event) error {
			if n++; n == at {
				return stop
			}
			return nil
		})
		if !errors.Is(err, stop) || n != at {
			t.Fatalf("fn stops at %d: called %d times, ReadAll = %v", at, n, err)
		}
	}
}

func TestFollowDeliversStoredThenNewEvents(t *testing.T) {
	t.Parallel()
	l, _ := openLog(t, events.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := l.Append(ctx, []events.Event{ev(t, "acme", "s1", "", &events.SessionStarted{})}); err != nil {
		t.Fatal(err)
	}
	got := make(chan events.Event, 16)
	f, err := l.Follow(ctx, events.FollowOptions{Tenant: "acme", Session: "s1"}, func(e events.Event) { got <- e })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(ctx, []events.Event{
		ev(t, "acme", "other", "", &events.SessionStarted{}),
		ev(t, "acme", "s1", "t1", &events.TurnStarted{}),
	}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []events.Type{events.TypeSessionStarted, events.TypeTurnStarted} {
		select {
		case e := <-got:
			if e.Type != want || e.Session != "s1" {
				t.Fatalf("event %d: %s %s, want %s of s1", i, e.Type, e.Session, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("event %d not delivered", i)
		}
	}
	cancel()
	select {
	case <-f.Closed():
	case <-time.After(5 * time.Second):
		t.Fatal("follower did not stop when its context ended")
	}
}

func TestReadSpansManyBatches(t *testing.T) {
	t.Parallel()
	l, _ := openLog(t, events.Config{})
	ctx := context.Background()
	var batch []events.Event
	var want []string
	for i := 0; i < 1300; i++ {
		e := ev(t, "acme", "long", "", &events.SessionResumed{Reason: fmt.Sprint(i)})
		want = append(want, e.ID)
		batch = append(batch, e, ev(t, "acme", "other", "", &events.SessionResumed{}))
	}
	if _, err := l.Append(ctx, batch); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, l, "acme", "long", events.ReadOptions{})
	if len(got) != len(want) {
		t.Fatalf("read %d events, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].ID != want[i] {
			t.Fatalf("event %d out of order", i)
		}
	}
	tail := readAll(t, l, "acme", "long", events.ReadOptions{FromSeq: got[1000].Seq, UntilSeq: got[1200].Seq})
	if len(tail) != 201 || tail[0].ID != want[1000] || tail[200].ID != want[1200] {
		t.Fatalf("range read: %d events", len(tail))
	}
}

// TestReadDeliversWhatWasStoredWhenItStarted checks the end of a read:
// ReadSession and ReadAll deliver the events stored when they started,
// not those appended while they run (the first batch's count, the
// stream's last sequence), across several batches; a read from after a
// session's last event delivers nothing and is no error.
func TestReadDeliversWhatWasStoredWhenItStarted(t *testing.T) {
	t.Parallel()
	l, _ := openLog(t, events.Config{})
	ctx := context.Background()
	var batch []events.Event
	for i := 0; i < 700; i++ {
		batch = append(batch, ev(t, "acme", "s1", "", &events.SessionResumed{Reason: fmt.Sprint(i)}))
	}
	acks, err := l.Append(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	last := acks[len(acks)-1].Seq
	appendOne := func() {
		if _, err := l.Append(ctx, []events.Event{ev(t, "acme", "s1", "", &events.SessionResumed{Reason: "late"})}); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	if err := l.ReadSession(ctx, "acme", "s1", events.ReadOptions{}, func(e events.Event) error {
		if n++; n%100 == 1 {
			appendOne()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n != 700 {
		t.Fatalf("ReadSession delivered %d events, want the 700 stored when it started", n)
	}
	total := 700 + 7
	n = 0
	if err := l.ReadAll(ctx, events.ReadOptions{}, func(e events.Event) error {
		if n++; n%100 == 1 {
			appendOne()
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n != total {
		t.Fatalf("ReadAll delivered %d events, want the %d stored when it started", n, total)
	}
	if got := readAll(t, l, "acme", "s1", events.ReadOptions{FromSeq: last + 1000}); len(got) != 0 {
		t.Fatalf("a read after the last event delivered %d", len(got))
	}
	n = 0
	if err := l.ReadAll(ctx, events.ReadOptions{FromSeq: last - 9, UntilSeq: last}, func(events.Event) error { n++; return nil }); err != nil || n != 10 {
		t.Fatalf("ReadAll of a range: %d events, %v; want 10", n, err)
	}
}

func TestOpenWithoutSettingsKeepsTheStreams(t *testing.T) {
	t.Parallel()
	s := embeddedtest.Start(t)
	_, js := embeddedtest.Connect(t, s)
	ctx := context.Background()
	if _, err := events.Open(ctx, js, events.Config{MaxBytes: 1 << 30, DuplicateWindow: time.Minute, MaxEventBytes: 2 << 20}, nil); err != nil {
		t.Fatal(err)
	}
	// A client opening with no settings (the CLI, a worker) adopts them.
	l, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := js.Stream(ctx, events.EventsStream)
	c := st.CachedInfo().Config
	if c.MaxBytes != 1<<30 || c.Duplicates != time.Minute || c.MaxMsgSize != 2<<20+events.HeaderAllowance || l.Config().MaxEventBytes != 2<<20 {
		t.Fatalf("a client open changed the stream: %+v", c)
	}
}

func TestAppendRefusesAnEventMaskingWouldBreak(t *testing.T) {
	t.Parallel()
	l, _ := openLog(t, events.Config{})
	e := ev(t, "acme", "chat-1", "", &events.SessionStarted{Kind: "subagent", ParentSession: "sk-proj-abcdefghijklmnop"})
	if _, err := l.Append(context.Background(), []events.Event{e}); !errors.Is(err, events.ErrInvalid) {
		t.Fatalf("want ErrInvalid (the masked parent_session is no token), got %v", err)
	}
}

// TestPrepareBodyStoresCleanBodiesAsSent: a publisher's body with nothing
// to mask is stored byte for byte; one with a secret anywhere (data,
// source, a member the contract does not know) is masked and re-encoded,
// and an invalid one is refused.
func TestPrepareBodyStoresCleanBodiesAsSent(t *testing.T) {
	t.Parallel()
	l, _ := openLog(t, events.Config{})
	const head = `{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"turn.started","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"s1","turn":"t1",`
	for _, tt := range []struct {
		name, body string
		asSent     bool
		gone       string // a secret the stored body must not hold
	}{
		{"clean", head + `"source":"urn:service:bot","data":{"prompt":"hi there, the token count is 5"}}`, true, ""},
		{"clean, spaced, unknown member", head + `"source":"urn:service:bot", "x-extra": "ok", "data": {"prompt":"hi"}}`, true, ""},
		{"secret in data", head + `"source":"urn:service:bot","data":{"prompt":"password: hunter2"}}`, false, "hunter2"},
		{"secret in source", head + `"source":"https://a:pw1234@h/x","data":{"prompt":"hi"}}`, false, "pw1234"},
		{"secret in an unknown member", head + `"source":"urn:service:bot","note":"GITHUB_TOKEN=ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789","data":{"prompt":"hi"}}`, false, "ghp_aBcDeF"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e, err := events.Decode([]byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			m, err := l.PrepareBody(e, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if got := string(m.Data) == tt.body; got != tt.asSent {
				t.Fatalf("stored as sent: %v, want %v: %s", got, tt.asSent, m.Data)
			}
			if tt.gone != "" && strings.Contains(string(m.Data), tt.gone) {
				t.Fatalf("stored %s", m.Data)
			}
			if m.Subject != l.SessionSubject("acme", "s1") || m.Header.Get("Nats-Msg-Id") != e.ID {
				t.Fatalf("message %s %v", m.Subject, m.Header)
			}
			if back := events.DecodeStored(m.Subject, 1, m.Data); back.Err != nil {
				t.Fatalf("stored body does not read back: %v", back.Err)
			}
		})
	}
	bad, _ := events.Decode([]byte(`{"specversion":"1.0","id":"01JGZ8Q0000000000000000000","type":"turn.started","source":"urn:x","time":"2026-02-19T10:00:00Z","tenant":"acme","session":"s1","data":{}}`))
	if _, err := l.PrepareBody(bad, nil); !errors.Is(err, events.ErrInvalid) {
		t.Fatalf("a turn type without its turn: %v", err)
	}
}

// TestAtomicAppendWaitsForAStreamThatAnswersNoOneYet: a conditional
// append whose commit finds no stream listening (a replicated stream just
// created, or whose leader just moved; here, the stream deleted and
// created again 300 ms later) is sent again until the stream answers, as
// nats.go's own publish does on "no responders", and stores the batch
// once. With no stream at all it fails with ErrLogUnavailable (wrapping
// nats.ErrNoResponders) within the caller's deadline.
func TestAtomicAppendWaitsForAStreamThatAnswersNoOneYet(t *testing.T) {
	t.Parallel()
	l, js := openLog(t, events.Config{})
	ctx := context.Background()
	if err := js.DeleteStream(ctx, events.EventsStream); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err := l.Append(ctx2, []events.Event{ev(t, "acme", "s1", "", &events.SessionStarted{})}, events.ExpectLastSeq(0))
	cancel()
	if !errors.Is(err, events.ErrLogUnavailable) || !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("no stream: want ErrLogUnavailable (no responders), got %v", err)
	}
	back := streamBackAfter(js, 300*time.Millisecond)
	acks, err := l.Append(ctx, []events.Event{
		ev(t, "acme", "s1", "", &events.SessionStarted{}),
		ev(t, "acme", "s1", "t1", &events.TurnStarted{}),
	}, events.ExpectLastSeq(0))
	if err := <-back; err != nil {
		t.Fatal(err)
	}
	if err != nil || len(acks) != 2 || acks[0].Seq != 1 || acks[1].Seq != 2 {
		t.Fatalf("append while the stream came back: acks %+v, err %v", acks, err)
	}
	if got := readAll(t, l, "acme", "s1", events.ReadOptions{}); len(got) != 2 {
		t.Fatalf("%d events stored, want the batch once (2)", len(got))
	}
}

// TestAppendKeepsTheOrderOfEventsSentAgain: the events of an
// unconditional Append that meet "no responders" (here the stream is gone
// and comes back 300 ms later) are sent again in the call's order, so one
// session's events are stored in the order given. nats.go's own retry
// sends each again from a timer of its own, which stored them shuffled.
func TestAppendKeepsTheOrderOfEventsSentAgain(t *testing.T) {
	t.Parallel()
	l, js := openLog(t, events.Config{})
	ctx := context.Background()
	if err := js.DeleteStream(ctx, events.EventsStream); err != nil {
		t.Fatal(err)
	}
	back := streamBackAfter(js, 300*time.Millisecond)
	evs := []events.Event{ev(t, "acme", "s1", "", &events.SessionStarted{})}
	for i := range 20 {
		turn := fmt.Sprintf("t%d", i)
		evs = append(evs, ev(t, "acme", "s1", turn, &events.TurnStarted{}), ev(t, "acme", "s1", turn, &events.TurnCompleted{}))
	}
	acks, err := l.Append(ctx, evs)
	if err := <-back; err != nil {
		t.Fatal(err)
	}
	if err != nil || len(acks) != len(evs) {
		t.Fatalf("append while the stream came back: %d acks, err %v", len(acks), err)
	}
	got := readAll(t, l, "acme", "s1", events.ReadOptions{})
	if len(got) != len(evs) {
		t.Fatalf("%d events stored, want %d", len(got), len(evs))
	}
	for i := range got {
		if got[i].ID != evs[i].ID || acks[i].Seq != got[i].Seq {
			t.Fatalf("event %d stored at position %d of the session (ack seq %d): the order given was not kept", slices.IndexFunc(evs, func(e events.Event) bool { return e.ID == got[i].ID }), i, acks[i].Seq)
		}
	}
}

// streamBackAfter creates the event stream again (events.Open) after d,
// on a goroutine of its own, and sends Open's error on the channel it
// returns: the stream's absence meanwhile is "no responders".
func streamBackAfter(js jetstream.JetStream, d time.Duration) <-chan error {
	back := make(chan error, 1)
	go func() {
		time.Sleep(d)
		_, err := events.Open(context.Background(), js, events.Config{}, nil)
		back <- err
	}()
	return back
}
