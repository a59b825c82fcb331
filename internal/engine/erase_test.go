package engine_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/audit"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/erasure"
	"github.com/turnstone-dev/turnstone/internal/otel"
	"github.com/turnstone-dev/turnstone/internal/pgroup"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// TestEraseNeedsEveryMember: a live worker that does not answer the
// notice (here a heartbeat with no process behind it) stops the erase
// before anything is purged, naming it; once it is gone, the erase runs.
func TestEraseNeedsEveryMember(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := embeddedtest.Start(t)
	nc, js := embeddedtest.Connect(t, srv)
	e := openEngine(t, nc, "e1")
	ev, _ := events.New("acme", "s1", "t1", &events.TurnStarted{Prompt: "hi"})
	if _, err := e.Log.Append(ctx, []events.Event{ev}); err != nil {
		t.Fatal(err)
	}
	kv, err := pgroup.OpenBucket(ctx, js, pgroup.DefaultBucket, false, 1, pgroup.DefaultTTL)
	if err != nil {
		t.Fatal(err)
	}
	ghost, _ := json.Marshal(pgroup.Record{Group: recovery.WorkerGroup, Member: "ghost", Started: time.Now(), Beat: time.Now()})
	if _, err := kv.Put(ctx, recovery.WorkerGroup+".ghost", ghost); err != nil {
		t.Fatal(err)
	}
	cnc, _ := embeddedtest.Connect(t, srv)
	_, err = engine.Erase(ctx, cnc, engine.EraseRequest{Scope: erasure.Scope{Tenant: "acme", Sessions: []string{"s1"}}, Reason: "test", ConfirmWait: 500 * time.Millisecond})
	if !errors.Is(err, engine.ErrNotConfirmed) || !strings.Contains(err.Error(), "workers.ghost") {
		t.Fatalf("erase with a silent member: %v", err)
	}
	if _, err := e.Log.LastSeq(ctx, "acme", "s1"); err != nil {
		t.Fatalf("the session was touched by an erase that was not confirmed: %v", err)
	}
	if e.Gate.Blocked("acme", "s1") {
		t.Fatal("the given-up erase left the session blocked")
	}
	if err := kv.Purge(ctx, recovery.WorkerGroup+".ghost"); err != nil {
		t.Fatal(err)
	}
	rec, err := engine.Erase(ctx, cnc, engine.EraseRequest{Scope: erasure.Scope{Tenant: "acme", Sessions: []string{"s1"}}, Reason: "test"})
	if err != nil || rec.Counts.Events != 1 || rec.Action != audit.ActionEraseSession {
		t.Fatalf("erase: %+v %v", rec, err)
	}
	if _, err := e.Log.LastSeq(ctx, "acme", "s1"); !errors.Is(err, events.ErrSessionNotFound) {
		t.Fatalf("after the erase: %v", err)
	}
}

// TestSetupRecordsStreamChanges: engine setup that changes an existing
// stream's settings (--update-streams) records each change in the audit
// stream; a setup that changes nothing records nothing; the audit stream
// denies delete and purge.
func TestSetupRecordsStreamChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := embeddedtest.Start(t)
	_, js := embeddedtest.Connect(t, srv)
	if _, err := engine.Setup(ctx, js, engine.SetupConfig{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Setup(ctx, js, engine.SetupConfig{}, nil); err != nil {
		t.Fatal(err)
	}
	if recs, err := audit.List(ctx, js, audit.Filter{}); err != nil || len(recs) != 0 {
		t.Fatalf("setups that changed nothing: %+v %v", recs, err)
	}
	// An operator's own edit of a stream setup writes (the quarantine's
	// size) is undone by the next setup, and recorded.
	qs, err := js.Stream(ctx, ingest.QuarantineStream)
	if err != nil {
		t.Fatal(err)
	}
	qcfg := qs.CachedInfo().Config
	edited := qcfg
	edited.MaxBytes = qcfg.MaxBytes / 2
	if _, err := js.UpdateStream(ctx, edited); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Setup(ctx, js, engine.SetupConfig{}, nil); err != nil {
		t.Fatal(err)
	}
	recs, err := audit.List(ctx, js, audit.Filter{Action: audit.ActionStreamsUpdated})
	want := fmt.Sprintf("AGENT_QUARANTINE max bytes: %d -> %d", edited.MaxBytes, qcfg.MaxBytes)
	if err != nil || len(recs) != 1 || strings.Join(recs[0].Changes, "; ") != want {
		t.Fatalf("setup over an edited quarantine: records %+v %v, want one with %q", recs, err, want)
	}
	if qs, err = js.Stream(ctx, ingest.QuarantineStream); err != nil || qs.CachedInfo().Config.MaxBytes != qcfg.MaxBytes {
		t.Fatalf("quarantine after setup: %v, max bytes not restored to %d", err, qcfg.MaxBytes)
	}
	if _, err := engine.Setup(ctx, js, engine.SetupConfig{Log: events.Config{DuplicateWindow: 10 * time.Minute, SnapshotsPerSession: 5, UpdateStreams: true}}, nil); err != nil {
		t.Fatal(err)
	}
	recs, err = audit.List(ctx, js, audit.Filter{Action: audit.ActionStreamsUpdated})
	if err != nil || len(recs) != 2 {
		t.Fatalf("records: %+v %v", recs, err)
	}
	r := recs[1]
	changes := strings.Join(r.Changes, "; ")
	if !strings.Contains(changes, "AGENT_EVENTS duplicate window: 5m0s -> 10m0s") || !strings.Contains(changes, "AGENT_SNAPSHOTS max messages per subject: 3 -> 5") ||
		r.Reason != "engine setup --update-streams" || r.Who == "" || r.Seq == 0 {
		t.Fatalf("record: %+v", r)
	}
	st, err := js.Stream(ctx, audit.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx); err == nil {
		t.Fatal("the audit stream was purged")
	}
	if err := st.DeleteMsg(ctx, r.Seq); err == nil {
		t.Fatal("an audit record was deleted")
	}
}

// TestSetupRecordsConsumerChanges: an operator's edits of the consumers
// setup writes on the event stream (one projector consumer's ack wait,
// every export consumer's max ack pending) are undone by the next setup
// and recorded, a family changed alike as one range; the single projector
// consumer of earlier versions is deleted, and that is recorded too. A
// setup that changes nothing records nothing.
func TestSetupRecordsConsumerChanges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := embeddedtest.Start(t)
	_, js := embeddedtest.Connect(t, srv)
	cfg := engine.SetupConfig{Log: events.Config{Partitions: 2}, OTelExport: true}
	for range 2 {
		if _, err := engine.Setup(ctx, js, cfg, nil); err != nil {
			t.Fatal(err)
		}
	}
	if recs, err := audit.List(ctx, js, audit.Filter{}); err != nil || len(recs) != 0 {
		t.Fatalf("setups that changed nothing: %+v %v", recs, err)
	}
	edit := func(name string, change func(*jetstream.ConsumerConfig)) jetstream.ConsumerConfig {
		t.Helper()
		c, err := js.Consumer(ctx, events.EventsStream, name)
		if err != nil {
			t.Fatal(err)
		}
		orig := c.CachedInfo().Config
		edited := orig
		change(&edited)
		if _, err := js.UpdateConsumer(ctx, events.EventsStream, edited); err != nil {
			t.Fatal(err)
		}
		return orig
	}
	proj := edit(projections.ProjectorConsumerName("", 0), func(c *jetstream.ConsumerConfig) { c.AckWait = 3 * time.Minute })
	var exp jetstream.ConsumerConfig
	for p := range 2 {
		exp = edit(otel.ConsumerName("", p), func(c *jetstream.ConsumerConfig) { c.MaxAckPending = 7 })
	}
	if _, err := js.CreateConsumer(ctx, events.EventsStream, jetstream.ConsumerConfig{Durable: projections.DefaultDurable, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	if _, err := engine.Setup(ctx, js, cfg, nil); err != nil {
		t.Fatal(err)
	}
	recs, err := audit.List(ctx, js, audit.Filter{Action: audit.ActionStreamsUpdated})
	want := []string{
		fmt.Sprintf("consumers AGENT_EVENTS %s ack-wait: 3m0s -> %s", projections.ProjectorConsumerName("", 0), proj.AckWait),
		fmt.Sprintf("consumers AGENT_EVENTS %s..%s max ack pending: 7 -> %d", otel.ConsumerName("", 0), otel.ConsumerName("", 1), exp.MaxAckPending),
		"consumer AGENT_EVENTS " + projections.DefaultDurable + " deleted (the single projector consumer of earlier versions)",
	}
	if err != nil || len(recs) != 1 || strings.Join(recs[0].Changes, "\n") != strings.Join(want, "\n") {
		t.Fatalf("setup over edited consumers: records %+v %v, want one with\n%s", recs, err, strings.Join(want, "\n"))
	}
	if c, err := js.Consumer(ctx, events.EventsStream, projections.ProjectorConsumerName("", 0)); err != nil || c.CachedInfo().Config.AckWait != proj.AckWait {
		t.Fatalf("projector consumer after setup: %v, ack wait not restored to %s", err, proj.AckWait)
	}
	if _, err := engine.Setup(ctx, js, cfg, nil); err != nil {
		t.Fatal(err)
	}
	if recs, err := audit.List(ctx, js, audit.Filter{}); err != nil || len(recs) != 1 {
		t.Fatalf("a setup that changed nothing after the edits: %d records, %v", len(recs), err)
	}
}
