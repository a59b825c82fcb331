package refruntime_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/recovery"
	"github.com/turnstone-dev/turnstone/refruntime"
)

const tenant = "acme"

// env is one embedded server with an event log, a runtime on one
// connection and a requester (a worker's stand-in) on another.
type env struct {
	log       *events.Log
	rt        *refruntime.Runtime
	nc        *nats.Conn // the runtime's connection
	requester *nats.Conn
	open      func(mod ...func(*refruntime.Config)) *refruntime.Runtime
}

// setup starts a server, opens the log and returns a runtime (not opened
// for control requests) for tenant acme with providers anthropic,
// bedrock, vertex; mod changes its Config. Everything stops in
// t.Cleanup.
func setup(t *testing.T, mod ...func(*refruntime.Config)) *env {
	t.Helper()
	srv := embeddedtest.Start(t)
	nc, js := embeddedtest.Connect(t, srv)
	requester, _ := embeddedtest.Connect(t, srv)
	log, err := events.Open(ctx(t), js, events.Config{}, nil)
	if err != nil {
		t.Fatalf("open log: %v", err)
	}
	e := &env{log: log, nc: nc, requester: requester}
	e.open = func(mod ...func(*refruntime.Config)) *refruntime.Runtime {
		t.Helper()
		cfg := refruntime.Config{Tenant: tenant, Providers: []string{"anthropic", "bedrock", "vertex"}}
		for _, m := range mod {
			m(&cfg)
		}
		rt, err := refruntime.New(nc, log, cfg, nil)
		if err != nil {
			t.Fatalf("new runtime: %v", err)
		}
		t.Cleanup(func() {
			c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := rt.Close(c); err != nil {
				t.Errorf("close runtime: %v", err)
			}
		})
		return rt
	}
	e.rt = e.open(mod...)
	return e
}

// ctx returns a context bounded to 30 s, cancelled when the test ends.
func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// read returns the session's events, failing the test on any event that
// does not validate.
func (e *env) read(t *testing.T, session string) []events.Event {
	t.Helper()
	var evs []events.Event
	err := e.log.ReadSession(ctx(t), tenant, session, events.ReadOptions{}, func(ev events.Event) error {
		if ev.Err != nil {
			t.Errorf("seq %d: %v", ev.Seq, ev.Err)
		}
		if err := events.Validate(&ev); err != nil {
			t.Errorf("seq %d %s: %v", ev.Seq, ev.Type, err)
		}
		evs = append(evs, ev)
		return nil
	})
	if err != nil {
		t.Fatalf("read session %s: %v", session, err)
	}
	return evs
}

// run runs a turn and fails the test on an error.
func (e *env) run(t *testing.T, session string, spec refruntime.TurnSpec) refruntime.TurnResult {
	t.Helper()
	res, err := e.rt.RunTurn(ctx(t), session, spec)
	if err != nil {
		t.Fatalf("run turn: %v", err)
	}
	return res
}

// request sends a control request for session as a worker would and
// returns the reply or the request's error.
func (e *env) request(t *testing.T, session string, req recovery.ControlRequest, timeout time.Duration) (recovery.ControlReply, error) {
	t.Helper()
	req.Tenant, req.Session = tenant, session
	if req.CommandID == "" {
		req.CommandID = req.Action + "-" + events.NewID()
	}
	if req.Attempt == 0 {
		req.Attempt = 1
	}
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := e.requester.Request(recovery.ControlSubject(tenant, session), body, timeout)
	if err != nil {
		return recovery.ControlReply{}, err
	}
	var reply recovery.ControlReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		t.Fatalf("reply %q: %v", msg.Data, err)
	}
	return reply, nil
}

// ask is request with a 10 s timeout that fails the test on an error.
func (e *env) ask(t *testing.T, session, action string, params recovery.Params) recovery.ControlReply {
	t.Helper()
	reply, err := e.request(t, session, recovery.ControlRequest{Action: action, Params: params}, 10*time.Second)
	if err != nil {
		t.Fatalf("%s request: %v", action, err)
	}
	return reply
}

// types lists the events' types.
func types(evs []events.Event) []events.Type {
	ts := make([]events.Type, len(evs))
	for i, ev := range evs {
		ts[i] = ev.Type
	}
	return ts
}

// decode returns the event's payload as a T, failing the test otherwise.
func decode[T events.Payload](t *testing.T, ev events.Event) T {
	t.Helper()
	p, err := ev.Payload()
	if err != nil {
		t.Fatalf("seq %d: %v", ev.Seq, err)
	}
	v, ok := p.(T)
	if !ok {
		t.Fatalf("seq %d: payload %T is not %T", ev.Seq, p, v)
	}
	return v
}

// ofType returns the events of type ty, in order.
func ofType(evs []events.Event, ty events.Type) []events.Event {
	var out []events.Event
	for _, ev := range evs {
		if ev.Type == ty {
			out = append(out, ev)
		}
	}
	return out
}

// isNoResponders reports whether err is NATS's no-responders error.
func isNoResponders(err error) bool { return errors.Is(err, nats.ErrNoResponders) }
