package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/turnstone-dev/turnstone/ingest"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/claudecode"
	"github.com/turnstone-dev/turnstone/events"
)

func newImportCommand(g *globals) *cobra.Command {
	var (
		format string
		tenant string
		quiet  bool
		follow bool
	)
	cmd := &cobra.Command{
		Use:   "import --format claude-code [--follow] FILE|DIR...",
		Short: "Import agent transcripts into the event log",
		Long: `Import transcripts into the event log, one session per transcript.

--format claude-code reads Claude Code session files (JSONL, as kept in
~/.claude/projects/<project>/). A directory is searched for *.jsonl files; a
session file X.jsonl brings its sidechains (X/subagents/agent-*.jsonl),
which become sessions of their own linked to the parent.

Importing is idempotent: event ids derive from the records' uuids, and the
events a session already holds are not appended again, so importing a file
twice stores nothing new. Malformed lines are reported with file and line
number and skipped; the rest of the file is imported. Imported sessions are
history: the reconciler never acts on them.

--follow records sessions live as Claude Code writes them (point it at
~/.claude/projects): it reads the transcripts already there (those written
in the last 30 minutes as live, older ones as history), then watches the
files and directories and appends each new file and each appended line as
it is written, until Ctrl-C. A turn at the end of a file still being
written stays in flight; a followed session is live.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if format != "claude-code" {
				return fmt.Errorf("--format %q: the only format is claude-code", format)
			}
			if !events.ValidToken(tenant) {
				return fmt.Errorf("--tenant %q: must be 1-%d characters of [A-Za-z0-9_-]", tenant, events.MaxTokenLen)
			}
			files, err := claudecode.Expand(args)
			if err != nil {
				return err
			}
			if len(files) == 0 && !follow {
				return errors.New("no *.jsonl transcript in the arguments")
			}
			ctx := cmd.Context()
			nc, err := g.dial()
			if err != nil {
				return err
			}
			defer nc.Close()
			// An import is a publisher like any other: through the engine,
			// which validates, masks and appends (under auth, with the
			// tenant's credentials).
			log, err := ingest.NewClient(nc, ingest.ClientConfig{Timeout: 10 * time.Second, RetryFor: 10 * time.Second})
			if err != nil {
				return err
			}
			if follow {
				return followTranscripts(ctx, g, claudecode.LogStore(log), args, tenant)
			}

			bar := progressbar.NewOptions64(-1,
				progressbar.OptionSetWriter(g.stderr),
				progressbar.OptionSetDescription("importing"),
				progressbar.OptionShowBytes(true),
				progressbar.OptionSetVisibility(!quiet && isTerminal(g.stderr)),
				progressbar.OptionClearOnFinish(),
				progressbar.OptionThrottle(100_000_000),
			)
			progress := func(done, total int) {
				if bar.GetMax64() != int64(total) {
					bar.ChangeMax64(int64(total))
				}
				_ = bar.Set64(int64(done))
			}
			rep, err := claudecode.Import(ctx, claudecode.LogStore(log), files, claudecode.Options{Tenant: tenant}, progress)
			_ = bar.Finish()
			if rep != nil {
				printImportReport(g, rep)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&format, "format", "", "transcript format: claude-code (required)")
	cmd.Flags().StringVar(&tenant, "tenant", "default", "tenant to import the sessions into")
	cmd.Flags().BoolVar(&quiet, "quiet", false, "no progress bar")
	cmd.Flags().BoolVar(&follow, "follow", false, "keep watching the files and directories, and record sessions live as they are written (until Ctrl-C)")
	_ = cmd.MarkFlagRequired("format")
	return cmd
}

func printImportReport(g *globals, rep *claudecode.Report) {
	for _, d := range rep.Diagnostics {
		fmt.Fprintf(g.stderr, "skipped: %v\n", d)
	}
	fmt.Fprintf(g.stdout, "imported %d files, %d sessions: %d records -> %d events (%d appended, %d already stored); %d lines skipped; %s, %.0f events/s\n",
		rep.Files, rep.Sessions, rep.Records, rep.Events, rep.Appended, rep.Existing, len(rep.Diagnostics),
		rep.Elapsed.Round(1e6), rep.EventsPerSecond())
}
