package events_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/events"
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
	if _, err := events.Open(context.Background(), js, events.Config{}, nil); err != nil {
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
			f, err := js.PublishAsync(events.EventSubject(evs[j].Tenant, evs[j].Session), bodies[j], jetstream.WithMsgID(evs[j].ID))
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
