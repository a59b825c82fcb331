package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/console"
	"github.com/turnstone-dev/turnstone/internal/forensics"
)

func newDiffCommand(g *globals) *cobra.Command {
	var (
		tenant string
		from   int64
		to     uint64
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "diff SESSION --from SEQ --to SEQ",
		Short: "What changed in a session's projected state between two stream sequences",
		Long: `Fold a session once from its first event and compare its projected state as
of --from with its state as of --to: the status, the turns that started and
ended, the tool calls added and answered, the messages added, the
violations raised and resolved, the orphans declared and repaired, the
recovery commands that moved, the distillations. --from 0 is before the
first event; a negative --from counts events back from the last (-5: the
state five events before the end); --to 0 (the default) is the last
event. A sequence between two of the session's events means the state
after the earlier one.

Counts are exact; the lists come from what the later state keeps
(docs/limits.md), and say "(more not listed)" when they hold fewer.

SESSION is a session token, a unique prefix of one, or TENANT/SESSION.`,
		Example: cli.Examples(
			"what changed since stream sequence 5376",
			"engine diff crash/55604662 --from 5376",
			"between two sequences, as JSON",
			"engine diff demo/rt-01JGZ8Q0 --from 3 --to 12 --json"),
		Args: cli.ArgsNamed("a session token, a unique prefix of one, or TENANT/SESSION", "SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if !cmd.Flags().Changed("from") {
				return fmt.Errorf("--from: required (0 for the session's start)")
			}
			nc, log, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			ref, err := resolveSession(ctx, log, args[0], tenant)
			if err != nil {
				return err
			}
			fromSeq := uint64(max(from, 0))
			if from < 0 {
				if fromSeq, err = eventsBack(ctx, log, ref, int(-from)); err != nil {
					return err
				}
			}
			d, err := forensics.DiffLog(ctx, log, ref.Tenant, ref.Session, fromSeq, to)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(g.stdout, diffJSON(d))
			}
			return printDiff(console.NewWriter(g.stdout), d) // stored text never reaches the terminal raw
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "tenant of the session (default: search every tenant)")
	cmd.Flags().Int64Var(&from, "from", 0, "the earlier stream sequence (0: before the first event; -N: N events before the last)")
	cmd.Flags().Uint64Var(&to, "to", 0, "the later stream sequence (0: the last event)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the diff as JSON (docs/cli.md)")
	return cmd
}

// printDiff prints a Diff as text, one section per kind of change.
func printDiff(w io.Writer, d forensics.Diff) error {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("session     %s/%s\n", d.Tenant, d.Session)
	p("from        %s\n", diffPoint(d.From, "before the first event"))
	p("to          %s\n", diffPoint(d.To, "the last event"))
	status := d.From.Status + " -> " + d.To.Status
	if !d.StatusChanged {
		status = d.To.Status + " (unchanged)"
	}
	p("status      %s\n", status)
	p("events      %d -> %d (+%d)\n", d.From.Events, d.To.Events, d.To.Events-d.From.Events)
	p("turns       %d started, %d ended\n", d.To.Turns-d.From.Turns, len(d.TurnsEnded))
	p("tool calls  %d added, %d answered\n", d.To.ToolCalls-d.From.ToolCalls, len(d.ToolCallsAnswered))
	reset := ""
	if d.HistoryReset {
		reset = " (a distillation reset the history)"
	}
	p("messages    %d added%s\n", d.MessagesAdded, reset)
	p("violations  %d raised, %d resolved\n", d.RaisedCount, d.ResolvedCount)
	p("orphans     %d open -> %d open\n", d.From.Orphans, d.To.Orphans)
	p("errors      %d added\n", d.ErrorsAdded)

	section := func(title string, n int) bool {
		if n == 0 {
			return false
		}
		p("\n%s\n", title)
		return true
	}
	if section("TURNS ENDED", len(d.TurnsEnded)) {
		for _, t := range d.TurnsEnded {
			what := t.After
			if t.Reason != "" && t.Reason != "end_turn" {
				what += " (" + t.Reason + ")"
			}
			if t.After == "failed" && t.Stage != "" {
				what += " in " + t.Stage
			}
			p("  #%-3d %s  %s -> %s at seq %d\n", t.Index, t.ID, orDash(t.Before), what, t.EndedSeq)
		}
	}
	if section("TURNS STARTED", len(d.TurnsStarted)) {
		for _, t := range d.TurnsStarted {
			p("  #%-3d %s  at seq %d, now %s\n", t.Index, t.ID, t.Seq, t.After)
		}
	}
	if section("TOOL CALLS ANSWERED", len(d.ToolCallsAnswered)) {
		for _, c := range d.ToolCallsAnswered {
			errTag := ""
			if c.IsError {
				errTag = " (is_error)"
			}
			p("  %s  %s  %s -> %s at seq %d%s\n", c.ToolUseID, c.Name, orDash(c.Before), c.After, c.ResultSeq, errTag)
		}
	}
	if section("MESSAGES ADDED", len(d.Messages)) {
		for _, m := range d.Messages {
			tag := ""
			if m.Synthetic {
				tag = " (synthetic)"
			}
			p("  #%-4d %-9s seq %-8d %s%s\n", m.Index, m.Role, first(m.Seqs), cut(m.Preview, 70), tag)
		}
		if len(d.Messages) < d.MessagesAdded {
			p("  (%d more not listed: the state keeps the latest messages)\n", d.MessagesAdded-len(d.Messages))
		}
	}
	if section("VIOLATIONS RAISED", len(d.Raised)) {
		for _, v := range d.Raised {
			p("  seq %-8d %-30s %s\n", v.Seq, v.Rule, cut(v.Detail, 90))
		}
	}
	if section("VIOLATIONS RESOLVED", len(d.Resolved)) {
		for _, v := range d.Resolved {
			p("  seq %-8d %-30s resolved at seq %d\n", v.Seq, v.Rule, v.ResolvedSeq)
		}
	}
	if section("ORPHANS", len(d.Orphans)) {
		for _, o := range d.Orphans {
			p("  %s  %s  %s (declared at seq %d", o.ToolUseID, o.Name, strings.ReplaceAll(o.Change, "_", " "), o.DeclaredSeq)
			if o.RepairedSeq != 0 {
				p(", repaired at seq %d", o.RepairedSeq)
			}
			p(")\n")
		}
	}
	if section("RECOVERY COMMANDS", len(d.Commands)) {
		for _, c := range d.Commands {
			p("  %s  %s -> %s after %d attempt(s)\n", c.ID, orDash(c.Before), c.After, c.Attempts)
		}
	}
	if section("DISTILLATIONS", len(d.Distillations)) {
		for _, x := range d.Distillations {
			p("  %-9s at seq %d: covers %d..%d, %d -> %d tokens, clean %v %s\n", x.Step, x.Seq, x.FromSeq, x.ToSeq, x.TokensBefore, x.TokensAfter, x.Clean, x.Skipped)
		}
	}
	if d.Truncated {
		p("\n(some lists hold fewer entries than their counts: the later state keeps only its latest entries)\n")
	}
	return nil
}

// eventsBack is the stream sequence of the session's event n events
// before its last (0, before the first event, when it has n or fewer).
func eventsBack(ctx context.Context, log *events.Log, ref events.SessionRef, n int) (uint64, error) {
	ring := make([]uint64, n+1)
	count := 0
	err := log.ReadSession(ctx, ref.Tenant, ref.Session, events.ReadOptions{}, func(ev events.Event) error {
		ring[count%(n+1)] = ev.Seq
		count++
		return nil
	})
	if err != nil {
		return 0, err
	}
	if count <= n {
		return 0, nil
	}
	return ring[(count-n-1)%(n+1)], nil
}

// diffJSON is d as `diff --json` prints it: every list an array, empty
// rather than null (docs/cli.md, Stability).
func diffJSON(d forensics.Diff) forensics.Diff {
	d.TurnsStarted, d.TurnsEnded = nonNil(d.TurnsStarted), nonNil(d.TurnsEnded)
	d.ToolCallsStarted, d.ToolCallsAnswered = nonNil(d.ToolCallsStarted), nonNil(d.ToolCallsAnswered)
	d.Messages, d.Distillations, d.Commands, d.Orphans = nonNil(d.Messages), nonNil(d.Distillations), nonNil(d.Commands), nonNil(d.Orphans)
	d.Raised, d.Resolved = nonNil(d.Raised), nonNil(d.Resolved)
	return d
}

// diffPoint says where one side of a diff stands: the sequence asked for
// and the event whose state it is ("seq 5376 (state after seq 5370)"), or,
// for 0, what 0 means (zero: the word for it).
func diffPoint(p forensics.Point, zero string) string {
	switch {
	case p.Seq == 0 && p.LastSeq == 0:
		return "seq 0 (" + zero + ")"
	case p.Seq == 0:
		return fmt.Sprintf("seq %d (%s)", p.LastSeq, zero)
	case p.Seq == p.LastSeq:
		return fmt.Sprintf("seq %d", p.Seq)
	}
	return fmt.Sprintf("seq %d (state after seq %d)", p.Seq, p.LastSeq)
}

func first(xs []uint64) uint64 {
	if len(xs) == 0 {
		return 0
	}
	return xs[0]
}
