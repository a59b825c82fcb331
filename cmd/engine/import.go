package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/turnstone-dev/turnstone/ingest"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/claudecode"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/codex"
	"github.com/turnstone-dev/turnstone/internal/console"
	"github.com/turnstone-dev/turnstone/internal/importer"
)

// importFormats are the transcript formats `engine import` reads, by
// --format name.
var importFormats = map[string]importer.Format{
	claudecode.FormatName: claudecode.Format,
	codex.FormatName:      codex.Format,
}

// formatNames are importFormats' names, for messages.
const formatNames = "claude-code or codex"

func newImportCommand(g *globals) *cobra.Command {
	var (
		format string
		tenant string
		quiet  bool
		follow bool
	)
	cmd := &cobra.Command{
		Use:   "import --format claude-code|codex [--follow] FILE|DIR...",
		Short: "Import agent transcripts into the event log",
		Long: `Import transcripts into the event log, one session per transcript.

--format claude-code reads Claude Code session files (JSONL, as kept in
~/.claude/projects/<project>/). A directory is searched for *.jsonl files; a
session file X.jsonl brings its sidechains (X/subagents/agent-*.jsonl),
which become sessions of their own linked to the parent.

--format codex reads OpenAI Codex rollouts (~/.codex/sessions/YYYY/MM/DD/
rollout-*.jsonl). A directory is searched for rollout-*.jsonl files.
Record types this version does not know are counted and listed, not
imported.

Importing is idempotent: event ids derive from the records (uuids, line
numbers, turn ids), and the events a session already holds are not
appended again, so importing a file twice stores nothing new, and
importing it again after it grew continues its session. Malformed lines
are skipped and the rest of the file is imported; stderr shows the first
few, with file and line number, then how many more.

The exit status is 1 when a file could not be read, or yielded no session
and has lines that are not records of the format (it is not a transcript:
README.md, go.mod, random bytes); 0 otherwise. A file that yields no
session because it is empty, or holds only records that make none (a
summary, file snapshots: Claude Code leaves such files behind), is
reported and does not fail the import. Imported sessions are history: the
reconciler never acts on them.

--follow records sessions live as the runtime writes them (point it at
~/.claude/projects or ~/.codex/sessions): it reads the transcripts already
there (those written in the last 30 minutes as live, older ones as
history), then watches the files and directories (new day folders
included) and appends each new file and each appended line as it is
written, until Ctrl-C. A model response and the tool calls it wrote are
recorded within a moment of being written, even while the response is
still being written; a turn at the end of a file still being written
stays in flight; a followed session is live.`,
		Example: cli.Examples(
			"import every Claude Code session of a project, as history",
			"engine import --format claude-code ~/.claude/projects/my-project",
			"record Codex sessions live, under tenant acme, new day folders included",
			"engine import --format codex --tenant acme --follow ~/.codex/sessions"),
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			fmtr, ok := importFormats[format]
			if !ok {
				return fmt.Errorf("--format %q: the formats are %s", format, formatNames)
			}
			if !events.ValidToken(tenant) {
				return fmt.Errorf("--tenant %q: must be 1-%d characters of [A-Za-z0-9_-]", tenant, events.MaxTokenLen)
			}
			files, err := fmtr.Expand(args)
			if err != nil {
				return err
			}
			if len(files) == 0 && !follow {
				return fmt.Errorf("no %s transcript in the arguments", fmtr.Name())
			}
			ctx := cmd.Context()
			nc, err := g.dial()
			if err != nil {
				return err
			}
			defer nc.Close()
			// An import is a publisher like any other: through the engine,
			// which validates, masks and appends (under auth, with the
			// tenant's credentials). It waits out a handover: an engine
			// that restarts takes its partitions back within pgroup's
			// bound (7 s), and an append sent meanwhile goes unanswered
			// for its whole timeout, so it is sent again once after that.
			log, err := ingest.NewClient(nc, ingest.ClientConfig{Timeout: 10 * time.Second, RetryFor: 15 * time.Second})
			if err != nil {
				return err
			}
			if follow {
				return followTranscripts(ctx, g, importer.LogStore(log), fmtr, args, tenant)
			}

			bar := progressbar.NewOptions64(-1,
				progressbar.OptionSetWriter(g.stderr),
				progressbar.OptionSetDescription("importing"),
				progressbar.OptionShowBytes(true),
				progressbar.OptionSetVisibility(!quiet && console.IsTerminal(g.stderr)),
				progressbar.OptionClearOnFinish(),
				progressbar.OptionThrottle(100_000_000),
			)
			progress := func(done, total int) {
				if bar.GetMax64() != int64(total) {
					bar.ChangeMax64(int64(total))
				}
				_ = bar.Set64(int64(done))
			}
			rep, err := importer.Import(ctx, importer.LogStore(log), fmtr, files, importer.Options{Tenant: tenant}, progress)
			_ = bar.Finish()
			if rep == nil {
				return err
			}
			failed := printImportReport(g.stdout, g.stderr, fmtr.Name(), rep, fileIsBlank)
			if err != nil {
				return err
			}
			return failed
		},
	}
	cmd.Flags().StringVar(&format, "format", "", "transcript format: "+formatNames+" (required)")
	cmd.Flags().StringVar(&tenant, "tenant", "default", "tenant to import the sessions into")
	cmd.Flags().BoolVar(&quiet, "quiet", false, "no progress bar")
	cmd.Flags().BoolVar(&follow, "follow", false, "keep watching the files and directories, and record sessions live as they are written (until Ctrl-C)")
	_ = cmd.MarkFlagRequired("format")
	return cmd
}

// shownBadLines is how many skipped lines the import report shows one by
// one before it only counts them.
const shownBadLines = 5

// printImportReport prints what an import of format's transcripts did: to
// stderr the first shownBadLines skipped lines and how many more, and each
// file that yielded no session with why; to stdout the totals, and the
// record types the format does not know, counted. It returns an error
// naming the files that make the import fail, or nil: a file that could
// not be read, and one that yielded no session and has bad lines (not a
// transcript). A file that yielded no session because it is empty
// (blank reports whether it holds only white space) or holds only records
// that make no session (a Claude Code summary file) is a note, not a
// failure.
func printImportReport(stdout, stderr io.Writer, format string, rep *importer.Report, blank func(string) bool) error {
	stderr = console.NewWriter(stderr)
	badLines := map[string]int{}
	var unreadable []string
	shown := 0
	for _, d := range rep.Diagnostics {
		if d.Line == 0 {
			unreadable = append(unreadable, d.File)
			fmt.Fprintf(stderr, "cannot read: %s\n", console.Escape(d.Error()))
			continue
		}
		badLines[d.File]++
		if shown < shownBadLines {
			fmt.Fprintf(stderr, "skipped: %s\n", console.Escape(cut(d.Error(), 300)))
			shown++
		}
	}
	skipped := len(rep.Diagnostics) - len(unreadable)
	if more := skipped - shown; more > 0 {
		fmt.Fprintf(stderr, "skipped: %d more bad lines (%d in all, in %d file(s))\n", more, skipped, len(badLines))
	}
	var notTranscripts []string
	for _, f := range rep.NoSession {
		switch {
		case badLines[f] > 0:
			notTranscripts = append(notTranscripts, f)
			fmt.Fprintf(stderr, "not a transcript: %s: no session in it, %d line(s) skipped\n", console.Escape(f), badLines[f])
		case blank(f):
			fmt.Fprintf(stderr, "empty: %s: nothing to import\n", console.Escape(f))
		default: // records of no conversation only: a summary, file snapshots
			fmt.Fprintf(stderr, "no conversation: %s: its records make no session (summaries, file snapshots, ...)\n", console.Escape(f))
		}
	}
	fmt.Fprintf(stdout, "imported %d files, %d sessions: %d records -> %d events (%d appended, %d already stored); %d lines skipped; %s, %.0f events/s\n",
		rep.Files, rep.Sessions, rep.Records, rep.Events, rep.Appended, rep.Existing, skipped,
		rep.Elapsed.Round(1e6), rep.EventsPerSecond())
	if len(rep.Unknown) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(rep.Unknown)) {
			parts = append(parts, fmt.Sprintf("%s %d", console.Escape(k), rep.Unknown[k]))
		}
		fmt.Fprintf(stdout, "unknown record types (counted, not imported): %s\n", strings.Join(parts, ", "))
	}
	var errs []string
	if n := len(unreadable); n > 0 {
		errs = append(errs, fmt.Sprintf("%d file(s) could not be read (%s)", n, fileList(unreadable)))
	}
	if n := len(notTranscripts); n > 0 {
		errs = append(errs, fmt.Sprintf("%d file(s) yielded no session: not %s transcripts (%s)", n, format, fileList(notTranscripts)))
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.New(strings.Join(errs, "; "))
}

// fileList names the first few files of fs, then how many more.
func fileList(fs []string) string {
	const show = 3
	if len(fs) <= show {
		return strings.Join(fs, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(fs[:show], ", "), len(fs)-show)
}

// fileIsBlank reports whether the file at path holds nothing but white
// space (an unreadable file is not blank).
func fileIsBlank(path string) bool {
	b, err := os.ReadFile(path)
	return err == nil && len(bytes.TrimSpace(b)) == 0
}
