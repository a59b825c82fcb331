package test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/turnstone-dev/turnstone/internal/claudecode"
	"github.com/turnstone-dev/turnstone/internal/enginetest"
	"github.com/turnstone-dev/turnstone/internal/web"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// chromiumPath is the Chromium the browser tests drive: $TURNSTONE_CHROMIUM,
// else Debian's /usr/bin/chromium. A missing browser fails the test, never
// skips it.
func chromiumPath(t *testing.T) string {
	t.Helper()
	p := os.Getenv("TURNSTONE_CHROMIUM")
	if p == "" {
		p = "/usr/bin/chromium"
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("the browser tests need Chromium at %s (%v): install Debian's package with "+
			"`apt-get update && apt-get install -y chromium` (.ci/run does when /usr/bin/chromium is missing), "+
			"or set TURNSTONE_CHROMIUM to a Chromium binary", p, err)
	}
	return p
}

// artifacts is the folder the test saves its screenshots in:
// $TURNSTONE_TEST_ARTIFACTS/<name> (CI keeps it), else a folder under
// t.TempDir().
func artifacts(t *testing.T, name string) string {
	t.Helper()
	base := os.Getenv("TURNSTONE_TEST_ARTIFACTS")
	if base == "" {
		base = t.TempDir()
	}
	dir := filepath.Join(base, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// browser is a headless Chromium with one tab, recording every request the
// pages make.
type browser struct {
	t    *testing.T
	ctx  context.Context
	dir  string
	mu   sync.Mutex
	reqs []string
}

func newBrowser(t *testing.T, dir string) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		// Without these Chromium reaches for Google's services, and its
		// connections are refused on a closed network.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	b := &browser{t: t, ctx: ctx, dir: dir}
	// The first call starts the browser; it must not carry a timeout.
	if err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok {
			b.mu.Lock()
			b.reqs = append(b.reqs, e.Request.URL)
			b.mu.Unlock()
		}
	}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return b
}

// do runs actions with a bound.
func (b *browser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

func (b *browser) open(u string) { b.t.Helper(); b.do("open "+u, chromedp.Navigate(u)) }

// count is how many elements match the CSS selector.
func (b *browser) count(sel string) int {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
	if err != nil {
		b.t.Fatalf("count %s: %v", sel, err)
	}
	return n
}

// text is the text of the first element the CSS selector matches ("" for none).
func (b *browser) text(sel string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](fmt.Sprintf("(document.querySelector(%q) || {}).textContent || ''", sel)))
	if err != nil {
		b.t.Fatalf("text %s: %v", sel, err)
	}
	return strings.Join(strings.Fields(s), " ")
}

func (b *browser) screenshot(name string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	p := filepath.Join(b.dir, name)
	if err := os.WriteFile(p, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	return p
}

// requests returns the URLs the pages asked for so far.
func (b *browser) requests() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.reqs...)
}

// sidechainParent is the shipped session whose subagents
// TestWebViewInChromium opens from it.
const sidechainParent = "258c7280-ae70-4798-800f-63464d01a85d"

// TestWebViewInChromium drives the web view of a real engine in a real
// headless Chromium: the sessions page after importing the shipped
// transcripts (corpusSample's under the race detector; all of them in
// scripts/fullsize) and after a crash (a transcript cut right after a tool_use);
// the crashed session, its orphan marked at the event that declared it;
// the repair (issued by hand: imported transcripts are history) with its
// attempt and outcome; the state before the repair through the scrubber;
// a raw event; a sidechain opened from its parent; the incidents. The
// pages ask no host but the engine for anything.
func TestWebViewInChromium(t *testing.T) {
	skipShort(t, "drives Chromium")
	parallel(t)
	started := time.Now()
	ctx := context.Background()
	// The reconciler of this branch acts on imported sessions; this policy
	// leaves the orphan to the repair issued by hand and keeps the shipped
	// transcripts' repeated outputs from pausing their sessions.
	eng := enginetest.Start(t, enginetest.Options{Policy: "orphans:\n  repair: false\nbudget:\n  implementation_attempts: 1000\n  same_error_limit: 1000\n  same_output_limit: 1000\n"})
	fleet, addr := serveWebView(t, eng)
	base := "http://" + addr
	b := newBrowser(t, artifacts(t, "web-browser"))

	// The shipped transcripts (under the race detector, corpusSample's
	// sample: the pages' claims hold for any number of sessions, and the
	// import into this process's engine was most of the test's time; the
	// parent whose sidechain it opens below is kept).
	files := corpusSample(t, transcripts(t), filepath.Join(transcriptsDir, "spotter", sidechainParent+".jsonl"))
	if _, err := claudecode.Import(ctx, claudecode.LogStore(eng.Log), files, claudecode.Options{}, nil); err != nil {
		t.Fatal(err)
	}
	refs, err := eng.Log.Sessions(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the fleet index holds every imported session", func() bool { return fleet.Len() == len(refs) })
	b.open(base + "/ui/")
	if n := b.count("table#sessions tbody tr[data-session]"); n != min(len(refs), 50) {
		t.Fatalf("the sessions page lists %d sessions, want %d", n, len(refs))
	}
	if got := b.text("#total"); got != fmt.Sprint(len(refs)) {
		t.Errorf("the sessions page counts %q sessions, want %d", got, len(refs))
	}
	b.screenshot("sessions.png")

	// A crash: the transcript cut right after an assistant tool_use.
	cut, ids := cutAfterToolUse(t, filepath.Join(transcriptsDir, "spotter/tool_heavy.jsonl"), 3)
	// The person's next prompt shows the tool never answered (a transcript's
	// end alone leaves the turn in flight: the runtime may still be at it).
	cut = nextPrompt(t, cut)
	if _, err := claudecode.Import(ctx, claudecode.LogStore(eng.Log), []string{cut}, claudecode.Options{Tenant: "crash"}, nil); err != nil {
		t.Fatal(err)
	}
	crashRefs, err := eng.Log.Sessions(ctx, "crash")
	if err != nil || len(crashRefs) != 1 {
		t.Fatalf("crash sessions %v, %v", crashRefs, err)
	}
	session := crashRefs[0].Session
	waitFor(t, "the index shows the crashed session broken", func() bool {
		s, ok := fleet.Get("crash", session)
		return ok && s.Status == projections.StatusBroken && s.Counts.OrphansOpen == len(ids)
	})
	b.open(base + "/ui/?tenant=crash")
	if got := b.text(`tr[data-session="crash/` + session + `"] .status`); got != "broken" {
		t.Fatalf("the crashed session shows status %q, want broken", got)
	}
	// Open it from the list.
	b.do("open the crashed session", chromedp.Click(chromedp.CSS(`tr[data-session="crash/`+session+`"] td.id a`)), chromedp.WaitVisible(chromedp.CSS("#state")))
	broken := eng.State(t, "crash", session)
	if len(broken.Orphans) != len(ids) {
		t.Fatalf("the fold has orphans %+v, want %v", broken.Orphans, ids)
	}
	orphan := broken.Orphans[len(broken.Orphans)-1]
	declared := orphan.DeclaredSeq
	// The orphan is marked at the event that declared it, and only there.
	sel := fmt.Sprintf(`tr#e%d .anomaly[data-rule="tool_use_without_result"][data-tool-use=%q]`, declared, orphan.ToolUseID)
	if b.count(sel) != 1 || b.count(`tr.ev .anomaly[data-rule="tool_use_without_result"]`) != len(ids) {
		t.Fatalf("the orphan %s is not marked at seq %d (the event that declared it): %d marks there, %d in all",
			orphan.ToolUseID, declared, b.count(sel), b.count(`tr.ev .anomaly[data-rule="tool_use_without_result"]`))
	}
	if b.count(fmt.Sprintf(`tr#e%d .tag.orphan[data-orphan=%q]`, orphan.Seq, orphan.ToolUseID)) != 1 {
		t.Errorf("the tool_use record at seq %d is not marked orphaned", orphan.Seq)
	}
	if b.text("#state .state-head .status") != "broken" || b.text("#count-orphans") != fmt.Sprint(len(ids)) {
		t.Errorf("the crashed session shows %q with %s open orphans", b.text("#state .state-head .status"), b.text("#count-orphans"))
	}
	if b.count(fmt.Sprintf(`svg.gantt .span-orphaned[data-tool-use=%q]`, orphan.ToolUseID)) != 1 {
		t.Errorf("the orphan's tool call is not drawn as an orphaned span")
	}
	b.screenshot("session-crashed.png")

	// The repair, by hand, with a worker running.
	cmd := recovery.NewCommand(recovery.KindRepairOrphans, "crash", session, "", "repair by hand (the browser test)", []uint64{declared})
	cmd.IssuedBy = "web-browser-test"
	if _, _, err := recovery.Issue(ctx, eng.JS, cmd); err != nil {
		t.Fatal(err)
	}
	repaired := eng.Eventually(t, "the orphan repaired", "crash", session, time.Second, func(s *projections.Session) bool {
		c := s.Command(cmd.ID)
		return len(s.OrphanedToolUseIDs()) == 0 && c != nil && c.Outcome != ""
	})
	rc := repaired.Command(cmd.ID)
	if rc.Outcome != "recovered" {
		t.Fatalf("the repair ended %q: %+v", rc.Outcome, rc)
	}
	var repairSeq uint64
	for _, o := range repaired.Orphans {
		if o.ToolUseID == orphan.ToolUseID {
			repairSeq = o.RepairedSeq
		}
	}
	// Repaired, it is no longer broken: the next prompt's turn is in flight.
	waitFor(t, "the index shows the session repaired and in its next turn", func() bool {
		s, ok := fleet.Get("crash", session)
		return ok && s.Status == projections.StatusInTurn && s.Counts.OrphansOpen == 0
	})
	b.open(base + web.Prefix + "session/crash/" + session)
	if b.count(sel) != 1 {
		t.Errorf("after the repair the orphan is no longer marked at seq %d", declared)
	}
	cmdSel := fmt.Sprintf(`.command[data-command=%q][data-kind="repair_orphans"][data-outcome="recovered"]`, cmd.ID)
	if b.count(cmdSel) != 1 || b.count(cmdSel+" ol.attempts li") != rc.Attempts {
		t.Fatalf("the repair and its outcome are not shown: %d commands, %d attempts (want %d)", b.count(cmdSel), b.count(cmdSel+" ol.attempts li"), rc.Attempts)
	}
	if !strings.Contains(b.text(cmdSel), "recovered by repair_orphans") {
		t.Errorf("the command reads %q", b.text(cmdSel))
	}
	if b.count(fmt.Sprintf(`tr#e%d.is-synthetic`, repairSeq)) != 1 || b.count(`#history .msg.synthetic`) != 1 {
		t.Errorf("the synthetic tool_result (seq %d) is not marked in the timeline and the history", repairSeq)
	}
	if b.count(fmt.Sprintf(`#orphans li[data-tool-use=%q][data-repaired="true"]`, orphan.ToolUseID)) != 1 ||
		b.count(fmt.Sprintf(`svg.gantt .span-repaired[data-tool-use=%q]`, orphan.ToolUseID)) != 1 {
		t.Errorf("the orphan is not shown repaired")
	}
	if len(ids) > 1 {
		// The calls were in flight together when the runtime died: side by
		// side, one lane each.
		lanes, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("svg.gantt .span-repaired")).map(function(g){return g.dataset.lane})`))
		if err != nil || len(lanes) != len(ids) || len(slices.Compact(slices.Sorted(slices.Values(lanes)))) != len(ids) {
			t.Errorf("the parallel orphaned calls are drawn in lanes %v (%v), want one lane each", lanes, err)
		}
	}
	if b.text("#state .state-head .status") != "in_turn" || b.text("#count-resolved") != fmt.Sprint(len(ids)) {
		t.Errorf("after the repair the session shows %q, %s resolved", b.text("#state .state-head .status"), b.text("#count-resolved"))
	}
	b.screenshot("session.png")

	// The scrubber: the state just before the repair.
	before := repairSeq - 1
	b.do("scrub to before the repair",
		chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := chromedp.Evaluate[bool](fmt.Sprintf(`(function(){var s=document.getElementById("scrub"); s.value=%d; s.dispatchEvent(new Event("change")); return true})()`, before))(ctx, tg)
			return err
		}),
		chromedp.WaitVisible(chromedp.CSS(`#state[data-latest="false"]`)),
	)
	loc, _ := chromedp.Run(b.ctx, chromedp.Location())
	if !strings.Contains(loc, fmt.Sprintf("until_seq=%d", before)) {
		t.Errorf("the scrubber went to %s", loc)
	}
	if b.text("#state .state-head .status") != "broken" || b.text("#count-orphans") != fmt.Sprint(len(ids)) ||
		b.count(`.command[data-outcome="recovered"]`) != 0 || b.count(`#history .msg.synthetic`) != 0 ||
		b.count(fmt.Sprintf(`#orphans li[data-tool-use=%q][data-repaired="false"]`, orphan.ToolUseID)) != 1 ||
		b.count(fmt.Sprintf(`tr#e%d .tag.orphan[data-orphan=%q]`, orphan.Seq, orphan.ToolUseID)) != 1 {
		t.Errorf("until_seq=%d does not show the state before the repair: status %q, orphans %s, recovered commands %d, synthetic messages %d",
			before, b.text("#state .state-head .status"), b.text("#count-orphans"), b.count(`.command[data-outcome="recovered"]`), b.count(`#history .msg.synthetic`))
	}
	b.screenshot("session-before-repair.png")

	// The raw event that declared the orphan, masked JSON.
	b.do("open the raw event", chromedp.Click(chromedp.CSS(fmt.Sprintf(`tr#e%d td.raw a`, declared))), chromedp.WaitVisible(chromedp.CSS("#raw-json")))
	// (the end of the orphan's turn: the next prompt ended it).
	if raw := b.text("#raw-json"); !strings.Contains(raw, `"type": "turn.`) || !strings.Contains(raw, fmt.Sprintf(`"turn": %q`, orphan.Turn)) {
		t.Errorf("the raw event reads %q", raw)
	}

	// A sidechain opens from its parent.
	parent := sidechainParent
	b.open(base + web.Prefix + "session/default/" + parent)
	if n := b.count("#related li.child a"); n < 1 {
		t.Fatalf("the parent lists %d linked sessions", n)
	}
	b.do("open a sidechain", chromedp.Click(chromedp.CSS("#related li.child a")), chromedp.WaitVisible(chromedp.CSS("#parent-link")))
	if h := b.text("h1"); !strings.HasPrefix(h, "default/"+parent+"_agent-") {
		t.Errorf("the sidechain page is %q", h)
	}

	// The incidents: the crash's orphan and its repair.
	b.open(base + "/ui/incidents")
	inc := `article.incident[data-class="tool_use_without_result"]`
	if b.count(inc) != 1 || b.count(inc+` tr[data-session="crash/`+session+`"]`) != 1 || !strings.Contains(b.text(inc+" .hypothesis"), "recovered by repair_orphans") {
		t.Errorf("the incidents page lacks the crash: %q", b.text(inc))
	}
	b.screenshot("incidents.png")

	// Nothing was asked of any host but the engine.
	reqs := b.requests()
	engineReqs := 0
	for _, r := range reqs {
		u, err := url.Parse(r)
		if err != nil {
			t.Errorf("request to %q", r)
			continue
		}
		switch {
		case u.Scheme == "data" || u.Scheme == "about":
		case u.Host == addr:
			engineReqs++
		default:
			t.Errorf("the pages asked another host: %s", r)
		}
	}
	if engineReqs < 10 {
		t.Errorf("only %d requests to the engine were seen: %v", engineReqs, reqs)
	}
	t.Logf("%d requests, all to the engine; %s in all", len(reqs), time.Since(started).Round(time.Millisecond))
}

// waitFor polls cond for up to 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached in 20s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
