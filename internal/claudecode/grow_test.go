package claudecode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/embedded/embeddedtest"
	"github.com/turnstone-dev/turnstone/internal/importer/importertest"
)

// wildFile is one of the real transcripts under
// shared/data/wild/claude-code beside the repository.
func wildFile(t testing.TB, rel string) string {
	t.Helper()
	p := filepath.Join("..", "..", "..", "shared", "data", "wild", "claude-code", filepath.FromSlash(rel))
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("wild transcript %s (shared/data/wild beside the repository): %v", rel, err)
	}
	return p
}

// growFiles are real transcripts of every shape the importer reads:
// Claude Code 1.0 with inline sidechains, 2.0 and 2.1, parallel tool
// calls with results between the blocks of one response, an automatic
// compaction, local commands, stop hooks and interruptions.
func growFiles(t testing.TB) []string {
	return []string{
		corpusFile(t, "spotter/subagent.jsonl"),
		corpusFile(t, "spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl"),
		corpusFile(t, "ccviewer/fe5e1c67-53e7-4862-81ae-d0e013e3270b.jsonl"),
		wildFile(t, "codemie-ai__codemie-code/claude/incremental-subagents/turn-2.jsonl"),
		wildFile(t, "daaain__claude-code-log/real_projects/-Users-dain-workspace-coderabbit-review-helper/cb2e607c-c758-415a-8b45-c49e4631906a.jsonl"),
	}
}

// cutPoints returns the prefixes (line counts) a test cuts a transcript
// at: every line of a small file; in a larger one (each cut imports the
// whole file again) the lines around system records and interruptions
// (compactions, stop hooks, local commands, API errors, where a cut
// decides the most) and others spread evenly, within a budget of about
// 1 MB of transcript per file (128 KB under the race detector, which
// finds nothing in this single-goroutine code and slows it twentyfold,
// and under -short; the full-size pass of .ci/run cuts at the 1 MB
// budget).
func cutPoints(lines []string) []int {
	size := 0
	for _, l := range lines {
		size += len(l)
	}
	n := len(lines)
	budget, least := 1<<20, 3
	if sampled() {
		budget, least = 128<<10, 2
	}
	want := n
	if size > 0 {
		want = min(n, max(least, budget/size))
	}
	pick := map[int]bool{}
	for k := 1; k < n; k += max(1, n/want) {
		pick[k] = true
	}
	special := 0
	for i, l := range lines {
		if special >= want {
			break
		}
		if strings.Contains(l, `"type":"system"`) || strings.Contains(l, "[Request interrupted by user") {
			for k := i; k <= i+1; k++ {
				if k >= 1 && k < n && !pick[k] {
					pick[k] = true
					special++
				}
			}
		}
	}
	var cuts []int
	for k := 1; k < n; k++ {
		if pick[k] {
			cuts = append(cuts, k)
		}
	}
	return cuts
}

// historyGuess allows the differences a history import of a cut copy may
// make, as the package documentation says ("The end of a transcript"): at
// the end of a copy whose last response answered, it ends the turn, and a
// later import of the grown file keeps that end (its time, reason and
// duration, the session's latest event time), and with it the output
// streak and the failed attempts as they were when it ended; a compaction
// at the end of a copy has no size after it. A live read never guesses.
func historyGuess(live bool) func(int, []string) []string {
	if live {
		return nil
	}
	return func(_ int, diffs []string) []string {
		var out []string
		for _, d := range diffs {
			path := d[:strings.Index(d, ":")]
			switch {
			case strings.HasPrefix(path, ".outputs."), path == ".last_time",
				strings.HasPrefix(path, ".distillations[") && strings.HasSuffix(path, "].tokens_after"),
				strings.HasPrefix(path, ".turns[") && (strings.HasSuffix(path, "].reason") || strings.HasSuffix(path, "].ended_at") ||
					strings.HasSuffix(path, "].duration_ms") || strings.HasSuffix(path, "].failed_attempts")):
			default:
				out = append(out, d)
			}
		}
		return out
	}
}

// natsLog starts an embedded NATS server for t and returns its event log:
// the cuts import under their own tenants, so one log serves them all.
func natsLog(t testing.TB) importertest.Log {
	srv := embeddedtest.Start(t)
	_, js := embeddedtest.Connect(t, srv)
	log, err := events.Open(context.Background(), js, events.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return importertest.SessionLog(log)
}

// TestCutAnywhereThenGrow is the importers' promise on the shipped
// transcripts short.jsonl and tool_heavy.jsonl: cut after any line (inside
// one API response, between parallel tool calls, between a result and the
// next block of the same response), imported as history or followed live,
// then imported whole, the session's projection is the one the whole file
// gives, and the cut alone flags nothing the whole file does not. The
// imports go to a real event log on an embedded NATS server.
func TestCutAnywhereThenGrow(t *testing.T) {
	log := natsLog(t)
	for _, rel := range []string{"spotter/short.jsonl", "spotter/tool_heavy.jsonl"} {
		path := corpusFile(t, rel)
		for _, live := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/live=%v", filepath.Base(rel), live), func(t *testing.T) {
				t.Parallel()
				importertest.CutAnywhere(t, importertest.CutConfig{
					Format: Format, Live: live, NewLog: func(testing.TB) importertest.Log { return log },
					Options: Options{Source: "urn:test:" + fmt.Sprint(live)}, Allow: historyGuess(live),
				}, path)
			})
		}
	}
}

// TestGrowingTranscriptImportsLikeTheWholeFile runs the same promise on
// longer real transcripts of every shape, cut at the lines where a cut
// decides the most, in memory. Under the race detector and -short it
// takes three of the five files and fewer cuts (see cutPoints); the
// full-size pass of .ci/run takes all five.
func TestGrowingTranscriptImportsLikeTheWholeFile(t *testing.T) {
	files := growFiles(t)
	if sampled() {
		// The race detector slows decoding JSON twentyfold and finds
		// nothing in a conversion, which runs on one goroutine: the
		// smaller files (subagent.jsonl, the 1.0 inline sidechains, a
		// snapshot continued) with fewer cuts (see cutPoints).
		files = []string{files[0], files[2], files[3]}
	}
	for _, path := range files {
		lines := importertest.Lines(t, path)
		for _, live := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/live=%v", filepath.Base(path), live), func(t *testing.T) {
				t.Parallel()
				importertest.CutAnywhere(t, importertest.CutConfig{Format: Format, Live: live, Cuts: cutPoints(lines), Allow: historyGuess(live)}, path)
			})
		}
	}
}
