package test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/turnstone-dev/turnstone/internal/claudecode"
	"github.com/turnstone-dev/turnstone/internal/enginetest"
	"github.com/turnstone-dev/turnstone/internal/forensics"
	"github.com/turnstone-dev/turnstone/internal/web"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
	"github.com/turnstone-dev/turnstone/refruntime"
)

// TestWebViewTriageInChromium drives fleet triage in a real Chromium (issue
// 20): a fleet of healthy sessions and four broken ones (a crash abandoned
// by hand and repaired, a 401, a logic error in the history stage, and a
// real transcript whose tools failed). The sessions list puts the ones
// that need attention first and says what happened to each; "with
// anomalies" says what; the incidents page starts with a table, one
// incident per cause, labelled with what happened; the session page reads
// resolved counts as resolved, draws its stage labels apart and its bands
// on a time axis, and counts tool errors. Each page is saved as a
// screenshot.
func TestWebViewTriageInChromium(t *testing.T) {
	skipShort(t, "drives Chromium")
	parallel(t)
	ctx := context.Background()
	eng := enginetest.Start(t, enginetest.Options{Policy: "budget:\n  same_error_limit: 1000\n  same_output_limit: 1000\n"})
	fleet, addr := serveWebView(t, eng)
	base := "http://" + addr + web.Prefix
	b := newBrowser(t, artifacts(t, "web-triage"))

	rt := eng.Runtime // tenant acme, answering control requests
	tools := []refruntime.ToolSpec{{Name: "Read", Input: json.RawMessage(`{"file_path":"README.md"}`), Result: "# Project"}}
	run := func(session string, spec refruntime.TurnSpec) refruntime.TurnResult {
		t.Helper()
		res, err := rt.RunTurn(ctx, session, spec)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// The broken ones first, the healthy ones after: by last event alone
	// the healthy ones would hide them.
	run("crash", refruntime.TurnSpec{Tools: tools})
	crashed := run("crash", refruntime.TurnSpec{Tools: tools, Fault: refruntime.FaultCrashMidTool{}})
	run("auth", refruntime.TurnSpec{Fault: refruntime.FaultProvider{Status: 401}})
	run("logic", refruntime.TurnSpec{Fault: refruntime.FaultStageThrows{Stage: "history"}})
	abandon := recovery.NewCommand(recovery.KindAbandonTurn, "acme", "crash", crashed.Turn, "runtime crashed", []uint64{crashed.LastSeq})
	abandon.IssuedBy = "engine recovery issue"
	if _, _, err := recovery.Issue(ctx, eng.JS, abandon); err != nil {
		t.Fatal(err)
	}
	eng.Eventually(t, "the crash abandoned by hand and its orphan repaired", "acme", "crash", 100*time.Millisecond, func(s *projections.Session) bool {
		return s.Counts().OrphansRepaired == 1
	})
	// A real transcript whose user turned two tool calls down (is_error).
	if _, err := claudecode.Import(ctx, claudecode.LogStore(eng.Log), []string{filepath.Join(transcriptsDir, "spotter", "short.jsonl")},
		claudecode.Options{Tenant: "real"}, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		run(fmt.Sprintf("healthy-%02d", i), refruntime.TurnSpec{Tools: tools})
	}
	waitFor(t, "the index holds every session, the crash repaired, the 401's retry ended", func() bool {
		s, ok := fleet.Get("acme", "crash")
		a, aok := fleet.Get("acme", "auth")
		return fleet.Len() == 16 && ok && s.Triage.Outcome == "recovered" &&
			aok && a.Triage.Recovery == "retry_turn" && a.Triage.Outcome != "" && a.Triage.Outcome != "running"
	})

	// Sessions: the ones that need attention first, what happened said.
	b.open(base)
	rows, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("table#sessions tbody tr[data-session]")).map(function(r){return r.dataset.session+"|"+r.dataset.attention+"|"+r.dataset.anomalous})`))
	if err != nil {
		t.Fatal(err)
	}
	rank := func(r string) int {
		switch {
		case strings.Contains(r, "|true|"):
			return 0
		case strings.HasSuffix(r, "|true"):
			return 1
		}
		return 2
	}
	for i := 1; i < len(rows); i++ {
		if rank(rows[i]) < rank(rows[i-1]) {
			t.Errorf("the sessions list puts %s after %s: %v", rows[i], rows[i-1], rows)
		}
	}
	if len(rows) != 16 || rank(rows[0]) != 0 || !strings.HasPrefix(rows[0], "acme/auth|") {
		t.Errorf("the sessions list starts with %v, want the paused 401 first", rows)
	}
	// The crash: abandoned by hand, then two commands (the abandon, which
	// told the runtime, and the repair), both recovered; the latest one
	// is named.
	if got := b.text(`tr[data-session="acme/crash"] td.triage`); got != "turn abandoned by hand · repair_orphans recovered" && got != "turn abandoned by hand · abandon_turn recovered" {
		t.Errorf("the crash reads %q", got)
	}
	for sel, want := range map[string]string{
		`tr[data-session="acme/auth"] td.triage`:  "turn failed in execute · retry_turn failed",
		`tr[data-session="acme/logic"] td.triage`: "turn failed in history",
	} {
		if got := b.text(sel); got != want {
			t.Errorf("%s reads %q, want %q", sel, got, want)
		}
	}
	if b.count(`tr[data-session="acme/healthy-00"] td.triage .muted`) != 1 {
		t.Errorf("a healthy session says something happened: %q", b.text(`tr[data-session="acme/healthy-00"] td.triage`))
	}
	b.screenshot("sessions-triage.png")
	// By last event, the healthy ones come first.
	b.open(base + "?order=recent")
	if first := b.text("table#sessions tbody tr td.id"); !strings.HasPrefix(first, "healthy-") {
		t.Errorf("?order=recent starts with %q", first)
	}
	// With anomalies: each row says what.
	b.open(base + "?anomalous=1")
	if n := b.count("table#sessions tbody tr[data-session]"); n != 3 {
		t.Errorf("with anomalies lists %d sessions, want the crash, the 401 and the logic error", n)
	}
	if n := b.count(`table#sessions tbody tr[data-session] td.triage[data-anomaly=""]`); n != 0 {
		t.Errorf("%d anomalous sessions do not say what happened", n)
	}
	b.screenshot("sessions-anomalies.png")

	// Incidents: a table first, one incident per cause, labels that say
	// what happened.
	b.open(base + "incidents")
	table := "table#incident-table tbody tr"
	if n, cards := b.count(table), b.count("article.incident"); n != 3 || cards != 3 {
		t.Errorf("the incidents page has %d table rows and %d cards, want 3 and 3 (one per cause)", n, cards)
	}
	if top, err := chromedp.Run(b.ctx, chromedp.Evaluate[float64](`document.getElementById("incident-table").getBoundingClientRect().top - document.querySelector("article.incident").getBoundingClientRect().top`)); err != nil || top >= 0 {
		t.Errorf("the table is not above the cards (%v, %v)", top, err)
	}
	for _, r := range []struct{ class, severity, label, key string }{
		{"turn_abandoned", "low", "turn abandoned by hand, 1 orphaned tool_use", "runtime refruntime"},
		{"authentication", "high", "authentication: authentication_error (401)", "provider anthropic · code 401"},
		{"logic", "high", "logic error in stage history", "runtime refruntime"},
	} {
		row := fmt.Sprintf(`%s[data-class=%q]`, table, r.class)
		if b.count(row) != 1 {
			t.Errorf("no incident row of class %s", r.class)
			continue
		}
		if got := b.text(row + " td .sev"); got != r.severity {
			t.Errorf("%s: severity %q, want %q", r.class, got, r.severity)
		}
		if got := b.text(row + " td.label"); got != r.label {
			t.Errorf("%s: label %q, want %q", r.class, got, r.label)
		}
		if got := b.text(row + " td.key"); !strings.HasPrefix(got, r.key) {
			t.Errorf("%s: key %q, want it to start with %q", r.class, got, r.key)
		}
	}
	if strings.Contains(b.text(table+`[data-class="logic"] td.key`), "provider") {
		t.Errorf("a logic error is keyed by a provider: %q", b.text(table+`[data-class="logic"] td.key`))
	}
	for _, class := range []string{"tool_use_without_result", "recovery_failed", "invalid_request"} {
		if b.count(fmt.Sprintf(`%s[data-class=%q]`, table, class)) != 0 {
			t.Errorf("an incident of class %s stands apart from its cause", class)
		}
	}
	if sev := b.text(table + " td .sev"); sev != "high" {
		t.Errorf("the table starts with a %q incident, want the most severe", sev)
	}
	if h := b.text(`article.incident[data-class="turn_abandoned"] .hypothesis`); !strings.Contains(h, "abandoned by hand") || strings.Contains(h, "deadline") {
		t.Errorf("the crash's evidence reads %q", h)
	}
	b.screenshot("incidents-table.png")

	// The crash's page: resolved counts read as resolved, the abandon by
	// hand, the stage labels apart, a time axis.
	b.open(base + "session/acme/crash")
	if got := b.text("#count-violations"); got != "0" {
		t.Errorf("open violations %q, want 0", got)
	}
	if got := b.text("#count-violations + .sub"); !strings.Contains(got, "1 resolved of 1") {
		t.Errorf("the violations read %q, want 1 resolved of 1", got)
	}
	if got := b.text("#count-repaired"); got != "1 repaired" {
		t.Errorf("the orphans read %q", got)
	}
	if got := b.text(`.band[data-status="abandoned"] .abandoned-by`); got != "abandoned by hand" {
		t.Errorf("the abandoned turn reads %q", got)
	}
	checkBands(t, b, true)
	b.screenshot("session-crash.png")

	// The real transcript's page: its tool errors are counted.
	var real string
	for _, s := range fleet.Summaries() {
		if s.Tenant == "real" {
			real = s.Session
		}
	}
	st := eng.State(t, "real", real)
	if st.Totals.ToolErrors != 2 {
		t.Fatalf("the transcript's fold counts %d tool errors, want its 2 is_error results", st.Totals.ToolErrors)
	}
	b.open(base + "session/real/" + real)
	if got, red := b.text("#count-errors"), b.count(`svg.gantt .span-error`); got != "2" || red != 2 || !strings.Contains(b.text("#count-errors-split"), "2 tool") {
		t.Errorf("the error counter reads %q (%q) beside %d failed tool calls drawn in red", got, b.text("#count-errors-split"), red)
	}
	checkBands(t, b, false) // a Claude Code transcript records no stages
	b.screenshot("session-tool-errors.png")
}

// serveWebView serves the web view of eng on a free port of the loopback,
// with the fleet index in memory, until the test ends; it returns the
// fleet and the view's address (HOST:PORT).
func serveWebView(t *testing.T, eng *enginetest.Engine) (*forensics.IndexMirror, string) {
	t.Helper()
	fleet, err := forensics.OpenIndexMirror(context.Background(), eng.JS, eng.Log, eng.Engine.Store, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close)
	ui, err := web.New(web.Config{Addr: "127.0.0.1:0", Log: eng.Log, Store: eng.Engine.Store, Index: fleet}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ui.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ui.Close(context.Background()) })
	return fleet, ui.Addr()
}

// checkBands checks the open session page's turn bands: no two stage
// labels overlap, each drawing has a time axis with marks, and (stages)
// stages are drawn.
func checkBands(t *testing.T, b *browser, stages bool) {
	t.Helper()
	overlaps, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]string](`(function(){
		var out = [];
		document.querySelectorAll("svg.gantt").forEach(function(svg, n){
			var boxes = Array.from(svg.querySelectorAll("g.tick text")).map(function(t){ return [t.textContent, t.getBoundingClientRect()]; });
			for (var i = 0; i < boxes.length; i++) for (var j = i+1; j < boxes.length; j++) {
				var a = boxes[i][1], c = boxes[j][1];
				if (a.left < c.right && c.left < a.right && a.top < c.bottom && c.top < a.bottom) out.push("band " + n + ": " + boxes[i][0] + " / " + boxes[j][0]);
			}
		});
		return out; })()`))
	if err != nil {
		t.Fatal(err)
	}
	if len(overlaps) > 0 {
		t.Errorf("stage labels overlap: %v", overlaps)
	}
	drawings, axes := b.count("svg.gantt"), b.count("svg.gantt g.axis")
	if drawings == 0 || axes != drawings || b.count("svg.gantt g.axis text") < 2*drawings {
		t.Errorf("%d drawings, %d time axes, %d axis labels", drawings, axes, b.count("svg.gantt g.axis text"))
	}
	if stages && b.count("svg.gantt g.tick") == 0 {
		t.Errorf("no stage is drawn")
	}
}
