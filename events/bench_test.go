package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
)

// benchSessions spreads the benchmark's events over this many sessions.
const benchSessions = 1000

// benchEvents builds n events of about 500 bytes encoded, round-robin over
// benchSessions sessions.
func benchEvents(b *testing.B, n int) []events.Event {
	b.Helper()
	text := strings.Repeat("the quick brown fox jumps over the lazy dog ", 7)
	evs := make([]events.Event, n)
	for i := range evs {
		e, err := events.New("bench", fmt.Sprintf("s%d", i%benchSessions), "", &events.MessageAppended{
			Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockText, Text: text}},
		})
		if err != nil {
			b.Fatal(err)
		}
		evs[i] = e
	}
	return evs
}

// BenchmarkAppend measures Log.Append (validation, masking, encoding,
// Nats-Msg-Id dedup) in batches of 100 against an embedded server with file
// storage, beside BenchmarkRawPublish, which sends the same bytes with raw
// JetStream async publish. Compare events/s of the two from one run.
func BenchmarkAppend(b *testing.B) {
	srv := embeddedtest.Start(b)
	_, js := embeddedtest.Connect(b, srv)
	l, err := events.Open(context.Background(), js, events.Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	evs := benchEvents(b, b.N)
	ctx := context.Background()
	b.SetBytes(500)
	b.ResetTimer()
	for i := 0; i < len(evs); i += 100 {
		end := min(i+100, len(evs))
		if _, err := l.Append(ctx, evs[i:end]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkRawPublish is the baseline for BenchmarkAppend: the same encoded
// events published with JetStream async publish and a Nats-Msg-Id, 100 in
// flight at a time, to the same stream.
func BenchmarkRawPublish(b *testing.B) {
	srv := embeddedtest.Start(b)
	_, js := embeddedtest.Connect(b, srv)
	log, err := events.Open(context.Background(), js, events.Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	evs := benchEvents(b, b.N)
	bodies := make([][]byte, len(evs))
	for i := range evs {
		bodies[i], _ = evs[i].Encode()
	}
	b.SetBytes(500)
	b.ResetTimer()
	for i := 0; i < len(evs); i += 100 {
		end := min(i+100, len(evs))
		futures := make([]jetstream.PubAckFuture, 0, 100)
		for j := i; j < end; j++ {
			f, err := js.PublishAsync(log.SessionSubject(evs[j].Tenant, evs[j].Session), bodies[j], jetstream.WithMsgID(evs[j].ID))
			if err != nil {
				b.Fatal(err)
			}
			futures = append(futures, f)
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// prepareEvents are the events BenchmarkValidate, BenchmarkMask and
// BenchmarkEncode work on: about 500 bytes each, of a turn's shapes (a
// prompt, a tool_use, a tool_result, an answer), one in four with a word
// that passes the masking prefilter ("token", "through") and no secret,
// as in the shipped Claude Code transcripts.
func prepareEvents(b *testing.B) []events.Event {
	b.Helper()
	clean := strings.Repeat("The handler returns early when the request has no body, so the counter is never updated. ", 5)
	needle := "Let me check how the retry loop refreshes the token before it calls the API again. " + clean
	var evs []events.Event
	for i := 0; i < 64; i++ {
		text := clean
		if i%4 == 0 {
			text = needle
		}
		text = text[:400]
		var p events.Payload
		switch i % 4 {
		case 0:
			p = &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockText, Text: text}}}
		case 1:
			in, _ := json.Marshal(map[string]string{"command": "go test ./...", "description": text})
			p = &events.MessageAppended{Role: events.RoleAssistant, Model: "claude-sonnet-4-5", Content: []events.ContentBlock{{Type: events.BlockToolUse, ID: "toolu_01", Name: "Bash", Input: in}}}
		case 2:
			c, _ := json.Marshal(text)
			p = &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockToolResult, ToolUseID: "toolu_01", Content: c}}}
		default:
			p = &events.TurnStarted{Prompt: text, Trigger: "user"}
		}
		e, err := events.New("bench", fmt.Sprintf("s%d", i), "t1", p)
		if err != nil {
			b.Fatal(err)
		}
		evs = append(evs, e)
	}
	return evs
}

// BenchmarkValidate, BenchmarkMask and BenchmarkEncode time the steps
// Log.Append runs on each event before it publishes it.
func BenchmarkValidate(b *testing.B) {
	evs := prepareEvents(b)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := events.Validate(&evs[i%len(evs)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

func BenchmarkMask(b *testing.B) {
	evs := prepareEvents(b)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		ev := evs[i%len(evs)]
		events.Mask(&ev)
		i++
	}
}

// BenchmarkMaskSecrets is BenchmarkMask on events one in four of which
// holds secrets that must be masked (a tool result with an env dump, a
// bearer header and a URL with a password), the slow path: decoding the
// data, masking it and encoding it again.
func BenchmarkMaskSecrets(b *testing.B) {
	evs := prepareEvents(b)
	secret := "HOME=/root\nDB_PASSWORD=hunter2\ncurl -H 'Authorization: Bearer abcdefgh12345678' https://bot:pw@api.example.com/v1\n"
	for i := 2; i < len(evs); i += 4 {
		c, _ := json.Marshal(secret + strings.Repeat("ok ", 100))
		e, err := events.New("bench", fmt.Sprintf("s%d", i), "t1", &events.MessageAppended{Role: events.RoleUser,
			Content: []events.ContentBlock{{Type: events.BlockToolResult, ToolUseID: "toolu_01", Content: c}}})
		if err != nil {
			b.Fatal(err)
		}
		evs[i] = e
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		ev := evs[i%len(evs)]
		events.Mask(&ev)
		i++
	}
}

func BenchmarkEncode(b *testing.B) {
	evs := prepareEvents(b)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := evs[i%len(evs)].Encode(); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkDecodeStored times what a reader of the log runs on each stored
// body (DecodeStored: the envelope, the contract's checks and the typed
// payload, decoded once), on the bodies Log.Append stores for the events
// of prepareEvents.
func BenchmarkDecodeStored(b *testing.B) {
	evs := prepareEvents(b)
	bodies := make([][]byte, len(evs))
	subjects := make([]string, len(evs))
	for i := range evs {
		ev := evs[i]
		if err := events.Validate(&ev); err != nil {
			b.Fatal(err)
		}
		events.Mask(&ev)
		body, err := ev.Encode()
		if err != nil {
			b.Fatal(err)
		}
		bodies[i], subjects[i] = body, events.StoredEventSubject(1, ev.Tenant, ev.Session)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := i % len(bodies)
		ev := events.DecodeStored(subjects[k], uint64(i+1), bodies[k])
		if ev.Err != nil {
			b.Fatal(ev.Err)
		}
		if _, err := ev.Payload(); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
