package ingestserver_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
)

// rawEvent is a hand-written event body, as a client in another language
// writes it: a time with a trailing zero in its fraction (which a
// re-encode would drop), spaces, and a member the contract does not know.
func rawEvent(id, session, text string) string {
	return fmt.Sprintf(`{ "specversion": "1.0", "id": %q, "type": "message.appended", "source": "urn:agent:raw",
  "time": "2026-02-19T10:00:00.950Z", "tenant": "acme", "session": %q, "x_client": {"v": 2},
  "data": {"role": "user", "content": [{"type": "text", "text": %q}]} }`, id, session, text)
}

// TestEveryJetStreamHeaderIsHonouredOrRefused sends each JetStream
// publish header through a plain NATS request, as a client of any
// language would: every expectation docs/events.md lists is checked
// (stored when it holds, refused with JetStream's own code when not),
// every other Nats-Expected-* header and every header of a promise the
// ingest cannot keep is refused with 14005 and nothing stored, never
// ignored.
func TestEveryJetStreamHeaderIsHonouredOrRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	first := events.NewID()
	if ack := e.raw("agent.evt.acme.h1", rawEvent(first, "h1", "one"), map[string]string{"Nats-Msg-Id": first}); ack.Error != nil {
		t.Fatal(ack.Error)
	}
	last, lastID, err := e.log.LastID(ctx, "acme", "h1")
	if err != nil || lastID != first {
		t.Fatalf("last %d %q %v", last, lastID, err)
	}
	stale := strconv.FormatUint(last-1, 10)
	for _, c := range []struct {
		name   string
		hdr    map[string]string
		code   int    // 0: stored
		phrase string // in the refusal's description
	}{
		{"expected stream, right", map[string]string{"Nats-Expected-Stream": "AGENT_EVENTS"}, 0, ""},
		{"expected stream, wrong", map[string]string{"Nats-Expected-Stream": "OTHER"}, ingest.CodeStreamNotMatch, "expected stream does not match"},
		{"last subject sequence, stale", map[string]string{"Nats-Expected-Last-Subject-Sequence": stale}, ingest.CodeWrongLastSequence, "wrong last sequence"},
		{"last sequence (the session's), stale", map[string]string{"Nats-Expected-Last-Sequence": stale}, ingest.CodeWrongLastSequence, "wrong last sequence"},
		{"last msg id, wrong", map[string]string{"Nats-Expected-Last-Msg-Id": "01JGZ8Q0000000000000000000"}, ingest.CodeWrongLastMsgID, "wrong last msg ID"},
		{"the two sequences disagree", map[string]string{"Nats-Expected-Last-Sequence": "LAST", "Nats-Expected-Last-Subject-Sequence": stale}, ingest.CodeWrongLastSequence, "wrong last sequence"},
		{"last subject sequence on another subject", map[string]string{"Nats-Expected-Last-Subject-Sequence-Subject": "agent.evt.acme.other", "Nats-Expected-Last-Subject-Sequence": "0"}, ingest.CodeUnsupportedHeader, "Nats-Expected-Last-Subject-Sequence-Subject"},
		{"an expectation of a newer server", map[string]string{"Nats-Expected-Last-Counter": "3"}, ingest.CodeUnsupportedHeader, "not supported"},
		{"lower case, unknown", map[string]string{"nats-expected-anything": "x"}, ingest.CodeUnsupportedHeader, "not supported"},
		{"an atomic batch's header", map[string]string{"Nats-Batch-Id": "b1", "Nats-Batch-Sequence": "1"}, ingest.CodeUnsupportedHeader, "JSON array"},
		{"a message TTL", map[string]string{"Nats-TTL": "1s"}, ingest.CodeUnsupportedHeader, "Nats-TTL"},
		{"a rollup", map[string]string{"Nats-Rollup": "sub"}, ingest.CodeUnsupportedHeader, "Nats-Rollup"},
		{"a schedule", map[string]string{"Nats-Schedule": "@every 1s"}, ingest.CodeUnsupportedHeader, "Nats-Schedule"},
		{"last subject sequence, right", map[string]string{"Nats-Expected-Last-Subject-Sequence": "LAST"}, 0, ""},
		{"last sequence (the session's), right", map[string]string{"Nats-Expected-Last-Sequence": "LAST"}, 0, ""},
		{"last msg id, right", map[string]string{"Nats-Expected-Last-Msg-Id": "LASTID"}, 0, ""},
		{"last msg id, right, lower case", map[string]string{"nats-expected-last-msg-id": "LASTID"}, 0, ""},
		{"every expectation at once, right", map[string]string{"Nats-Expected-Stream": "AGENT_EVENTS", "Nats-Expected-Last-Msg-Id": "LASTID",
			"Nats-Expected-Last-Sequence": "LAST", "Nats-Expected-Last-Subject-Sequence": "LAST"}, 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			last, lastID, err := e.log.LastID(ctx, "acme", "h1")
			if err != nil {
				t.Fatal(err)
			}
			hdr := map[string]string{}
			for k, v := range c.hdr {
				v = strings.ReplaceAll(v, "LASTID", lastID)
				hdr[k] = strings.ReplaceAll(v, "LAST", strconv.FormatUint(last, 10))
			}
			id := events.NewID()
			ack := e.raw("agent.evt.acme.h1", rawEvent(id, "h1", c.name), hdr)
			after, afterID, _ := e.log.LastID(ctx, "acme", "h1")
			if c.code == 0 {
				if ack.Error != nil || ack.Seq == 0 || afterID != id || after != ack.Seq {
					t.Fatalf("want stored: reply %+v %+v; the session's last is %d %s", ack, ack.Error, after, afterID)
				}
				return
			}
			if ack.Error == nil || ack.Error.ErrCode != c.code || !strings.Contains(ack.Error.Description, c.phrase) {
				t.Fatalf("want error %d naming %q, got %+v", c.code, c.phrase, ack.Error)
			}
			if after != last {
				t.Fatalf("refused with %d, but the session moved from %d to %d", c.code, last, after)
			}
		})
	}
	// On an empty session an expected last msg id cannot hold; an
	// expected sequence 0 does.
	if ack := e.raw("agent.evt.acme.h2", rawEvent(events.NewID(), "h2", "x"), map[string]string{"Nats-Expected-Last-Msg-Id": first}); ack.Error == nil || ack.Error.ErrCode != ingest.CodeWrongLastMsgID {
		t.Fatalf("last msg id on an empty session: %+v", ack.Error)
	}
	if ack := e.raw("agent.evt.acme.h2", rawEvent(events.NewID(), "h2", "x"), map[string]string{"Nats-Expected-Last-Sequence": "0"}); ack.Error != nil {
		t.Fatalf("last sequence 0 on an empty session: %+v", ack.Error)
	}
}

// TestStoredByteForByteWhateverTheHeaders: an event with nothing to mask
// is stored as it was sent, with or without an expectation header; and
// the size limit is the body's: a body of exactly the limit (1 MiB) is
// stored with its headers, one byte more is refused with 10054.
func TestStoredByteForByteWhateverTheHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for i, hdr := range []map[string]string{
		nil,
		{"Nats-Expected-Last-Subject-Sequence": "PREV"},
		{"Nats-Expected-Last-Msg-Id": "PREVID", "Nats-Expected-Stream": "AGENT_EVENTS"},
	} {
		id := events.NewID()
		body := rawEvent(id, "b1", fmt.Sprintf("event %d", i))
		prev, prevID, _ := e.log.LastID(ctx, "acme", "b1")
		h := map[string]string{"Nats-Msg-Id": id}
		for k, v := range hdr {
			v = strings.ReplaceAll(v, "PREVID", prevID)
			h[k] = strings.ReplaceAll(v, "PREV", strconv.FormatUint(prev, 10))
		}
		if ack := e.raw("agent.evt.acme.b1", body, h); ack.Error != nil {
			t.Fatalf("headers %v: %+v", hdr, ack.Error)
		}
		stored := e.stored("acme", "b1")
		if got := stored[len(stored)-1].Raw; !bytes.Equal(got, []byte(body)) {
			t.Fatalf("headers %v: stored\n%s\nsent\n%s", hdr, got, body)
		}
	}

	// The limit is the body's.
	limit := e.log.Config().MaxEventBytes
	pad := func(n int) string {
		id := events.NewID()
		b := rawEvent(id, "big", "")
		return rawEvent(id, "big", strings.Repeat("a", n-len(b)))
	}
	exact := pad(limit)
	if len(exact) != limit {
		t.Fatalf("built %d bytes, want %d", len(exact), limit)
	}
	id := exact[strings.Index(exact, `"id": "`)+7:][:26]
	if ack := e.raw("agent.evt.acme.big", exact, map[string]string{"Nats-Msg-Id": id, "Nats-Expected-Last-Sequence": "0", "Nats-Expected-Stream": "AGENT_EVENTS"}); ack.Error != nil {
		t.Fatalf("a body of exactly %d bytes with headers: %+v", limit, ack.Error)
	}
	if stored := e.stored("acme", "big"); len(stored) != 1 || len(stored[0].Raw) != limit {
		t.Fatalf("stored %d events", len(stored))
	}
	// One byte over, in the encoding the log stores (compact, contract
	// order), so that no re-encode brings it under.
	var b []byte
	for n := limit - 300; len(b) != limit+1; {
		over := e.event("acme", "big", "", &events.MessageAppended{Role: "user", Content: []events.ContentBlock{{Type: "text", Text: strings.Repeat("a", n)}}})
		b, _ = over.Encode()
		n += limit + 1 - len(b)
	}
	if ack := e.raw("agent.evt.acme.big", string(b), nil); ack.Error == nil || ack.Error.ErrCode != ingest.CodeMessageTooLarge {
		t.Fatalf("a body one byte over: %+v", ack.Error)
	}
}
