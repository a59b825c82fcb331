package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/forensics"
	"github.com/turnstone-dev/turnstone/internal/web"
	"github.com/turnstone-dev/turnstone/projections"
)

type env struct {
	js    jetstream.JetStream
	log   *events.Log
	fleet *forensics.IndexMirror
	srv   *httptest.Server
}

// newEnv starts an embedded server with the event log and the fleet
// index, and the web view over them; fill runs before the fleet loads.
func newEnv(t testing.TB, fill func(js jetstream.JetStream, log *events.Log)) *env {
	t.Helper()
	ctx := context.Background()
	srv := embeddedtest.Start(t)
	_, js := embeddedtest.Connect(t, srv)
	log, err := events.Open(ctx, js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := projections.EnsureIndexBucket(ctx, js, 1); err != nil {
		t.Fatal(err)
	}
	if fill != nil {
		fill(js, log)
	}
	fleet, err := forensics.OpenIndexMirror(ctx, js, log, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close)
	w, err := web.New(web.Config{Log: log, Index: fleet}, nil)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(w.Handler())
	t.Cleanup(hs.Close)
	return &env{js: js, log: log, fleet: fleet, srv: hs}
}

func (e *env) get(t testing.TB, path string) (int, string, http.Header) {
	t.Helper()
	resp, err := http.Get(e.srv.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b), resp.Header
}

// putSummaries writes n summaries straight to the index bucket (as the
// engines would, without any event in the log), asynchronously.
var base = time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)

func putSummaries(t testing.TB, js jetstream.JetStream, n int) {
	t.Helper()
	statuses := []string{string(projections.StatusIdle), string(projections.StatusIdle), string(projections.StatusIdle), string(projections.StatusBroken), string(projections.StatusPaused), string(projections.StatusInTurn)}
	for i := range n {
		s := projections.Summary{
			Tenant: fmt.Sprintf("tenant%02d", i%20), Session: fmt.Sprintf("s%06d", i), Partition: i % 8,
			Status: projections.SessionStatus(statuses[i%len(statuses)]), Kind: "main", Runtime: fmt.Sprintf("claude-code 2.1.%d", i%3), Model: []string{"claude-opus-4-6", "claude-sonnet-4-5"}[i%2],
			Counts: projections.Counts{TurnsTotal: i % 7, ViolationsOpen: i % 4 / 3, ViolationsTotal: i % 4 / 3}, Events: 10 + i%50, FirstSeq: uint64(i*10 + 1), LastSeq: uint64(i*10 + 9),
			LastTime: base.Add(time.Duration(i) * time.Second), Anomalous: i%6 == 3,
		}
		b, _ := json.Marshal(s)
		if _, err := js.PublishAsync("$KV."+projections.IndexBucket+"."+projections.IndexKey(s.Partition, s.Tenant, s.Session), b); err != nil {
			t.Fatal(err)
		}
		if i%5000 == 4999 {
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(30 * time.Second):
				t.Fatal("async publish stalled")
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("async publish stalled")
	}
}

var rowRE = regexp.MustCompile(`<tr data-session="([^"]+)" data-status="([^"]+)"`)

// TestSessionsPageAt100kSessions: the fleet index holds 100,000
// summaries and the log no event at all, so a page that restored a
// session could not render; the sessions page lists, filters and pages
// them from the in-memory copy. The timings are logged (the figures are
// in BENCHMARKS.md; BenchmarkSessionsPage100k measures them).
//
// Under the race detector and -short it writes 20,000 summaries: loading
// and filtering them is the same code (every filter, the last page, a
// session search, the watch), only ten times slower under race; every
// expectation is derived from n. The full 100,000 run without race in
// CI's full-size pass.
func TestSessionsPageAt100kSessions(t *testing.T) {
	t.Parallel()
	n := 100_000
	if raceEnabled || testing.Short() {
		n = 20_000
	}
	start := time.Now()
	e := newEnv(t, func(js jetstream.JetStream, _ *events.Log) { putSummaries(t, js, n) })
	wrote := time.Since(start)
	start = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.fleet.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	loaded := time.Since(start)
	if e.fleet.Len() != n {
		t.Fatalf("the fleet copy holds %d sessions, want %d", e.fleet.Len(), n)
	}
	// Each case's expected matches count the generator's sessions (see
	// putSummaries: tenant i%20, status by i%6, runtime 2.1.(i%3), model
	// by i%2, anomalous when i%6 == 3, last event base+i seconds).
	// since leaves the last 40 sessions (2026-11-23T03:46:00Z at 100,000);
	// the session search matches the last ten (s09999 at 100,000); the
	// last page is n/50 (2000 at 100,000).
	since := base.Add(time.Duration(n-40) * time.Second)
	search := fmt.Sprintf("s%05d", (n-1)/10)
	cases := []struct {
		path   string
		match  func(i int) bool
		status string
	}{
		{"/ui/", func(int) bool { return true }, ""},
		{"/ui/?status=broken", func(i int) bool { return i%6 == 3 }, "broken"},
		{"/ui/?tenant=tenant08&status=paused", func(i int) bool { return i%20 == 8 && i%6 == 4 }, "paused"},
		{"/ui/?model=sonnet&runtime=2.1.0&anomalous=1", func(i int) bool { return i%2 == 1 && i%3 == 0 && i%6 == 3 }, ""},
		{"/ui/?model=opus&anomalous=1", func(i int) bool { return i%2 == 0 && i%6 == 3 }, ""},
		{fmt.Sprintf("/ui/?page=%d", n/50), func(int) bool { return true }, ""},
		{"/ui/?session=" + search, func(i int) bool { return strings.Contains(fmt.Sprintf("s%06d", i), search) }, ""},
		{"/ui/?since=" + since.Format(time.RFC3339), func(i int) bool { return !base.Add(time.Duration(i) * time.Second).Before(since) }, ""},
	}
	for _, c := range cases {
		want := 0
		for i := range n {
			if c.match(i) {
				want++
			}
		}
		wantRows := min(50, want)
		t0 := time.Now()
		code, body, _ := e.get(t, c.path)
		took := time.Since(t0)
		if code != 200 {
			t.Fatalf("%s: %d %s", c.path, code, body)
		}
		rows := rowRE.FindAllStringSubmatch(body, -1)
		total := regexp.MustCompile(`<strong id="total">(\d+)</strong> of (\d+) sessions`).FindStringSubmatch(body)
		if total == nil || total[1] != fmt.Sprint(want) || total[2] != fmt.Sprint(n) || len(rows) != wantRows {
			t.Errorf("%s: total %v, %d rows; want %d of %d, %d rows", c.path, total, len(rows), want, n, wantRows)
		}
		for _, r := range rows {
			if c.status != "" && r[2] != c.status {
				t.Errorf("%s: row %s has status %s", c.path, r[1], r[2])
			}
		}
		t.Logf("%-50s %6d matches, %2d rows in %s", c.path, want, len(rows), took.Round(time.Millisecond))
	}
	// Latest first, in triage order: the newest summary that needs
	// attention (broken or paused: i%6 is 3 or 4) leads the first page
	// (at 100,000 the newest of all, broken).
	latest := n - 1
	for latest%6 != 3 && latest%6 != 4 {
		latest--
	}
	_, body, _ := e.get(t, "/ui/")
	if rows := rowRE.FindAllStringSubmatch(body, 2); rows[0][1] != fmt.Sprintf("tenant%02d/s%06d", latest%20, latest) {
		t.Errorf("first row %s, want the latest session that needs attention", rows[0][1])
	}
	// A change reaches the copy through the watch.
	kv, _ := e.js.KeyValue(ctx, projections.IndexBucket)
	upd, _ := json.Marshal(projections.Summary{Tenant: "tenant00", Session: "s000000", Status: projections.StatusBroken, LastTime: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)})
	if _, err := kv.Put(ctx, projections.IndexKey(0, "tenant00", "s000000"), upd); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if s, ok := e.fleet.Get("tenant00", "s000000"); ok && s.Status == projections.StatusBroken {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fleet copy did not follow a write to the index")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, body, _ := e.get(t, "/ui/"); !strings.Contains(body, `data-session="tenant00/s000000" data-status="broken"`) {
		t.Error("the updated session does not lead the first page")
	}
	t.Logf("wrote %d summaries in %s; the fleet copy loaded in %s", n, wrote.Round(time.Millisecond), loaded.Round(time.Millisecond))
}

// BenchmarkSessionsPage100k measures one sessions page (the first, and a
// filtered one) over a fleet index of 100,000 sessions.
func BenchmarkSessionsPage100k(b *testing.B) {
	e := newEnv(b, func(js jetstream.JetStream, _ *events.Log) { putSummaries(b, js, 100_000) })
	if err := e.fleet.Ready(context.Background()); err != nil {
		b.Fatal(err)
	}
	for _, path := range []string{"/ui/", "/ui/?status=broken&runtime=2.1.1", "/ui/?page=1000"} {
		b.Run(path, func(b *testing.B) {
			for b.Loop() {
				if code, _, _ := e.get(b, path); code != 200 {
					b.Fatal(code)
				}
			}
		})
	}
}

// TestEventTextIsEscaped: text from events never renders as HTML, and
// every page carries a policy that allows the engine's origin only.
func TestEventTextIsEscaped(t *testing.T) {
	t.Parallel()
	const evil = `<script>alert("x")</script><img src=x onerror=alert(1)>`
	e := newEnv(t, nil)
	ctx := context.Background()
	var evs []events.Event
	add := func(turn string, p events.Payload) {
		ev, err := events.New("acme", "s1", turn, p)
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	add("", &events.SessionStarted{Runtime: evil, Model: "m"})
	add("t1", &events.TurnStarted{Prompt: evil})
	add("t1", &events.MessageAppended{Role: events.RoleUser, Content: []events.ContentBlock{{Type: "text", Text: evil}}})
	add("t1", &events.MessageAppended{Role: events.RoleAssistant, Content: []events.ContentBlock{{Type: "tool_use", ID: "toolu_1", Name: evil, Input: []byte(`{"x":"</pre><script>alert(2)</script>"}`)}}})
	add("t1", &events.TurnFailed{Stage: events.StageExecute, Error: events.ErrorInfo{Message: evil}})
	acks, err := e.log.Append(ctx, evs)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/ui/session/acme/s1", fmt.Sprintf("/ui/session/acme/s1/event/%d", acks[1].Seq), "/ui/session/acme/s1/diff?from=0"} {
		code, body, hdr := e.get(t, path)
		if code != 200 {
			t.Fatalf("%s: %d %s", path, code, body)
		}
		if strings.Contains(body, "<script>alert") || strings.Contains(body, "<img src=x") {
			t.Errorf("%s renders event text as HTML", path)
		}
		if !strings.Contains(body, "&lt;script&gt;") && !strings.Contains(body, `\u003cscript`) && !strings.Contains(body, "&#34;") {
			t.Errorf("%s does not show the escaped text", path)
		}
		csp := hdr.Get("Content-Security-Policy")
		if !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") || hdr.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: headers %v", path, hdr)
		}
	}
	// Every script and stylesheet is the engine's own.
	_, body, _ := e.get(t, "/ui/session/acme/s1")
	for _, m := range regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(body, -1) {
		if strings.Contains(m[1], "//") {
			t.Errorf("the page refers to another host: %s", m[1])
		}
	}
	for _, asset := range []string{"/ui/static/app.css", "/ui/static/app.js", "/ui/static/favicon.svg"} {
		if code, _, _ := e.get(t, asset); code != 200 {
			t.Errorf("%s: %d", asset, code)
		}
	}
	// A raw event as JSON is the masked body.
	code, body, hdr := e.get(t, fmt.Sprintf("/ui/session/acme/s1/event/%d?format=json", acks[1].Seq))
	if code != 200 || hdr.Get("Content-Type") != "application/json" || !json.Valid([]byte(body)) {
		t.Errorf("raw JSON: %d %s %q", code, hdr.Get("Content-Type"), body)
	}
	// Errors are pages too.
	for path, want := range map[string]int{
		"/ui/session/acme/nosuch":               404,
		"/ui/session/acme/s1/event/999999":      404,
		"/ui/session/acme/s1?until_seq=x":       400,
		"/ui/session/acme/s1/diff?from=9&to=2":  400,
		"/ui/?status=happy":                     400,
		"/ui/incidents/inc-000000000000":        404,
		"/ui/session/acme/s1/diff?from=nothing": 400,
	} {
		if code, body, _ := e.get(t, path); code != want {
			t.Errorf("%s: %d, want %d: %s", path, code, want, body)
		}
	}
}
