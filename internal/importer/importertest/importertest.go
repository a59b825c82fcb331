// Package importertest is the behaviour every importer shares, as tests:
// a transcript cut anywhere, imported, then imported whole, gives the
// projection that importing the whole file once gives, and flags nothing
// the whole file does not flag (CutAnywhere). Each importer runs it on its
// real transcripts.
package importertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/importer"
	"github.com/turnstone-dev/turnstone/projections"
)

// Log is a Store whose events can be read back: MemLog, or an event log
// (SessionLog).
type Log interface {
	importer.Store
	// Events returns the session's stored events, in order, with their
	// sequences.
	Events(ctx context.Context, tenant, session string) ([]events.Event, error)
}

// MemLog is an in-memory Log: events per tenant/session, in append order,
// each validated and numbered as the stream would.
type MemLog struct {
	mu       sync.Mutex
	sessions map[string][]events.Event
	ids      map[string]map[string]struct{}
	seq      uint64
}

// NewMemLog returns an empty MemLog.
func NewMemLog() *MemLog {
	return &MemLog{sessions: map[string][]events.Event{}, ids: map[string]map[string]struct{}{}}
}

// Append implements importer.Store: it validates each event and refuses a
// duplicate id, as the log's deduplication would drop it.
func (m *MemLog) Append(ctx context.Context, evs []events.Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := range evs {
		ev := evs[i]
		if err := events.Validate(&ev); err != nil {
			return fmt.Errorf("append: %w", err)
		}
		k := ev.Tenant + "/" + ev.Session
		if _, dup := m.ids[k][ev.ID]; dup {
			return fmt.Errorf("append: event %s appended twice", ev.ID)
		}
		if m.ids[k] == nil {
			m.ids[k] = map[string]struct{}{}
		}
		m.ids[k][ev.ID] = struct{}{}
		m.seq++
		ev.Seq = m.seq
		m.sessions[k] = append(m.sessions[k], ev)
	}
	return nil
}

// EventIDs implements importer.Store.
func (m *MemLog) EventIDs(ctx context.Context, tenant, session string) (map[string]struct{}, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.ids[tenant+"/"+session]), nil
}

// Events implements Log.
func (m *MemLog) Events(ctx context.Context, tenant, session string) ([]events.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.sessions[tenant+"/"+session]), nil
}

// Sessions lists the sessions the log holds for tenant, sorted.
func (m *MemLog) Sessions(tenant string) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for k := range m.sessions {
		if s, ok := strings.CutPrefix(k, tenant+"/"); ok {
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}

// SessionLog is the Log of an event log (events.Log, ingest.Client).
func SessionLog(l events.SessionLog) Log { return sessionLog{importer.LogStore(l), l} }

type sessionLog struct {
	importer.Store
	log events.SessionLog
}

func (s sessionLog) Events(ctx context.Context, tenant, session string) ([]events.Event, error) {
	var evs []events.Event
	err := s.log.ReadSession(ctx, tenant, session, events.ReadOptions{}, func(ev events.Event) error {
		evs = append(evs, ev)
		return nil
	})
	return evs, err
}

// Import converts data, the content of the transcript at path as far as
// it was read, with conv, and appends to log the events it does not hold,
// as importer.Import and the Follower do (the conversion is told which
// events the log holds). It returns the conversion's result.
func Import(t testing.TB, conv importer.Converter, log Log, data []byte, path string, live bool) *importer.Result {
	t.Helper()
	ctx := context.Background()
	res, err := conv.Convert(bytes.NewReader(data), path, importer.Input{Live: live, Stored: func(tenant, session string) (map[string]struct{}, error) {
		return log.EventIDs(ctx, tenant, session)
	}})
	if err != nil {
		t.Fatalf("convert %s: %v", path, err)
	}
	for _, s := range res.Sessions {
		have, err := log.EventIDs(ctx, s.Tenant, s.Session)
		if err != nil {
			t.Fatal(err)
		}
		var missing []events.Event
		for _, ev := range s.Events {
			if _, ok := have[ev.ID]; !ok {
				missing = append(missing, ev)
			}
		}
		if len(missing) > 0 {
			if err := log.Append(ctx, missing); err != nil {
				t.Fatalf("append %s/%s: %v", s.Tenant, s.Session, err)
			}
		}
	}
	return res
}

// Fold folds a session's stored events.
func Fold(evs []events.Event) *projections.Session { return projections.FoldLog(evs) }

// Normal is the projected state as JSON without what depends on how the
// events were cut into records and appended: stream sequences, event
// counts, store times, the tenant. Two imports of one transcript that
// give the same history, turns, tool calls, orphans, violations,
// distillations and streaks have the same Normal.
func Normal(s *projections.Session) any {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		panic(err)
	}
	return strip(v)
}

func strip(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k := range x {
			switch {
			case k == "seq", k == "seqs", k == "seqs_dropped", strings.HasSuffix(k, "_seq"),
				k == "events", k == "tenant", k == "first_stored", k == "last_stored", k == "last_live_stored", k == "seen_at",
				// Store times (signs of life): when an import stored an event.
				k == "active_at", k == "used_at", k == "paused_at", k == "last_abandon_stored":
				delete(x, k)
			default:
				x[k] = strip(x[k])
			}
		}
	case []any:
		for i := range x {
			x[i] = strip(x[i])
		}
	}
	return v
}

// Diff lists where a and b (Normal values) differ, by JSON path, at most
// max of them.
func Diff(a, b any, max int) []string {
	var out []string
	var walk func(path string, a, b any)
	walk = func(path string, a, b any) {
		if len(out) >= max {
			return
		}
		switch x := a.(type) {
		case map[string]any:
			y, ok := b.(map[string]any)
			if !ok {
				out = append(out, fmt.Sprintf("%s: %v != %v", path, short(a), short(b)))
				return
			}
			keys := slices.Sorted(maps.Keys(x))
			for k := range y {
				if _, ok := x[k]; !ok {
					keys = append(keys, k)
				}
			}
			for _, k := range keys {
				walk(path+"."+k, x[k], y[k])
			}
		case []any:
			y, ok := b.([]any)
			if !ok || len(x) != len(y) {
				out = append(out, fmt.Sprintf("%s: %v != %v", path, short(a), short(b)))
				return
			}
			for i := range x {
				walk(fmt.Sprintf("%s[%d]", path, i), x[i], y[i])
			}
		default:
			if fmt.Sprint(a) != fmt.Sprint(b) {
				out = append(out, fmt.Sprintf("%s: %v != %v", path, short(a), short(b)))
			}
		}
	}
	walk("", a, b)
	return out
}

func short(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		b = fmt.Appendf(nil, "%+v", v)
	}
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

// Flags are a state's violations, each as "rule tool_use_id turn".
func Flags(s *projections.Session) map[string]bool {
	out := map[string]bool{}
	for _, v := range s.Violations {
		out[fmt.Sprintf("%s %s %s", v.Rule, v.ToolUseID, v.Turn)] = true
	}
	return out
}

// Lines splits a transcript into its lines, each with its newline.
func Lines(t testing.TB, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	if n := len(lines); n > 0 && lines[n-1] == "" {
		lines = lines[:n-1]
	}
	return lines
}

// CutConfig says how CutAnywhere cuts one transcript.
type CutConfig struct {
	// Format is the transcript's format; Options its conversion options
	// (the tenant is set per cut).
	Format  importer.Format
	Options importer.Options
	// Live reads every cut as a followed file still being written;
	// otherwise as history (an `engine import` of a copy).
	Live bool
	// Cuts are the line counts to cut after; nil: every line.
	Cuts []int
	// NewLog returns the log a cut imports into; nil: a MemLog. A shared
	// log is fine: each cut imports under its own tenant.
	NewLog func(t testing.TB) Log
	// Allow, when set, names differences a cut may make that the format
	// documents (a history import's guess at the end of the file): it
	// gets the cut and the Normal paths that differ, and returns those
	// that are not allowed.
	Allow func(cut int, diffs []string) []string
}

// runs numbers the CutAnywhere calls, so that calls sharing a log import
// under tenants of their own.
var runs atomic.Int64

// CutAnywhere checks the importers' promise on the transcript at path:
// for every cut, importing the first lines, then the whole file, gives
// the projection (Normal) that importing the whole file once gives, and
// the cut alone flags nothing the whole file does not flag. It also grows
// the file through every cut in one log, as a follower reading a file
// being written does, and checks the same. The cuts run in parallel, each
// under its own tenant, so a shared log serves them all.
func CutAnywhere(t *testing.T, cfg CutConfig, path string) {
	t.Helper()
	lines := Lines(t, path)
	whole := []byte(strings.Join(lines, ""))
	newLog := cfg.NewLog
	if newLog == nil {
		newLog = func(testing.TB) Log { return NewMemLog() }
	}
	opts := cfg.Options
	run := fmt.Sprintf("r%d", runs.Add(1))
	conv := func(t testing.TB, tenant string) importer.Converter {
		o := opts
		o.Tenant = tenant
		c, err := cfg.Format.NewConverter(o)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	fold := func(t testing.TB, log Log, tenant string, res *importer.Result) map[string]*projections.Session {
		out := map[string]*projections.Session{}
		for _, s := range res.Sessions {
			evs, err := log.Events(context.Background(), tenant, s.Session)
			if err != nil {
				t.Fatal(err)
			}
			out[s.Session] = Fold(evs)
		}
		return out
	}

	// The whole file, once.
	wlog := newLog(t)
	wres := Import(t, conv(t, run+"whole"), wlog, whole, path, cfg.Live)
	want := fold(t, wlog, run+"whole", wres)
	if len(want) == 0 {
		t.Fatalf("%s gives no session", path)
	}
	wantFlags := map[string]bool{}
	for _, s := range want {
		maps.Copy(wantFlags, Flags(s))
	}

	check := func(t *testing.T, what string, got map[string]*projections.Session, cut int) {
		t.Helper()
		for sess, w := range want {
			g := got[sess]
			if g == nil {
				t.Errorf("%s: session %s missing", what, sess)
				continue
			}
			diffs := Diff(Normal(w), Normal(g), 20)
			if cfg.Allow != nil && len(diffs) > 0 {
				diffs = cfg.Allow(cut, diffs)
			}
			if len(diffs) > 0 {
				t.Errorf("%s: session %s differs from the whole file's:\n  %s", what, sess, strings.Join(diffs, "\n  "))
			}
		}
	}
	newFlags := func(got map[string]*projections.Session) []string {
		var out []string
		for _, s := range got {
			for f := range Flags(s) {
				if !wantFlags[f] {
					out = append(out, f)
				}
			}
		}
		sort.Strings(out)
		return out
	}

	cuts := cfg.Cuts
	if cuts == nil {
		for k := 1; k < len(lines); k++ {
			cuts = append(cuts, k)
		}
	}
	t.Run("cut", func(t *testing.T) {
		for _, k := range cuts {
			t.Run(fmt.Sprint(k), func(t *testing.T) {
				t.Parallel()
				tenant := fmt.Sprintf("%scut%d", run, k)
				log := newLog(t)
				c := conv(t, tenant)
				cres := Import(t, c, log, []byte(strings.Join(lines[:k], "")), path, cfg.Live)
				if f := newFlags(fold(t, log, tenant, cres)); len(f) > 0 {
					t.Errorf("cut after line %d flags what the whole file does not: %v", k, f)
				}
				// A later import is another process: a new converter.
				res := Import(t, conv(t, tenant), log, whole, path, cfg.Live)
				check(t, fmt.Sprintf("cut after line %d, then the whole file", k), fold(t, log, tenant, res), k)
			})
		}
	})
	t.Run("grow", func(t *testing.T) {
		t.Parallel()
		log := newLog(t)
		tenant := run + "grow"
		c := conv(t, tenant) // a follower keeps its converter
		for _, k := range cuts {
			res := Import(t, c, log, []byte(strings.Join(lines[:k], "")), path, cfg.Live)
			if f := newFlags(fold(t, log, tenant, res)); len(f) > 0 {
				t.Errorf("grown to line %d: flags what the whole file does not: %v", k, f)
			}
		}
		res := Import(t, c, log, whole, path, cfg.Live)
		check(t, "grown line by line", fold(t, log, tenant, res), len(lines))
	})
}

// SampleBytes is the size up to which Sample keeps a transcript: 256 KiB,
// which keeps 117 of the 140 Claude Code and Codex files of shared/data
// (5.3 of 32 MB) and every record shape the larger ones hold.
const SampleBytes = 256 << 10

// Sample returns the files of at most SampleBytes, and those named in
// keep, in their order: the sample that tests over a whole corpus read
// under the race detector (which makes JSON ten to twenty times slower and
// finds nothing in a single-goroutine conversion or fold) and under
// -short; the full corpus runs in scripts/fullsize. A file it cannot stat
// fails tb.
func Sample(tb testing.TB, files []string, keep ...string) []string {
	tb.Helper()
	var out []string
	for _, f := range files {
		fi, err := os.Stat(f)
		if err != nil {
			tb.Fatal(err)
		}
		if fi.Size() <= SampleBytes || slices.Contains(keep, f) {
			out = append(out, f)
		}
	}
	return out
}
