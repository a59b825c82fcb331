package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/turnstone-dev/turnstone/internal/engine"
	"github.com/turnstone-dev/turnstone/internal/worker"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// incidentFigure is figure 4: from the event that breaks an invariant (a
// turn.failed that leaves a tool_use without its tool_result: an orphan) to
// the worker's ack of the repair_orphans command the reconciler issues for
// it, with the projector, the reconciler and a worker in this process on
// loopback and no back-off configured. Both ends are JetStream store times
// (the server's clock): the turn.failed's, and the status bucket's update
// to "completed", which the worker writes right before it acks the
// command. The time to the recovery.completed event in the session's log
// is reported beside it.
func (r *runner) incidentFigure(ctx context.Context) error {
	srv, err := startServer(false)
	if err != nil {
		return err
	}
	defer srv.close()

	ec, l, err := openLog(ctx, srv.url, "bench-engine")
	if err != nil {
		return err
	}
	defer ec.nc.Close()
	var applied atomic.Int64
	var issuedMu sync.Mutex
	issued := map[string]int{}
	eng, err := engine.Open(ctx, ec.nc, engine.Config{
		OnApply: func(*projections.Session, events.Event, bool, []projections.Violation) { applied.Add(1) },
		OnIssue: func(c recovery.Command) {
			issuedMu.Lock()
			issued[string(c.Kind)]++
			issuedMu.Unlock()
		},
	}, nil)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = eng.Close(cctx)
	}()

	wc, wl, err := openLog(ctx, srv.url, "bench-worker")
	if err != nil {
		return err
	}
	defer wc.nc.Close()
	w, err := worker.New(wc.nc, wl, worker.Config{Name: "bench"}, nil)
	if err != nil {
		return err
	}
	if err := w.Open(ctx); err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = w.Close(cctx)
	}()

	// The status bucket's updates to "completed", by session, stamped with
	// their store time.
	kv, err := ec.js.KeyValue(ctx, recovery.StatusBucket)
	if err != nil {
		return err
	}
	watch, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return err
	}
	defer func() { _ = watch.Stop() }()
	var mu sync.Mutex
	completed := map[string]time.Time{}
	outcomes := map[string]events.Outcome{}
	poke := make(chan struct{}, 1)
	go func() {
		for e := range watch.Updates() {
			if e == nil {
				continue
			}
			var st recovery.Status
			if json.Unmarshal(e.Value(), &st) != nil || st.State != recovery.StateCompleted || st.Kind != recovery.KindRepairOrphans {
				continue
			}
			mu.Lock()
			if _, ok := completed[st.Session]; !ok {
				completed[st.Session] = e.Created()
				outcomes[st.Session] = st.Outcome
			}
			mu.Unlock()
			select {
			case poke <- struct{}{}:
			default:
			}
		}
	}()
	waitFor := func(sessions []string) error {
		deadline := time.After(60 * time.Second)
		for {
			mu.Lock()
			missing := 0
			for _, s := range sessions {
				if _, ok := completed[s]; !ok {
					missing++
				}
			}
			mu.Unlock()
			if missing == 0 {
				return nil
			}
			select {
			case <-poke:
			case <-deadline:
				return fmt.Errorf("%d of %d repairs not completed after 60s: %w", missing, len(sessions), errTimeout)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}

	rc, rl, err := openLog(ctx, srv.url, "bench-runtime")
	if err != nil {
		return err
	}
	defer rc.nc.Close()
	stream, err := ec.js.Stream(ctx, events.EventsStream)
	if err != nil {
		return err
	}

	// phase sets up the sessions (a turn whose tool_use awaits its result),
	// lets the projector fold them, then fails each turn, one incident at a
	// time or all at once, and measures each incident.
	phase := func(prefix string, n int, burst bool) (toAck, toEvent []time.Duration, err error) {
		sessions := make([]string, n)
		var setup []events.Event
		at := time.Now().UTC()
		for i := range sessions {
			sessions[i] = sessionName(prefix, i)
			setup = append(setup, orphanSetup(sessions[i], at)...)
		}
		want := applied.Load() + int64(len(setup))
		for i := 0; i < len(setup); i += 100 {
			if _, err := rl.Append(ctx, setup[i:min(i+100, len(setup))]); err != nil {
				return nil, nil, err
			}
		}
		if err := waitUntil(ctx, 60*time.Second, func() bool { return applied.Load() >= want }); err != nil {
			return nil, nil, fmt.Errorf("projector folding the setup: %w", err)
		}
		breaking := make([]uint64, n)
		if burst {
			fails := make([]events.Event, n)
			for i, s := range sessions {
				fails[i] = orphanBreak(s)
			}
			for i := 0; i < n; i += 100 {
				acks, err := rl.Append(ctx, fails[i:min(i+100, n)])
				if err != nil {
					return nil, nil, err
				}
				for j, a := range acks {
					breaking[i+j] = a.Seq
				}
			}
			if err := waitFor(sessions); err != nil {
				return nil, nil, err
			}
		} else {
			for i, s := range sessions {
				acks, err := rl.Append(ctx, []events.Event{orphanBreak(s)})
				if err != nil {
					return nil, nil, err
				}
				breaking[i] = acks[0].Seq
				if err := waitFor(sessions[i : i+1]); err != nil {
					return nil, nil, err
				}
			}
		}
		for i, s := range sessions {
			bm, err := stream.GetMsg(ctx, breaking[i])
			if err != nil {
				return nil, nil, err
			}
			mu.Lock()
			done, outcome := completed[s], outcomes[s]
			mu.Unlock()
			if outcome != events.OutcomeRecovered {
				return nil, nil, fmt.Errorf("repair of %s: outcome %q", s, outcome)
			}
			toAck = append(toAck, done.Sub(bm.Time))
			// The session's last event is the repair's recovery.completed.
			lm, err := stream.GetLastMsgForSubject(ctx, l.SessionSubject(benchTenant, s))
			if err != nil {
				return nil, nil, err
			}
			if ev, err := events.Decode(lm.Data); err != nil || ev.Type != events.TypeRecoveryCompleted {
				return nil, nil, fmt.Errorf("last event of %s: %s, want %s", s, ev.Type, events.TypeRecoveryCompleted)
			}
			toEvent = append(toEvent, lm.Time.Sub(bm.Time))
		}
		return toAck, toEvent, nil
	}

	n := r.sizes.Incidents
	if _, _, err := phase("w", min(n, 10), false); err != nil { // warm up
		return fmt.Errorf("warm-up: %w", err)
	}
	one, oneEv, err := phase("i", n, false)
	if err != nil {
		return err
	}
	burst, burstEv, err := phase("b", n, true)
	if err != nil {
		return err
	}
	for _, c := range []struct {
		what       string
		ack, event []time.Duration
		target     bool
	}{
		{fmt.Sprintf("invariant broken -> worker acks the repair, %s incidents one at a time", commas(int64(n))), one, oneEv, true},
		{fmt.Sprintf("the same, %s incidents at once (queueing included)", commas(int64(n))), burst, burstEv, false},
	} {
		row := Row{
			Bench:    "incident",
			Figure:   c.what,
			Value:    fmt.Sprintf("p50 %s, p99 %s", ms(percentile(c.ack, 50)), ms(percentile(c.ack, 99))),
			Baseline: fmt.Sprintf("to recovery.completed stored: p50 %s, p99 %s", ms(percentile(c.event, 50)), ms(percentile(c.event, 99))),
			Metrics: map[string]float64{"incidents": float64(len(c.ack)),
				"ack_p50_ms": msf(percentile(c.ack, 50)), "ack_p99_ms": msf(percentile(c.ack, 99)), "ack_max_ms": msf(percentile(c.ack, 100)),
				"event_p50_ms": msf(percentile(c.event, 50)), "event_p99_ms": msf(percentile(c.event, 99))},
		}
		if c.target {
			row.Target = "p99 < 100 ms"
			row.Status = status(percentile(c.ack, 99) < 100*time.Millisecond)
		}
		r.add(row)
	}
	issuedMu.Lock()
	var kinds []string
	for k, v := range issued {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, v))
	}
	issuedMu.Unlock()
	sort.Strings(kinds)
	r.note("incident: commands the reconciler issued: %s", strings.Join(kinds, ", "))
	return nil
}

// orphanSetup is a session whose turn is running a tool: session.started,
// turn.started, the user's prompt, the assistant's tool_use.
func orphanSetup(session string, at time.Time) []events.Event {
	turn := turnID(0)
	var evs []events.Event
	for i, p := range []events.Payload{
		&events.SessionStarted{Runtime: "bench"},
		&events.TurnStarted{Prompt: "run the tests", Trigger: "user"},
		&events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockText, Text: "run the tests"}}},
		&events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{{Type: events.BlockToolUse, ID: "toolu_" + session, Name: "Bash", Input: json.RawMessage(`{"command":"go test ./..."}`)}}},
	} {
		t := turn
		if i == 0 {
			t = ""
		}
		ev, err := events.NewAt(at, events.NewID(), benchTenant, session, t, p)
		if err != nil {
			panic(err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// orphanBreak is the event that breaks the invariant: the runtime,
// restarted, fails the turn whose tool never returned, which makes the
// tool_use an orphan.
func orphanBreak(session string) events.Event {
	ev, err := events.New(benchTenant, session, turnID(0), &events.TurnFailed{Stage: events.StageExecute,
		Error: events.ErrorInfo{Message: "process restarted", Kind: events.KindUnknown}})
	if err != nil {
		panic(err)
	}
	return ev
}

// waitUntil polls cond every millisecond until it holds, or fails after d.
func waitUntil(ctx context.Context, d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not done after %s: %w", d, errTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}
