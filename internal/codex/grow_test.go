package codex

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnstone-dev/turnstone/internal/importer/importertest"
)

// wild is a Codex rollout under shared/data/wild/codex beside the
// repository.
func wild(t testing.TB, rel string) string {
	t.Helper()
	p := filepath.Join("..", "..", "..", "shared", "data", "wild", "codex", filepath.FromSlash(rel))
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("Codex rollout %s (shared/data/wild/codex beside the repository): %v", rel, err)
	}
	return p
}

// The shipped rollouts the tests read.
const (
	rollout077       = "codemie-ai__codemie-code/codex/rollout-2026-01-02T18-39-45-019b7f94-51b4-7593-922e-ba12b5b73b52.jsonl"
	rollout0146      = "jazzyalex__agent-sessions/codex_small_0.146.0.jsonl"
	rolloutParallel  = "madshn__localpush/sessions/rollout-2026-02-23T12-41-04-019c8a4d-8f45-7010-8b5d-7fad920aa6f9.jsonl"
	rolloutCompacted = "madshn__localpush/sessions/rollout-2026-02-23T12-54-34-019c8a59-e9dd-71f0-9ae3-4079fe9726a9.jsonl"
	rolloutPending   = "madshn__localpush/sessions/rollout-2026-02-23T13-19-38-019c8a70-dda7-7f33-98ea-f30553347322.jsonl"
	rolloutShort     = "madshn__localpush/sessions/rollout-2026-02-23T20-34-25-019c8bfe-ec25-79e0-97d7-bda6a9c575ff.jsonl"
)

// sampled reports whether the tests that import the same rollouts many
// times take a sample of the cuts: under the race detector and under
// -short. The full-size pass of .ci/run takes every cut.
func sampled() bool { return raceEnabled || testing.Short() }

// guesses allows what a cut may not know, as the package documentation
// says: the history's size after a compaction, which Codex writes only
// with the first model call after it; and, for a history import of a cut
// copy without task events (0.77), the end of the last turn when its model
// answered last (a later import keeps that end: its time, its duration,
// the session's latest time, and the output streak as it was then).
func guesses(live bool) func(int, []string) []string {
	return func(cut int, diffs []string) []string {
		var out []string
		for _, d := range diffs {
			path := d[:strings.Index(d, ":")]
			switch {
			case strings.HasPrefix(path, ".distillations[") && strings.HasSuffix(path, "].tokens_after"):
			case !live && (path == ".last_time" || strings.HasPrefix(path, ".outputs.") || strings.HasPrefix(path, ".turns[") &&
				(strings.HasSuffix(path, "].reason") || strings.HasSuffix(path, "].ended_at") || strings.HasSuffix(path, "].duration_ms") ||
					strings.HasSuffix(path, "].status") || strings.HasSuffix(path, "].failed_attempts"))),
				!live && (path == ".in_flight" || path == ".totals.failed_turns"):
			default:
				out = append(out, d)
			}
		}
		return out
	}
}

// span returns the cuts from..to, every step-th (every third when
// sampled).
func span(from, to int) []int {
	step := 1
	if sampled() {
		step = 3
	}
	var out []int
	for k := from; k <= to; k += step {
		out = append(out, k)
	}
	return out
}

// every is every step-th cut of a file of n lines (every 3*step-th when
// sampled).
func every(n, step int) []int {
	if sampled() {
		step *= 3
	}
	var out []int
	for k := 1; k < n; k += step {
		out = append(out, k)
	}
	return out
}

// TestCutAnywhereThenGrow: real rollouts cut after any line, imported as
// history or followed live, then imported whole, give the projection of
// the whole file, and the cut flags nothing the whole file does not. Every
// cut point of the 0.104 rollouts 019c8bfe (tool calls, a final answer)
// and 019c8a70 (ends on a call) and of the 0.77 rollout (implicit turns);
// every cut point of the 0.146 one followed live (a late output after an
// abort, server tools, several sessions' records, compactions), every
// third imported as history; every cut point of the first 60 lines of
// 019c8a4d (parallel calls, two to five a response); cuts around
// 019c8a59's compaction. Under the race detector and -short it takes the
// sample below; the full-size pass of .ci/run takes every cut named here.
func TestCutAnywhereThenGrow(t *testing.T) {
	cases := []struct {
		rel        string
		live, hist func(n int) []int
	}{
		{rolloutShort, nil, nil}, {rolloutPending, nil, nil}, {rollout077, nil, nil},
		{rollout0146, nil, func(n int) []int { return every(n, 3) }},
		{rolloutParallel, nil, nil}, // its first 60 lines: see below
		{rolloutCompacted, func(int) []int { return []int{1786, 1789, 1791, 1796} }, func(int) []int { return []int{1786, 1789, 1791, 1796} }},
	}
	if sampled() {
		// Sampled: the race detector slows decoding JSON twentyfold and finds
		// nothing in a conversion, which runs on one goroutine: fewer
		// cuts (every() and span() take every third), and not the 1 MB
		// rollout, whose compaction 0.146's compactions stand for.
		cases = cases[:5]
		cases[3].live = func(n int) []int { return every(n, 2) }
		cases[3].hist = func(n int) []int { return every(n, 4) }
	}
	for _, tc := range cases {
		path := wild(t, tc.rel)
		if tc.rel == rolloutParallel {
			// A copy taken at line 60, as the whole file: five responses
			// of two to five parallel calls, each cut inside.
			path = filepath.Join(t.TempDir(), filepath.Base(tc.rel))
			if err := os.WriteFile(path, []byte(strings.Join(importertest.Lines(t, wild(t, tc.rel))[:60], "")), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		n := len(importertest.Lines(t, path))
		for _, live := range []bool{true, false} {
			cuts := every(n, 1)
			if pick := map[bool]func(int) []int{true: tc.live, false: tc.hist}[live]; pick != nil {
				cuts = pick(n)
			}
			t.Run(fmt.Sprintf("%s/live=%v", filepath.Base(tc.rel), live), func(t *testing.T) {
				t.Parallel()
				importertest.CutAnywhere(t, importertest.CutConfig{Format: Format, Live: live, Cuts: cuts, Allow: guesses(live)}, path)
			})
		}
	}
}
