package test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/turnstone-dev/turnstone/internal/claudecode"
	"github.com/turnstone-dev/turnstone/internal/codex"
	"github.com/turnstone-dev/turnstone/internal/enginetest"
	"github.com/turnstone-dev/turnstone/internal/importer"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// TestImportedHistoryIsNeverActedOn: with an engine, a worker and a
// runtime serving the tenant running, every shipped and wild transcript
// (Claude Code and Codex) is imported into that tenant; after the reconciler's clock passes every
// deadline and the live horizon, and two ticks more, no command was
// issued, no control request reached agent.ctl.> (presence pings aside),
// and no session is paused. Imports are history (issue 10: importing the
// shipped transcripts once made the reconciler pause three of them and
// send their runtime control requests). Under the race detector it imports
// the Claude Code files of at most 256 KiB (corpusSample); .ci/run's
// full-size pass imports them all.
func TestImportedHistoryIsNeverActedOn(t *testing.T) {
	skipShort(t, "reads the whole transcript corpus")
	parallel(t)
	ctx := context.Background()
	eng := enginetest.Start(t, enginetest.Options{}) // its runtime serves tenant acme
	nc, err := nats.Connect(eng.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var requests atomic.Int64
	var first atomic.Value
	sub, err := nc.Subscribe(recovery.ControlSubjectPrefix+".>", func(m *nats.Msg) {
		if strings.HasSuffix(m.Subject, "._presence") {
			return
		}
		requests.Add(1)
		first.CompareAndSwap(nil, m.Subject)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	files, err := claudecode.Expand([]string{transcriptsDir, wildDir})
	if err != nil {
		t.Fatal(err)
	}
	files = corpusSample(t, files)
	rep, err := claudecode.Import(ctx, claudecode.LogStore(eng.Log), files, claudecode.Options{Tenant: "acme"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := 100 // sessions of every file
	if raceEnabled {
		want = 90 // sessions of the sample
	}
	if rep.Sessions < want {
		t.Fatalf("imported %d sessions, want every shipped and wild one", rep.Sessions)
	}
	// And every Codex rollout, two of which end with a turn in flight.
	crep, err := importer.Import(ctx, importer.LogStore(eng.Log), codex.Format, codexRollouts(t), importer.Options{Tenant: "acme"}, nil)
	if err != nil || crep.Sessions < 7 {
		t.Fatalf("import the Codex rollouts: %v, %d sessions", err, crep.Sessions)
	}
	// Every session projected and in the fleet index, then the clock
	// past every deadline (120 s) and the live horizon (30 min).
	refs, err := eng.Log.Sessions(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every imported session in the fleet index", func() bool {
		sums, err := projections.ReadIndex(ctx, eng.JS, projections.IndexFilter{Tenant: "acme"})
		return err == nil && len(sums) >= len(refs)
	})
	for range 3 {
		eng.Clock.Advance(time.Hour)
		time.Sleep(1500 * time.Millisecond)
	}

	if n := requests.Load(); n != 0 {
		t.Errorf("%d control requests to the runtime of imported history, the first on %v", n, first.Load())
	}
	st, err := eng.JS.Stream(ctx, recovery.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Errorf("recovery stream holds %v commands (%v), want none for history", info.State.Msgs, err)
	}
	sums, err := projections.ReadIndex(ctx, eng.JS, projections.IndexFilter{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sums {
		if s.Status == projections.StatusPaused {
			t.Errorf("%s/%s paused: %s", s.Tenant, s.Session, s.StatusDetail)
		}
	}
}
