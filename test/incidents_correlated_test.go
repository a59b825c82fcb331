package test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/correlate"
	"github.com/turnstone-dev/turnstone/internal/enginetest"
	"github.com/turnstone-dev/turnstone/projections"
)

// publisher writes whole sessions to the log, as a fleet of runtimes
// would have. Its sessions are marked history, so that the engine's
// reconciler leaves them alone and the recovery outcomes are the ones the
// publisher writes.
type publisher struct {
	t   *testing.T
	eng *enginetest.Engine
}

type failure struct {
	tenant, session string
	at              time.Time
	provider, model string
	err             events.ErrorInfo
	// recoveredBy, when set, is the strategy of a recovery that ended
	// recovered after the failure.
	recoveredBy string
	// orphan makes the turn die after a tool_use instead.
	orphan bool
}

func (p *publisher) publish(f failure) {
	p.t.Helper()
	var evs []events.Event
	n := 0
	add := func(turn string, pl events.Payload) {
		n++
		ev, err := events.NewAt(f.at.Add(time.Duration(n)*100*time.Millisecond), events.NewID(), f.tenant, f.session, turn, pl)
		if err != nil {
			p.t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	add("", &events.SessionStarted{Runtime: "refruntime 1.4", Model: f.model, Provider: f.provider, History: true})
	add("t1", &events.TurnStarted{Prompt: "do the thing"})
	add("t1", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "text", Text: "do the thing"}}})
	if f.orphan {
		add("t1", &events.MessageAppended{Role: events.RoleAssistant, Model: f.model, Content: []events.ContentBlock{{Type: "tool_use", ID: "toolu_" + f.session, Name: "Bash", Input: []byte(`{}`)}}})
		add("t1", &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: "runtime process exited", Kind: events.KindUnknown}})
	} else {
		add("t1", &events.ErrorRecorded{ErrorInfo: f.err, Consecutive: 1, Stage: events.StageExecute})
		add("t1", &events.TurnFailed{Stage: events.StageExecute, Error: f.err})
	}
	if f.recoveredBy != "" {
		id := "retry_turn-" + f.session
		add("", &events.RecoveryAttempted{CommandID: id, Kind: "retry_turn", Attempt: 1, Strategy: "retry", Result: "failed", Class: "overloaded"})
		add("", &events.RecoveryAttempted{CommandID: id, Kind: "retry_turn", Attempt: 2, Strategy: f.recoveredBy, Result: "ok"})
		add("", &events.RecoveryCompleted{CommandID: id, Kind: "retry_turn", Outcome: events.OutcomeRecovered, Strategy: f.recoveredBy, Attempts: 2})
	}
	if _, err := p.eng.Log.Append(context.Background(), evs); err != nil {
		p.t.Fatal(err)
	}
}

// TestIncidentsCorrelated: a test publisher fails 30 sessions of three
// tenants on one provider with 529 inside a minute, and 5 others at the
// same time with unrelated errors (a 529 of another provider, a 400, a
// 401, a 429, a crash that leaves an orphan); another provider's 503
// strikes 3 sessions twice, an hour apart. `engine incidents` shows one
// incident with the 30 sessions and its evidence, keeps the 5 apart, and
// marks the pattern seen in two windows recurring.
func TestIncidentsCorrelated(t *testing.T) {
	parallel(t)
	eng := enginetest.Start(t, enginetest.Options{})
	p := &publisher{t: t, eng: eng}
	t0 := time.Now().UTC().Add(-3 * time.Hour).Truncate(time.Minute)
	e529 := events.ErrorInfo{Message: "Overloaded", Kind: events.KindTransient, Provider: "anthropic", HTTPStatus: 529, Code: "overloaded_error"}
	var outage []string
	for i := range 30 {
		f := failure{tenant: []string{"acme", "beta", "gamma"}[i%3], session: fmt.Sprintf("outage-%02d", i), at: t0.Add(time.Duration(i*1900) * time.Millisecond),
			provider: "anthropic", model: []string{"claude-opus-4-6", "claude-sonnet-4-5"}[i%2], err: e529}
		if i < 26 {
			f.recoveredBy = "switch_provider"
		}
		p.publish(f)
		outage = append(outage, f.tenant+"/"+f.session)
	}
	unrelated := []failure{
		{tenant: "acme", session: "other-529", provider: "openai", model: "gpt-5", err: events.ErrorInfo{Message: "overloaded", Kind: events.KindTransient, Provider: "openai", HTTPStatus: 529}},
		{tenant: "beta", session: "other-400", provider: "anthropic", model: "claude-opus-4-6", err: events.ErrorInfo{Message: "messages.1: tool_use ids were found without tool_result blocks", Kind: events.KindLogic, Provider: "anthropic", HTTPStatus: 400, Code: "invalid_request_error"}},
		{tenant: "gamma", session: "other-401", provider: "anthropic", model: "claude-opus-4-6", err: events.ErrorInfo{Message: "invalid x-api-key", Kind: events.KindLogic, Provider: "anthropic", HTTPStatus: 401, Code: "authentication_error"}},
		{tenant: "acme", session: "other-429", provider: "anthropic", model: "claude-opus-4-6", err: events.ErrorInfo{Message: "rate limited", Kind: events.KindTransient, Provider: "anthropic", HTTPStatus: 429, Code: "rate_limit_error"}},
		{tenant: "beta", session: "other-crash", provider: "anthropic", model: "claude-opus-4-6", orphan: true},
	}
	for i, f := range unrelated {
		f.at = t0.Add(time.Duration(i*7) * time.Second)
		p.publish(f)
	}
	e503 := events.ErrorInfo{Message: "Service Unavailable", Kind: events.KindTransient, Provider: "vertex", HTTPStatus: 503}
	for i := range 6 {
		at := t0.Add(time.Duration(i%3) * 20 * time.Second)
		if i >= 3 {
			at = at.Add(time.Hour)
		}
		p.publish(failure{tenant: "delta", session: fmt.Sprintf("vertex-%d", i), at: at, provider: "vertex", model: "gemini-3", err: e503})
	}

	// Wait for the engine to index every session at its last event.
	refs, err := eng.Log.Sessions(context.Background(), "")
	if err != nil || len(refs) != 41 {
		t.Fatalf("%d sessions in the log, want 41 (%v)", len(refs), err)
	}
	waitFor(t, "the index holds every session", func() bool {
		sums, err := projections.ReadIndex(context.Background(), eng.JS, projections.IndexFilter{})
		if err != nil || len(sums) != len(refs) {
			return false
		}
		for _, s := range sums {
			if last, err := eng.Log.LastSeq(context.Background(), s.Tenant, s.Session); err != nil || s.LastSeq != last {
				return false
			}
		}
		return true
	})

	var incs []correlate.Incident
	if err := json.Unmarshal([]byte(run(t, eng.URL, "incidents", "--json")), &incs); err != nil {
		t.Fatal(err)
	}
	byKey := map[string]correlate.Incident{}
	var titles []string
	for _, in := range incs {
		byKey[in.Key.String()] = in
		titles = append(titles, fmt.Sprintf("%s: %d sessions", in.Key, len(in.Sessions)))
	}
	in, ok := byKey["kind=error class=overloaded code=529 provider=anthropic"]
	if !ok {
		t.Fatalf("no anthropic 529 incident among %v", titles)
	}
	var got []string
	for _, a := range in.Sessions {
		got = append(got, a.Tenant+"/"+a.Session)
	}
	if len(in.Sessions) != 30 || strings.Join(sorted(got), " ") != strings.Join(sorted(outage), " ") {
		t.Fatalf("the outage incident holds %d sessions %v, want the 30 of the outage", len(got), got)
	}
	if in.Recurring || len(in.Windows) != 1 || len(in.Tenants) != 3 || in.LastSeen.Sub(in.FirstSeen) > time.Minute {
		t.Errorf("the outage: recurring %v, windows %+v, tenants %v, %s..%s", in.Recurring, in.Windows, in.Tenants, in.FirstSeen, in.LastSeen)
	}
	want := fmt.Sprintf("30 sessions on provider anthropic (3 tenants) failed with overloaded_error (529) at %s UTC; 26 recovered by switch_provider, 4 with no recovery",
		t0.Format("2006-01-02 15:04"))
	if in.Hypothesis != want {
		t.Errorf("hypothesis\n got %q\nwant %q", in.Hypothesis, want)
	}
	// The five stay apart: none is in the outage, each is in incidents of
	// its own.
	for _, f := range unrelated {
		found := 0
		for _, x := range incs {
			for _, a := range x.Sessions {
				if a.Session == f.session {
					found++
					if len(x.Sessions) != 1 {
						t.Errorf("%s is in %s with %d sessions", f.session, x.Key, len(x.Sessions))
					}
				}
			}
		}
		if found == 0 {
			t.Errorf("%s is in no incident", f.session)
		}
	}
	// The pattern seen twice, an hour apart, is one recurring incident.
	rec, ok := byKey["kind=error class=overloaded code=503 provider=vertex"]
	if !ok || !rec.Recurring || len(rec.Windows) != 2 || rec.Windows[0].Sessions != 3 || rec.Windows[1].Sessions != 3 || !strings.Contains(rec.Hypothesis, "in 2 windows") {
		t.Errorf("the vertex 503 incident: %+v", rec)
	}
	for _, x := range incs {
		if x.Key.String() != rec.Key.String() && x.Recurring {
			t.Errorf("%s is marked recurring", x.Key)
		}
	}

	// The text output, and the per-session view.
	text := run(t, eng.URL, "incidents")
	for _, w := range []string{"overloaded 529 · provider anthropic", "[recurring]", want} {
		if !strings.Contains(text, w) {
			t.Errorf("engine incidents lacks %q:\n%s", w, text)
		}
	}
	if bySession := run(t, eng.URL, "incidents", "--by", "session"); strings.Count(bySession, "\n") != 42 {
		t.Errorf("engine incidents --by session lists %d lines, want 41 sessions and a header:\n%s", strings.Count(bySession, "\n"), bySession)
	}
}

func sorted(xs []string) []string { return slices.Sorted(slices.Values(xs)) }
