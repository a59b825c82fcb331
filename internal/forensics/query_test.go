package forensics_test

import (
	"context"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/forensics"
	"github.com/turnstone-dev/turnstone/projections"
)

// TestFleetQueriesWithAndWithoutIndex: the anomalous sessions and the
// incidents are the same whether the fleet index exists (only the
// anomalous sessions are restored) or not (the log is read whole).
func TestFleetQueriesWithAndWithoutIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, js := embeddedtest.Connect(t, embeddedtest.Start(t))
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	store, err := projections.NewSnapshotStore(js, projections.SnapshotConfig{})
	if err != nil {
		t.Fatal(err)
	}
	appendAll := func(tenant, session string, ps ...events.Payload) {
		t.Helper()
		var evs []events.Event
		for i, p := range ps {
			turn := ""
			if i > 0 {
				turn = "t1"
			}
			ev, err := events.New(tenant, session, turn, p)
			if err != nil {
				t.Fatal(err)
			}
			evs = append(evs, ev)
		}
		if _, err := log.Append(ctx, evs); err != nil {
			t.Fatal(err)
		}
	}
	appendAll("acme", "fine", &events.SessionStarted{Provider: "anthropic"}, &events.TurnStarted{Prompt: "hi"}, &events.TurnCompleted{})
	for _, s := range []string{"down1", "down2"} {
		appendAll("acme", s, &events.SessionStarted{Provider: "anthropic"}, &events.TurnStarted{Prompt: "hi"},
			&events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: "Overloaded", Kind: events.KindTransient, Provider: "anthropic", HTTPStatus: 529, Code: "overloaded_error"}})
	}
	appendAll("globex", "down3", &events.SessionStarted{Provider: "anthropic"}, &events.TurnStarted{Prompt: "hi"},
		&events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: "Overloaded", Kind: events.KindTransient, Provider: "anthropic", HTTPStatus: 529, Code: "overloaded_error"}})

	check := func(when string) {
		t.Helper()
		views, err := forensics.AnomalousViews(ctx, log, store, "acme")
		if err != nil {
			t.Fatal(err)
		}
		recent := forensics.Recent(views, time.Now().Add(-time.Hour))
		if len(recent) != 2 || recent[0].Tenant != "acme" || recent[1].Tenant != "acme" {
			t.Fatalf("%s: anomalous sessions of acme: %+v", when, recent)
		}
		if old := forensics.Recent(views, time.Now().Add(time.Hour)); len(old) != 0 {
			t.Fatalf("%s: sessions after a cutoff in the future: %+v", when, old)
		}
		incs, err := forensics.FleetIncidents(ctx, log, store, forensics.IncidentsConfig{})
		if err != nil {
			t.Fatal(err)
		}
		if len(incs) != 1 || len(incs[0].Sessions) != 3 || len(incs[0].Tenants) != 2 {
			t.Fatalf("%s: incidents %+v, want one of 3 sessions in 2 tenants", when, incs)
		}
		states, bad, err := forensics.RestoreAll(ctx, log, store, "")
		if err != nil || len(states) != 4 || len(bad) != 0 {
			t.Fatalf("%s: restore all: %d states, %v, %v", when, len(states), bad, err)
		}
	}
	check("without an index")
	if err := projections.EnsureIndexBucket(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	if n, err := projections.RebuildIndex(ctx, log, store); err != nil || n != 4 {
		t.Fatalf("rebuild index: %d, %v", n, err)
	}
	check("with the index")
}
