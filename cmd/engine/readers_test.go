package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/forensics"
	"github.com/turnstone-dev/turnstone/internal/telemetry"
	"github.com/turnstone-dev/turnstone/projections"
)

// The injected terminal sequences (a title change, a screen clear) the
// states carry in prompts, errors and pause reasons: no text reader may
// print them raw.
const (
	titleChange = "\x1b]0;pwned\x07"
	screenClear = "\x1b[2J"
)

var readerEpoch = time.Date(2026, 2, 11, 21, 0, 0, 0, time.UTC)

// sessionEvents builds the events of tenant/session from payloads (with
// their turn), sequences from seq0+1 and times one second apart. A nil
// payload stands for an event that does not decode (Err set).
func sessionEvents(t *testing.T, tenant, session string, seq0 uint64, steps ...any) []events.Event {
	t.Helper()
	var out []events.Event
	turn := ""
	for _, st := range steps {
		switch x := st.(type) {
		case string: // the turn of the payloads that follow
			turn = x
			continue
		case events.Payload:
			seq := seq0 + uint64(len(out)) + 1
			when := readerEpoch.Add(time.Duration(seq) * time.Second)
			ev, err := events.NewAt(when, events.DeterministicID(when, fmt.Sprint(tenant, session, seq)), tenant, session, turn, x)
			if err != nil {
				t.Fatal(err)
			}
			ev.Seq = seq
			out = append(out, ev)
		case error:
			seq := seq0 + uint64(len(out)) + 1
			out = append(out, events.Event{Seq: seq, Tenant: tenant, Session: session, Type: events.TypeMessageAppended,
				Time: readerEpoch.Add(time.Duration(seq) * time.Second), Err: x})
		default:
			t.Fatalf("step %T", st)
		}
	}
	return out
}

func userText(s string) *events.MessageAppended {
	return &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockText, Text: s}}}
}

func asstToolUse(id string) *events.MessageAppended {
	return &events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{
		{Type: events.BlockText, Text: "Running it."},
		{Type: events.BlockToolUse, ID: id, Name: "Bash", Input: json.RawMessage(`{"command":"go test ./..."}`)},
	}}
}

func asstText(s string) *events.MessageAppended {
	return &events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{{Type: events.BlockText, Text: s}}}
}

func syntheticResult(id string) *events.MessageAppended {
	return &events.MessageAppended{Role: events.RoleUser, Synthetic: true, Content: []events.ContentBlock{
		{Type: events.BlockToolResult, ToolUseID: id, IsError: true, Content: json.RawMessage(`"interrupted: the runtime crashed"`)},
	}}
}

// readerCase is one projected state fed to every reader.
type readerCase struct {
	name   string
	events []events.Event
	state  *projections.Session
}

// readerCases folds the states the readers must agree on: clean, an open
// orphan, a repaired orphan with its resolved violation, a paused
// session, a turn in flight, an invalid event. Each session's events have
// sequences of their own range, as they would in one stream.
func readerCases(t *testing.T) []readerCase {
	t.Helper()
	failed := &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: "worker killed " + titleChange, Kind: events.KindUnknown}}
	cases := []readerCase{
		{name: "clean", events: sessionEvents(t, "acme", "clean", 100,
			&events.SessionStarted{Runtime: "test"},
			"t1", &events.TurnStarted{Prompt: "build it " + titleChange + screenClear}, userText("build it"), asstText("Done."),
			&events.TurnCompleted{})},
		{name: "open orphan", events: sessionEvents(t, "acme", "orphan", 200,
			&events.SessionStarted{Runtime: "test"},
			"t1", &events.TurnStarted{Prompt: "test it " + screenClear}, userText("test it"), asstToolUse("toolu_open"), failed)},
		{name: "repaired orphan", events: sessionEvents(t, "acme", "repaired", 300,
			&events.SessionStarted{Runtime: "test"},
			"t1", &events.TurnStarted{Prompt: "test it"}, userText("test it"), asstToolUse("toolu_fixed"), failed,
			"", syntheticResult("toolu_fixed"),
			&events.RecoveryAttempted{CommandID: "repair_orphans-1", Kind: "repair_orphans", Attempt: 1, Result: events.AttemptOK},
			&events.RecoveryCompleted{CommandID: "repair_orphans-1", Kind: "repair_orphans", Outcome: events.OutcomeRecovered, Attempts: 1, Detail: "repaired orphaned tool_use toolu_fixed"})},
		{name: "paused", events: sessionEvents(t, "acme", "paused", 400,
			&events.SessionStarted{Runtime: "test"},
			&events.SessionPaused{Reason: "runtime_unavailable: distill needs the runtime " + titleChange})},
		{name: "turn in flight", events: sessionEvents(t, "acme", "inflight", 500,
			&events.SessionStarted{Runtime: "test"},
			"t1", &events.TurnStarted{Prompt: "long job"}, &events.TurnStageCompleted{Stage: events.StageContext}, userText("long job"))},
		{name: "invalid event", events: sessionEvents(t, "acme", "invalid", 600,
			&events.SessionStarted{Runtime: "test"},
			errors.New("field \"data.role\": must be user or assistant "+screenClear))},
	}
	for i := range cases {
		cases[i].state = projections.FoldLog(cases[i].events)
	}
	return cases
}

// truth is what every reader must say of a state.
type truth struct {
	status                        projections.SessionStatus
	orphansOpen, orphansRepaired  int
	violationsOpen, violationsRes int
	openIDs                       []string
	inFlight                      int
}

func truthOf(v projections.View) truth {
	return truth{status: v.Status, orphansOpen: v.Counts.OrphansOpen, orphansRepaired: v.Counts.OrphansRepaired,
		violationsOpen: v.Counts.ViolationsOpen, violationsRes: v.Counts.ViolationsResolved,
		openIDs: nonNil(v.OrphanedToolUseIDs), inFlight: v.Counts.TurnsInFlight}
}

// TestEveryReaderTellsOneTruth feeds the same projected states to every
// reader — sessions (text and JSON), inspect (text and JSON), replay (the
// final state, text and JSON), incidents (text and JSON) and the engine's
// metrics — and checks that they agree on orphans, violations, their
// resolution and the status, and that no text reader prints a stored
// terminal escape sequence raw.
func TestEveryReaderTellsOneTruth(t *testing.T) {
	cases := readerCases(t)
	want := map[string]truth{
		"clean":           {status: projections.StatusIdle, openIDs: []string{}},
		"open orphan":     {status: projections.StatusBroken, orphansOpen: 1, violationsOpen: 1, openIDs: []string{"toolu_open"}},
		"repaired orphan": {status: projections.StatusIdle, orphansRepaired: 1, violationsRes: 1, openIDs: []string{}},
		"paused":          {status: projections.StatusPaused, openIDs: []string{}},
		"turn in flight":  {status: projections.StatusInTurn, openIDs: []string{}, inFlight: 1},
		"invalid event":   {status: projections.StatusBroken, violationsOpen: 1, openIDs: []string{}},
	}
	views := make([]projections.View, len(cases))
	for i, c := range cases {
		views[i] = c.state.View()
		if got := truthOf(views[i]); !equalTruth(got, want[c.name]) {
			t.Fatalf("%s: the view says %+v, want %+v", c.name, got, want[c.name])
		}
	}
	bad := projections.InvalidSubjectView("agent.evt.acme.*", "acme", "*", 1, "4 tokens, want 5")
	all := append(slices.Clone(views), bad)
	// engine sessions lists the fleet index's summaries: the same status
	// and counts as the views.
	sums := make([]projections.Summary, 0, len(all))
	for _, c := range cases {
		sums = append(sums, c.state.Summary(0))
	}
	sums = append(sums, projections.InvalidSubjectSummary("agent.evt.acme.*", "acme", "*", 0, 1, "4 tokens, want 5"))

	// sessions --json and sessions.
	var buf bytes.Buffer
	if err := renderSessions(&buf, sums, true); err != nil {
		t.Fatal(err)
	}
	var rows []projections.Summary
	if err := json.Unmarshal(buf.Bytes(), &rows); err != nil {
		t.Fatalf("sessions --json: %v\n%s", err, buf.String())
	}
	if len(rows) != len(all) || rows[len(rows)-1].Status != projections.StatusInvalid || rows[len(rows)-1].Subject != "agent.evt.acme.*" {
		t.Fatalf("sessions --json lists %d rows, the last %+v; want %d, the invalid subject last", len(rows), rows[len(rows)-1], len(all))
	}
	for i := range cases {
		if rows[i].Status != views[i].Status || rows[i].Counts != views[i].Counts {
			t.Errorf("%s: sessions --json says %s %+v, the view %s %+v", cases[i].name, rows[i].Status, rows[i].Counts, views[i].Status, views[i].Counts)
		}
	}
	buf.Reset()
	if err := renderSessions(&buf, sums, false); err != nil {
		t.Fatal(err)
	}
	sessionsText := buf.String()
	table := parseTable(t, sessionsText)
	if !strings.Contains(sessionsText, "invalid: subject agent.evt.acme.* (1 event(s)): 4 tokens, want 5") {
		t.Errorf("sessions does not report the invalid subject with its reason:\n%s", sessionsText)
	}
	var broken []string
	for _, v := range brokenRows(sums) {
		broken = append(broken, v.Session)
	}
	if want := []string{"orphan", "invalid", "*"}; !slices.Equal(broken, want) {
		t.Errorf("sessions --broken lists %v, want %v (every session with an open orphan or violation, whatever its status, and the invalid subject)", broken, want)
	}

	// incidents --json and incidents.
	buf.Reset()
	inc := forensics.Recent(all, time.Time{})
	if err := renderIncidents(&buf, inc, true); err != nil {
		t.Fatal(err)
	}
	var incRows []projections.View
	if err := json.Unmarshal(buf.Bytes(), &incRows); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	if err := renderIncidents(&buf, inc, false); err != nil {
		t.Fatal(err)
	}
	incText := buf.String()
	incTable := parseTable(t, incText)
	if !strings.Contains(incText, "agent.evt.acme.*") {
		t.Errorf("incidents does not list the invalid subject:\n%s", incText)
	}

	for i, c := range cases {
		w := want[c.name]
		check := func(reader string, got truth) {
			t.Helper()
			if !equalTruth(got, w) {
				t.Errorf("%s: %s says %+v, want %+v", c.name, reader, got, w)
			}
		}
		v := views[i]

		// A summary carries the counts, not the ids.
		st := truthOf(projections.View{Status: rows[i].Status, Counts: rows[i].Counts})
		st.openIDs = w.openIDs
		check("sessions --json", st)
		row := table[v.Session]
		if row == nil {
			t.Fatalf("%s: no row in sessions:\n%s", c.name, sessionsText)
		}
		check("sessions", textTruth(t, row["STATUS"], row["ORPHANS"], row["VIOLATIONS"], w))

		// inspect --json: the state, its view, and the keys it promises.
		buf.Reset()
		if err := renderInspect(&buf, c.state, true); err != nil {
			t.Fatal(err)
		}
		var ij struct {
			Status             projections.SessionStatus `json:"status"`
			OrphanedToolUseIDs []string                  `json:"orphaned_tool_use_ids"`
			InFlight           []string                  `json:"in_flight"`
			Violations         []projections.Violation   `json:"violations"`
			Orphans            []projections.Orphan      `json:"orphans"`
			View               projections.View          `json:"view"`
		}
		if err := json.Unmarshal(buf.Bytes(), &ij); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{`"in_flight": [`, `"turns": [`, `"orphaned_tool_use_ids": [`, `"violations": [`, `"view": {`} {
			if !strings.Contains(buf.String(), k) {
				t.Errorf("%s: inspect --json lacks %s", c.name, k)
			}
		}
		check("inspect --json view", truthOf(ij.View))
		resolved, repaired := 0, 0
		for _, x := range ij.Violations {
			if x.Resolved {
				resolved++
			}
		}
		for _, o := range ij.Orphans {
			if o.Repaired {
				repaired++
			}
		}
		check("inspect --json state", truth{status: ij.Status, orphansOpen: len(ij.OrphanedToolUseIDs), orphansRepaired: repaired,
			violationsOpen: len(ij.Violations) - resolved, violationsRes: resolved, openIDs: ij.OrphanedToolUseIDs, inFlight: len(ij.InFlight)})

		// inspect.
		buf.Reset()
		if err := renderInspect(&buf, c.state, false); err != nil {
			t.Fatal(err)
		}
		check("inspect", inspectTruth(t, buf.String()))
		noRawEscapes(t, c.name+": inspect", buf.String())

		// replay: the final state of a timeline of the same events.
		for _, asJSON := range []bool{false, true} {
			buf.Reset()
			r := newReplayer(&buf, asJSON)
			rp := projections.NewReplayer(nil)
			for _, ev := range c.events {
				step, ok, err := rp.Apply(context.Background(), ev)
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					continue
				}
				if err := r.step(step); err != nil {
					t.Fatal(err)
				}
			}
			if err := r.end(rp.State()); err != nil {
				t.Fatal(err)
			}
			if asJSON {
				check("replay --json", replayJSONTruth(t, buf.String(), c.events))
			} else {
				check("replay", replayTruth(t, buf.String()))
				noRawEscapes(t, c.name+": replay", buf.String())
			}
		}

		// incidents: the anomalous sessions, with the same status and counts.
		j := slices.IndexFunc(incRows, func(x projections.View) bool { return x.Session == v.Session })
		if (j >= 0) != v.Anomalous {
			t.Errorf("%s: incidents lists it: %v; anomalous: %v", c.name, j >= 0, v.Anomalous)
		}
		if j >= 0 {
			check("incidents --json", truthOf(incRows[j]))
			r := incTable["acme/"+v.Session]
			if r == nil {
				t.Fatalf("%s: no row in incidents:\n%s", c.name, incText)
			}
			check("incidents", textTruth(t, r["STATUS"], r["ORPHANS"], r["VIOLATIONS"], w))
		}

		// /metrics: the engine observes every event and the session after it.
		m := telemetry.NewMetrics(telemetry.Namespace)
		for _, ev := range c.events {
			m.ObserveEvent(ev)
		}
		m.ObserveSession(c.state)
		check("/metrics", metricsTruth(t, m.Registry(), w))
	}
	noRawEscapes(t, "sessions", sessionsText)
	noRawEscapes(t, "incidents", incText)

	// One engine's gauges over every session are the sums of the views.
	m := telemetry.NewMetrics(telemetry.Namespace)
	for _, c := range cases {
		m.ObserveSession(c.state)
	}
	sum := map[string]float64{}
	for _, v := range views {
		sum["open"] += float64(v.Counts.ViolationsOpen)
		sum["resolved"] += float64(v.Counts.ViolationsResolved)
	}
	for state, n := range sum {
		if got := gauge(t, m.Registry(), "turnstone_violations", "state", state); got != n {
			t.Errorf("violations{state=%q} = %v over every session, want %v", state, got, n)
		}
	}
}

func equalTruth(a, b truth) bool {
	return a.status == b.status && a.orphansOpen == b.orphansOpen && a.orphansRepaired == b.orphansRepaired &&
		a.violationsOpen == b.violationsOpen && a.violationsRes == b.violationsRes && slices.Equal(a.openIDs, b.openIDs) &&
		a.inFlight == b.inFlight
}

// parseTable reads a tabwriter table (columns two spaces or more apart)
// into rows by their SESSION cell (the second column), each a map from
// header to cell.
func parseTable(t *testing.T, text string) map[string]map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(text, "\n"), "\n")
	header := lines[0]
	var starts []int
	var names []string
	for _, m := range regexp.MustCompile(`\S+( \S+)*`).FindAllStringIndex(header, -1) {
		starts = append(starts, m[0])
		names = append(names, header[m[0]:m[1]])
	}
	rows := map[string]map[string]string{}
	for _, l := range lines[1:] {
		if len(l) < starts[len(starts)-1] {
			continue // a note below the table
		}
		row := map[string]string{}
		for i, s := range starts {
			end := len(l)
			if i+1 < len(starts) {
				end = starts[i+1]
			}
			row[names[i]] = strings.TrimSpace(l[s:end])
		}
		rows[row["SESSION"]] = row
	}
	return rows
}

var countCellRE = regexp.MustCompile(`^(\d+)(?: \((\d+) (repaired|resolved)\))?$`)

// textTruth reads a table's STATUS, ORPHANS and VIOLATIONS cells. The
// orphan ids and turns in flight are not in a table: they are taken from
// want.
func textTruth(t *testing.T, status, orphans, violations string, want truth) truth {
	t.Helper()
	o := countCellRE.FindStringSubmatch(orphans)
	v := countCellRE.FindStringSubmatch(violations)
	if o == nil || v == nil {
		t.Fatalf("cells %q, %q do not read as counts", orphans, violations)
	}
	return truth{status: projections.SessionStatus(status), orphansOpen: atoi(o[1]), orphansRepaired: atoi(o[2]),
		violationsOpen: atoi(v[1]), violationsRes: atoi(v[2]), openIDs: want.openIDs, inFlight: want.inFlight}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// inspectTruth reads `engine inspect`'s text: the status line, the counts
// lines, the open orphans listed, and the turns in flight.
func inspectTruth(t *testing.T, text string) truth {
	t.Helper()
	var got truth
	var turnsTotal, done, fail, aband int
	for _, l := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(l, "status "):
			f := strings.Fields(strings.TrimPrefix(l, "status"))
			got.status = projections.SessionStatus(strings.TrimSuffix(f[0], ":"))
		case strings.HasPrefix(l, "orphans "):
			var reset int
			fmt.Sscanf(l, "orphans %d open, %d repaired, %d reset", &got.orphansOpen, &got.orphansRepaired, &reset)
		case strings.HasPrefix(l, "violations "):
			var reset int
			fmt.Sscanf(l, "violations %d open, %d resolved, %d reset", &got.violationsOpen, &got.violationsRes, &reset)
		case strings.HasPrefix(l, "turns "):
			fmt.Sscanf(l, "turns %d: %d completed, %d failed, %d abandoned, %d in flight", &turnsTotal, &done, &fail, &aband, &got.inFlight)
		}
	}
	// The open orphans are listed under their heading, the repaired ones
	// under theirs, and resolved violations say so.
	got.openIDs = []string{}
	section := ""
	repairedListed, resolvedListed := 0, 0
	for _, l := range strings.Split(text, "\n") {
		switch {
		case l == "ORPHANED TOOL_USE (open)", l == "REPAIRED TOOL_USE", l == "VIOLATIONS (open)", l == "RESOLVED VIOLATIONS", l == "TURNS":
			section = l
		case strings.HasPrefix(l, "  ") && strings.TrimSpace(l) != "none":
			switch section {
			case "ORPHANED TOOL_USE (open)":
				got.openIDs = append(got.openIDs, strings.Fields(l)[0])
			case "REPAIRED TOOL_USE":
				repairedListed++
				if !strings.Contains(l, "repaired at seq") {
					t.Errorf("a repaired orphan does not read as repaired: %q", l)
				}
			case "RESOLVED VIOLATIONS":
				resolvedListed++
				if !strings.Contains(l, "(resolved at seq") {
					t.Errorf("a resolved violation does not read as resolved: %q", l)
				}
			}
		}
	}
	if repairedListed != got.orphansRepaired || resolvedListed != got.violationsRes {
		t.Errorf("inspect lists %d repaired orphans and %d resolved violations, its counts say %d and %d:\n%s",
			repairedListed, resolvedListed, got.orphansRepaired, got.violationsRes, text)
	}
	return got
}

var replayEndRE = regexp.MustCompile(`(\d+) events replayed: (\w+); turns \d+; orphaned tool_use: (\d+) open \[([^\]]*)\], (\d+) repaired; violations: (\d+) open, (\d+) resolved, \d+ reset`)

// replayTruth reads the last line of `engine replay`. Turns in flight are
// not on it: they are counted from the turn lines.
func replayTruth(t *testing.T, text string) truth {
	t.Helper()
	m := replayEndRE.FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("replay does not end with its summary:\n%s", text)
	}
	got := truth{status: projections.SessionStatus(m[2]), orphansOpen: atoi(m[3]), orphansRepaired: atoi(m[5]),
		violationsOpen: atoi(m[6]), violationsRes: atoi(m[7]), openIDs: strings.Fields(m[4])}
	if got.openIDs == nil {
		got.openIDs = []string{}
	}
	started := strings.Count(text, " turn.started ")
	ended := strings.Count(text, " turn.completed ") + strings.Count(text, " turn.failed ") + strings.Count(text, " turn.abandoned ")
	got.inFlight = started - ended
	if got.orphansRepaired > 0 && !strings.Contains(text, "ok resolved tool_use_without_result") {
		t.Errorf("replay does not flag the repair as resolving the orphan:\n%s", text)
	}
	return got
}

// replayJSONTruth reads `engine replay --json`: one whole event per line,
// in stream order, then the final view.
func replayJSONTruth(t *testing.T, out string, evs []events.Event) truth {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != len(evs)+1 {
		t.Fatalf("replay --json printed %d lines for %d events, want one per event and the end", len(lines), len(evs))
	}
	flagged, resolved := 0, 0
	for i, l := range lines[:len(evs)] {
		var line struct {
			Seq       uint64          `json:"seq"`
			Event     json.RawMessage `json:"event"`
			Anomalies []json.RawMessage
			Resolved  []json.RawMessage
		}
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if line.Seq != evs[i].Seq || line.Anomalies == nil || line.Resolved == nil {
			t.Errorf("line %d: seq %d (want %d), anomalies %v, resolved %v", i, line.Seq, evs[i].Seq, line.Anomalies, line.Resolved)
		}
		if evs[i].Err == nil {
			var whole events.Event
			if err := json.Unmarshal(line.Event, &whole); err != nil || whole.ID != evs[i].ID || whole.Type != evs[i].Type || string(whole.Data) != string(evs[i].Data) {
				t.Errorf("line %d does not hold the whole event: %s (err %v)", i, line.Event, err)
			}
		}
		flagged += len(line.Anomalies)
		resolved += len(line.Resolved)
	}
	var end struct {
		Replayed int              `json:"replayed"`
		View     projections.View `json:"view"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &end); err != nil || end.Replayed != len(evs) {
		t.Fatalf("last line %q (err %v): want the count and the view", lines[len(lines)-1], err)
	}
	if flagged != end.View.Counts.ViolationsTotal || resolved != end.View.Counts.ViolationsResolved {
		t.Errorf("replay --json flags %d anomalies and %d resolutions; the view counts %d and %d", flagged, resolved,
			end.View.Counts.ViolationsTotal, end.View.Counts.ViolationsResolved)
	}
	return truthOf(end.View)
}

// metricsTruth reads the gauges of one session's metrics. Its orphan ids
// are not in the metrics: they are taken from want.
func metricsTruth(t *testing.T, reg prometheus.Gatherer, want truth) truth {
	t.Helper()
	got := truth{status: projections.StatusIdle, openIDs: want.openIDs,
		orphansOpen:     int(gauge(t, reg, "turnstone_orphans", "state", "open")),
		orphansRepaired: int(gauge(t, reg, "turnstone_orphans", "state", "repaired")),
		violationsOpen:  int(gauge(t, reg, "turnstone_violations", "state", "open")),
		violationsRes:   int(gauge(t, reg, "turnstone_violations", "state", "resolved")),
		inFlight:        int(gauge(t, reg, "turnstone_turns_in_flight", "", "")),
	}
	for _, st := range []projections.SessionStatus{projections.StatusPaused, projections.StatusInTurn, projections.StatusBroken} {
		if gauge(t, reg, "turnstone_sessions", "status", string(st)) == 1 {
			got.status = st
		}
	}
	return got
}

// gauge is the value of the series of name with label = value (or the
// only series when label is "").
func gauge(t *testing.T, reg prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if label == "" || (lp.GetName() == label && lp.GetValue() == value) {
					return m.GetGauge().GetValue()
				}
			}
			if label == "" {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}

// noRawEscapes fails when text holds a raw ESC or BEL.
func noRawEscapes(t *testing.T, what, text string) {
	t.Helper()
	if strings.ContainsAny(text, "\x1b\x07") {
		t.Errorf("%s prints a raw terminal control character:\n%q", what, text)
	}
}

// TestRuntimesTableEscapesMetadata: a runtime's metadata (its version,
// its runtime name) is what its tenant announced: the table prints it
// escaped, never raw on the operator's terminal.
func TestRuntimesTableEscapesMetadata(t *testing.T) {
	var out strings.Builder
	rs := []runtimeLine{{Tenant: "acme", ID: "r1", Version: "1.0" + screenClear + "\nglobex\t*\ttrue\tr9\t2.0\tforged", Metadata: map[string]string{"runtime": "evil" + titleChange}}}
	if err := renderRuntimes(&out, rs, false); err != nil {
		t.Fatal(err)
	}
	noRawEscapes(t, "engine runtimes", out.String())
	if lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n"); len(lines) != 2 || strings.HasPrefix(lines[1], "globex") {
		t.Errorf("a runtime's version adds a row to engine runtimes:\n%s", out.String())
	}
	if !strings.Contains(out.String(), `evil\x1b]0;pwned\x07`) {
		t.Errorf("engine runtimes does not show the metadata escaped:\n%s", out.String())
	}
}
