package presence_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/presence"
	"github.com/turnstone-dev/turnstone/recovery"
)

// announce registers a micro service as a runtime would, claiming tenant
// and sessions, and (when answer) answers the tenant's control subjects.
func announce(t *testing.T, nc *nats.Conn, tenant, sessions string, answer bool) func() {
	t.Helper()
	svc, err := micro.AddService(nc, micro.Config{Name: recovery.PresenceService, Version: "0.1.0",
		Metadata: map[string]string{recovery.PresenceMetaTenant: tenant, recovery.PresenceMetaSessions: sessions}})
	if err != nil {
		t.Fatal(err)
	}
	var sub *nats.Subscription
	if answer {
		sub, err = nc.Subscribe(recovery.ControlSubject(tenant, "*"), func(m *nats.Msg) {
			b, _ := json.Marshal(recovery.ControlReply{Outcome: recovery.ReplyOK})
			_ = m.Respond(b)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() {
		_ = svc.Stop()
		if sub != nil {
			_ = sub.Unsubscribe()
		}
		_ = nc.Flush()
	}
}

func TestTrackerBelievesOnlyRuntimesThatAnswerTheirTenant(t *testing.T) {
	srv := embeddedtest.Start(t)
	engine, _ := embeddedtest.Connect(t, srv)
	acmeNC, _ := embeddedtest.Connect(t, srv)
	impostorNC, _ := embeddedtest.Connect(t, srv)

	var changes []string
	tr, err := presence.New(engine, presence.Config{Wait: 200 * time.Millisecond, Interval: time.Hour,
		OnChange: func(tenant string, present bool) {
			if present {
				changes = append(changes, "+"+tenant)
			} else {
				changes = append(changes, "-"+tenant)
			}
		}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	stopAcme := announce(t, acmeNC, "acme", "chat-", true)
	stopImpostor := announce(t, impostorNC, "globex", "*", false) // claims globex, cannot answer it
	tr.Round(ctx)
	for _, c := range []struct {
		tenant, session string
		want            bool
	}{
		{"acme", "chat-1", true},
		{"acme", "batch-1", false}, // not among the sessions it claims
		{"globex", "s1", false},    // claimed, never verified
		{"initech", "s1", false},
	} {
		if got := tr.Present(c.tenant, c.session); got != c.want {
			t.Errorf("Present(%s, %s) = %v, want %v", c.tenant, c.session, got, c.want)
		}
	}
	rs := tr.Runtimes()
	if len(rs) != 2 || rs[0].Tenant != "acme" || !rs[0].Verified || rs[1].Tenant != "globex" || rs[1].Verified {
		t.Fatalf("runtimes %+v", rs)
	}

	stopAcme()
	stopImpostor()
	tr.Round(ctx)
	if tr.Present("acme", "chat-1") {
		t.Fatal("acme present after its runtime left")
	}
	// A runtime without a micro service is found for a watched tenant.
	sub, err := acmeNC.Subscribe(recovery.ControlSubject("initech", "*"), func(m *nats.Msg) { _ = m.Respond([]byte(`{"outcome":"rejected"}`)) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = acmeNC.Flush()
	tr.Watch("initech")
	tr.Round(ctx)
	if !tr.Present("initech", "anything") {
		t.Fatal("a watched tenant whose runtime answers is not present")
	}
	if got, want := len(changes), 3; got != want || changes[0] != "+acme" || changes[1] != "-acme" || changes[2] != "+initech" {
		t.Fatalf("changes %v, want [+acme -acme +initech]", changes)
	}
}

// TestClaimsAndAnswers: a runtime's answer to the presence ping may claim
// the turns it works on (recovery.PresenceReply): Claimed says when, for
// those turns only, while the runtime is present; AnsweredAt is when the
// ping it answered was sent, after a time taken before the round; a
// runtime gone (no responders) claims nothing and answered nothing, at
// once.
func TestClaimsAndAnswers(t *testing.T) {
	srv := embeddedtest.Start(t)
	engine, _ := embeddedtest.Connect(t, srv)
	rtNC, _ := embeddedtest.Connect(t, srv)
	sub, err := rtNC.Subscribe(recovery.ControlSubject("acme", "*"), func(m *nats.Msg) {
		b, _ := json.Marshal(recovery.PresenceReply{ControlReply: recovery.ControlReply{Outcome: recovery.ReplyOK},
			Turns: []recovery.TurnRef{{Session: "s1", Turn: "t1"}}})
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := rtNC.Flush(); err != nil {
		t.Fatal(err)
	}
	tr, err := presence.New(engine, presence.Config{Wait: 200 * time.Millisecond, Interval: time.Hour, Tenants: []string{"acme"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	tr.Round(context.Background())
	if at := tr.Claimed("acme", "s1", "t1"); at.Before(before) {
		t.Fatalf("claimed at %s, want after %s", at, before)
	}
	if at := tr.Claimed("acme", "s1", "t2"); !at.IsZero() {
		t.Fatalf("a turn not claimed: %s", at)
	}
	if at := tr.AnsweredAt("acme", "s1"); at.Before(before) {
		t.Fatalf("answered at %s, want after %s", at, before)
	}
	_ = sub.Unsubscribe()
	_ = rtNC.Flush()
	tr.Round(context.Background())
	if at, ans := tr.Claimed("acme", "s1", "t1"), tr.AnsweredAt("acme", "s1"); !at.IsZero() || !ans.IsZero() || tr.Present("acme", "s1") {
		t.Fatalf("gone: claimed %s, answered %s, present %v", at, ans, tr.Present("acme", "s1"))
	}
}
