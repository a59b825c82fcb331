package test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
	"github.com/turnstone-dev/turnstone/refruntime"
)

// attempt runs act on a fresh connection of user and returns the
// server's permission violation, if the server refused it; otherwise
// act's own error (nil when it worked). A refused publish or
// subscription is an asynchronous -ERR from the server: it is caught by
// the connection's error handler, or by LastError after a flush (the
// server answers in order, so the -ERR arrives before the PONG).
func attempt(t *testing.T, e *authEnv, user string, act func(ctx context.Context, nc *nats.Conn) error) error {
	t.Helper()
	errs := make(chan error, 8)
	nc := e.srv.Connect(t, user, nats.Name("turnstone-attempt "+user), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- act(ctx, nc) }()
	select {
	case err := <-errs:
		return err
	case err := <-done:
		if ferr := nc.Flush(); ferr != nil && err == nil {
			err = ferr
		}
		if last := nc.LastError(); errors.Is(last, nats.ErrPermissionViolation) {
			return last
		}
		return err
	}
}

func pub(subject string) func(context.Context, *nats.Conn) error {
	return func(_ context.Context, nc *nats.Conn) error { return nc.Publish(subject, []byte(`{"forged":true}`)) }
}

func sub(subject string) func(context.Context, *nats.Conn) error {
	return func(_ context.Context, nc *nats.Conn) error {
		_, err := nc.SubscribeSync(subject)
		return err
	}
}

func withJS(fn func(ctx context.Context, js jetstream.JetStream) error) func(context.Context, *nats.Conn) error {
	return func(ctx context.Context, nc *nats.Conn) error {
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		return fn(ctx, js)
	}
}

func ingestRead(tenant, session string) func(context.Context, *nats.Conn) error {
	return func(ctx context.Context, nc *nats.Conn) error {
		c, err := ingest.NewClient(nc, ingest.ClientConfig{RetryFor: -1})
		if err != nil {
			return err
		}
		return c.ReadSession(ctx, tenant, session, events.ReadOptions{}, func(events.Event) error { return nil })
	}
}

func ingestAppend(tenant, session string) func(context.Context, *nats.Conn) error {
	return func(ctx context.Context, nc *nats.Conn) error {
		c, err := ingest.NewClient(nc, ingest.ClientConfig{RetryFor: -1})
		if err != nil {
			return err
		}
		ev, err := events.New(tenant, session, "", &events.SessionStarted{})
		if err != nil {
			return err
		}
		_, err = c.Append(ctx, []events.Event{ev})
		return err
	}
}

// TestAuthDenialTable is issue 8's attack list, one row per action: each
// role on real connections to a server enforcing the generated
// configuration is refused every forbidden action with the server's
// permissions violation, and can do what its role needs. Afterwards the
// victim's session and the streams are as they were.
func TestAuthDenialTable(t *testing.T) {
	parallel(t)
	e := startAuthEnv(t)
	ctx := context.Background()

	// The victim: globex has a session with events, through its own
	// credentials and the engine's ingest.
	if err := attempt(t, e, "globex", ingestAppend("globex", "victim")); err != nil {
		t.Fatalf("globex appends its own event: %v\n%s", err, e.srv)
	}
	victimBefore := countEvents(t, e, "globex", "victim")
	evSubject := e.opLog.SessionSubject("globex", "victim")
	ownSubject := e.opLog.SessionSubject("acme", "mine")
	projector := projections.ProjectorConsumerName("", 0)

	rows := []struct {
		name   string
		user   string
		act    func(context.Context, *nats.Conn) error
		denied bool
	}{
		// tenant acme against globex and against Turnstone's own state
		{"tenant publishes into another tenant's session (ingest)", "acme", ingestAppend("globex", "victim"), true},
		{"tenant publishes a raw event on another tenant's ingest subject", "acme", pub(events.EventSubject("globex", "victim")), true},
		{"tenant publishes straight to a stored subject of another tenant", "acme", pub(evSubject), true},
		{"tenant publishes straight to its own stored subject (skipping validation and masking)", "acme", pub(ownSubject), true},
		{"tenant reads another tenant's session (ingest read)", "acme", ingestRead("globex", "victim"), true},
		{"tenant subscribes to another tenant's stored events", "acme", sub(events.EventSubjectPrefix + ".*.globex.*"), true},
		{"tenant subscribes to every tenant's events", "acme", sub(events.EventSubjectPrefix + ".>"), true},
		{"tenant intercepts another tenant's appends", "acme", sub(events.EventSubject("globex", "*")), true},
		{"tenant direct-gets from the event stream", "acme", withJS(func(ctx context.Context, js jetstream.JetStream) error {
			s, err := js.Stream(ctx, events.EventsStream)
			if err != nil {
				return err
			}
			_, err = s.GetLastMsgForSubject(ctx, evSubject)
			return err
		}), true},
		{"tenant creates a consumer on the event stream", "acme", withJS(func(ctx context.Context, js jetstream.JetStream) error {
			_, err := js.OrderedConsumer(ctx, events.EventsStream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{evSubject}})
			if err != nil {
				return err
			}
			return nil
		}), true},
		{"tenant publishes a recovery command for another tenant", "acme", pub(recovery.CommandSubjectPrefix + ".globex.victim"), true},
		{"tenant publishes a recovery command for itself", "acme", pub(recovery.CommandSubjectPrefix + ".acme.mine"), true},
		{"tenant answers another tenant's control requests", "acme", sub(recovery.ControlSubjectPrefix + ".globex.>"), true},
		{"tenant writes a snapshot", "acme", pub(events.SnapshotSubject("globex", "victim")), true},
		{"tenant writes its own snapshot", "acme", pub(events.SnapshotSubject("acme", "mine")), true},
		{"tenant writes a command status (KV)", "acme", pub("$KV." + recovery.StatusBucket + ".forged"), true},
		{"tenant writes the session index (KV)", "acme", pub("$KV." + projections.IndexBucket + ".forged"), true},
		{"tenant deletes the event stream", "acme", withJS(func(ctx context.Context, js jetstream.JetStream) error {
			return js.DeleteStream(ctx, events.EventsStream)
		}), true},
		{"tenant sets max_msgs_per_subject=1 on the log", "acme", pub("$JS.API.STREAM.UPDATE." + events.EventsStream), true},
		{"tenant purges the recovery stream", "acme", pub("$JS.API.STREAM.PURGE." + recovery.Stream), true},
		// what the tenant needs
		{"tenant appends to its own session", "acme", ingestAppend("acme", "mine"), false},
		{"tenant reads its own session", "acme", ingestRead("acme", "mine"), false},
		{"tenant follows its own stored events", "acme", sub(events.EventSubjectPrefix + ".*.acme.*"), false},
		{"tenant answers its own control requests", "acme", sub(recovery.ControlSubjectPrefix + ".acme.>"), false},

		// engine
		{"engine deletes the event stream", "engine", withJS(func(ctx context.Context, js jetstream.JetStream) error {
			return js.DeleteStream(ctx, events.EventsStream)
		}), true},
		{"engine changes the event stream", "engine", withJS(func(ctx context.Context, js jetstream.JetStream) error {
			s, err := js.Stream(ctx, events.EventsStream)
			if err != nil {
				return err
			}
			cfg := s.CachedInfo().Config
			cfg.MaxMsgsPerSubject = 1
			_, err = js.UpdateStream(ctx, cfg)
			return err
		}), true},
		{"engine purges the event stream", "engine", pub("$JS.API.STREAM.PURGE." + events.EventsStream), true},
		{"engine deletes a projector consumer", "engine", pub("$JS.API.CONSUMER.DELETE." + events.EventsStream + "." + projector), true},
		{"engine overwrites a projector consumer", "engine", pub("$JS.API.CONSUMER.CREATE." + events.EventsStream + "." + projector), true},
		{"engine writes a command status (worker's)", "engine", pub("$KV." + recovery.StatusBucket + ".forged"), true},
		{"engine answers a tenant's control requests", "engine", sub(recovery.ControlSubjectPrefix + ".acme.>"), true},
		{"engine reads the event stream", "engine", withJS(func(ctx context.Context, js jetstream.JetStream) error {
			s, err := js.Stream(ctx, events.EventsStream)
			if err != nil {
				return err
			}
			_, err = s.GetLastMsgForSubject(ctx, evSubject)
			return err
		}), false},

		// worker
		{"worker deletes the recovery stream", "worker", withJS(func(ctx context.Context, js jetstream.JetStream) error {
			return js.DeleteStream(ctx, recovery.Stream)
		}), true},
		{"worker writes a snapshot (engine's)", "worker", pub(events.SnapshotSubject("acme", "mine")), true},
		{"worker writes the session index (engine's)", "worker", pub("$KV." + projections.IndexBucket + ".forged"), true},
		{"worker intercepts a tenant's appends", "worker", sub(events.EventSubject("acme", "*")), true},
		{"worker purges the event stream", "worker", pub("$JS.API.STREAM.PURGE." + events.EventsStream), true},
		{"worker reads command statuses", "worker", withJS(func(ctx context.Context, js jetstream.JetStream) error {
			_, err := js.KeyValue(ctx, recovery.StatusBucket)
			return err
		}), false},

		// operator
		{"operator reads every tenant", "operator", sub(events.EventSubjectPrefix + ".>"), false},
		{"operator creates and deletes a stream", "operator", withJS(func(ctx context.Context, js jetstream.JetStream) error {
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SCRATCH", Subjects: []string{"scratch.>"}, Storage: jetstream.MemoryStorage}); err != nil {
				return err
			}
			return js.DeleteStream(ctx, "SCRATCH")
		}), false},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			err := attempt(t, e, r.user, r.act)
			switch {
			case r.denied && !errors.Is(err, nats.ErrPermissionViolation):
				t.Fatalf("%s: want the server's permissions violation, got %v", r.user, err)
			case !r.denied && err != nil:
				t.Fatalf("%s: want allowed, got %v\n%s", r.user, err, e.srv)
			}
		})
	}

	// Nothing stored: the victim's session is as it was and the log kept
	// its settings.
	if n := countEvents(t, e, "globex", "victim"); n != victimBefore {
		t.Fatalf("globex/victim: %d events before the attacks, %d after", victimBefore, n)
	}
	s, err := e.opJS.Stream(ctx, events.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := s.CachedInfo().Config; cfg.MaxMsgsPerSubject != -1 && cfg.MaxMsgsPerSubject != 0 {
		t.Fatalf("event stream changed: max_msgs_per_subject %d", cfg.MaxMsgsPerSubject)
	}
	if _, err := e.opJS.Stream(ctx, recovery.Stream); err != nil {
		t.Fatalf("recovery stream: %v", err)
	}
}

// TestAuthRolesRunATurn: under auth, a turn of acme's runtime goes
// through the engine's ingest into the log, the engine projects it, and
// no role needed a subject its permissions deny.
func TestAuthRolesRunATurn(t *testing.T) {
	parallel(t)
	e := startAuthEnv(t)
	ctx := context.Background()
	res, err := e.rt.RunTurn(ctx, "turn-1", refruntime.TurnSpec{Tools: []refruntime.ToolSpec{{Name: "Read"}}})
	if err != nil {
		t.Fatalf("run a turn under auth: %v\n%s", err, e.srv)
	}
	s, err := projections.Restore(ctx, e.opLog, nil, "acme", "turn-1")
	if err != nil {
		t.Fatal(err)
	}
	if s.InFlightTurn() != nil || len(s.OrphanedToolUseIDs()) != 0 || countEvents(t, e, "acme", "turn-1") < 4 {
		t.Fatalf("turn %s: in flight %v, orphans %v", res.Turn, s.InFlight, s.OrphanedToolUseIDs())
	}
	if v := e.srv.Violations(); len(v) > 0 {
		t.Fatalf("permission violations:\n%s", strings.Join(v, "\n"))
	}
}

func countEvents(t *testing.T, e *authEnv, tenant, session string) int {
	t.Helper()
	n := 0
	err := e.opLog.ReadSession(context.Background(), tenant, session, events.ReadOptions{}, func(events.Event) error {
		n++
		return nil
	})
	if err != nil && !errors.Is(err, events.ErrSessionNotFound) {
		t.Fatal(fmt.Errorf("read %s/%s: %w", tenant, session, err))
	}
	return n
}
