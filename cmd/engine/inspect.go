package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/console"
	"github.com/turnstone-dev/turnstone/projections"
)

func newInspectCommand(g *globals) *cobra.Command {
	var (
		tenant string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "inspect SESSION [--json]",
		Short: "Show a session's projected state: turns, history, tool calls, orphans, violations",
		Long: `Show one session as its projection sees it, rebuilt from the last snapshot
plus the events after it: its status, its turns and their outcomes, the
message history as the model API sees it (consecutive records of one role
merged), tool calls paired by id, orphaned tool_use blocks (open, then
repaired), violations of the invariants (open, then resolved),
distillations, and error streaks.

SESSION is a session token, a unique prefix of one, or TENANT/SESSION.
--json prints the whole state and its view (docs/cli.md); it always has
the keys session, status, in_flight, turns, messages,
orphaned_tool_use_ids, violations and view (arrays possibly empty).`,
		Example: cli.Examples(
			"a session by a prefix of its token",
			"engine inspect 258c7280",
			"its whole state as JSON, by tenant and session",
			"engine inspect demo/rt-01JGZ8Q0 --json"),
		Args: cli.ArgsNamed("a session token, a unique prefix of one, or TENANT/SESSION; engine sessions lists them", "SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			nc, log, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			ref, err := resolveSession(ctx, log, args[0], tenant)
			if err != nil {
				return err
			}
			store, err := projections.NewSnapshotStore(log.JetStream(), projections.SnapshotConfig{})
			if err != nil {
				return err
			}
			s, err := projections.Restore(ctx, log, store, ref.Tenant, ref.Session)
			if err != nil {
				return err
			}
			return renderInspect(g.stdout, s, asJSON)
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "tenant of the session (default: search every tenant)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the state and its view as JSON (docs/cli.md)")
	return cmd
}

// renderInspect prints a session as `engine inspect` does: text, or
// (asJSON) the state with its view.
func renderInspect(w io.Writer, s *projections.Session, asJSON bool) error {
	if asJSON {
		m, err := inspectJSON(s)
		if err != nil {
			return err
		}
		return writeJSON(w, m)
	}
	return printInspect(console.NewWriter(w), s)
}

// inspectKeys are the keys of the state `engine inspect --json` always
// has, as arrays, even when the state leaves them out (omitempty).
var inspectKeys = []string{"turns", "in_flight", "messages", "violations", "tool_calls", "orphans", "distillations"}

// maxStatusDetail is how many runes of a session's status detail and pause
// reason the text view prints: the operator's diagnosis, printed whole but
// for a runaway (--json has all of it).
const maxStatusDetail = 1000

// inspectJSON is what `engine inspect --json` prints: the state's JSON,
// with inspectKeys always present, and status, orphaned_tool_use_ids and
// view (the session's View) added.
func inspectJSON(s *projections.Session) (map[string]any, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	for _, k := range inspectKeys {
		if m[k] == nil {
			m[k] = []any{}
		}
	}
	v := s.View()
	m["orphaned_tool_use_ids"] = nonNil(v.OrphanedToolUseIDs)
	m["status"] = v.Status
	m["view"] = v
	return m, nil
}

func nonNil[T any](xs []T) []T {
	if xs == nil {
		return []T{}
	}
	return xs
}

func printInspect(w io.Writer, s *projections.Session) error {
	v := s.View()
	c := v.Counts
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	what := []string{}
	for _, x := range []string{s.Kind, s.Runtime, s.Model} {
		if x != "" {
			what = append(what, x)
		}
	}
	p("session     %s/%s", s.Tenant, s.Session)
	if len(what) > 0 {
		p("  (%s)", strings.Join(what, ", "))
	}
	p("\n")
	if s.ParentSession != "" {
		p("parent      %s via %s\n", s.ParentSession, orDash(s.ParentToolUseID))
	}
	p("status      %s", v.Status)
	if v.StatusDetail != "" {
		p(": %s", cut(v.StatusDetail, maxStatusDetail))
	}
	p("\n")
	p("events      %d (seq %d..%d), %s .. %s\n", s.Events, s.FirstSeq, s.LastSeq, tableTime(s.FirstTime), tableTime(s.LastTime))
	p("turns       %d: %d completed, %d failed, %d abandoned, %d in flight\n", c.TurnsTotal,
		c.TurnsCompleted, c.TurnsFailed, c.TurnsAbandoned, c.TurnsInFlight)
	p("history     %d messages since seq %d\n", len(s.Messages), s.HistoryStart.Seq)
	p("tool calls  %d, %d pending", s.Totals.ToolCalls, len(s.Pending))
	if len(v.PendingToolUseIDs) > 0 {
		p(": %s", cut(strings.Join(v.PendingToolUseIDs, ", "), 160))
	}
	p("\n")
	p("orphans     %d open, %d repaired, %d reset\n", c.OrphansOpen, c.OrphansRepaired, c.OrphansReset)
	p("violations  %d open, %d resolved, %d reset\n", c.ViolationsOpen, c.ViolationsResolved, c.ViolationsReset)
	p("errors      %d", s.Errors.Total)
	if s.Errors.Streak.Count > 1 {
		p(", the last one %d times in a row", s.Errors.Streak.Count)
	}
	p("\n")
	if s.Paused {
		p("paused      %s (seq %d)\n", cut(s.PauseReason, maxStatusDetail), s.PausedSeq)
	}

	p("\nORPHANED TOOL_USE (open)\n")
	if len(v.OpenOrphans) == 0 {
		p("  none\n")
	}
	for _, o := range v.OpenOrphans {
		p("  %s  %s  seq %d  turn %s\n", o.ToolUseID, o.Name, o.Seq, orDash(o.Turn))
	}
	if len(v.RepairedOrphans) > 0 {
		p("\nREPAIRED TOOL_USE\n")
		for _, o := range v.RepairedOrphans {
			p("  %s  %s  seq %d  turn %s  repaired at seq %d\n", o.ToolUseID, o.Name, o.Seq, orDash(o.Turn), o.RepairedSeq)
		}
	}
	p("\nVIOLATIONS (open)\n")
	if len(v.OpenViolations) == 0 {
		p("  none\n")
	}
	for _, x := range v.OpenViolations {
		p("  seq %-6d %-30s %s\n", x.Seq, x.Rule, cut(x.Detail, 200))
	}
	if len(v.ResolvedViolations) > 0 {
		p("\nRESOLVED VIOLATIONS\n")
		for _, x := range v.ResolvedViolations {
			p("  seq %-6d %-30s %s (resolved at seq %d)\n", x.Seq, x.Rule, cut(x.Detail, 200), x.ResolvedSeq)
		}
	}
	if c.ViolationsReset > 0 || c.OrphansReset > 0 {
		p("\n%d violation(s) and %d orphan(s) arose before the distillation at seq %d replaced the history (reset; inspect --json lists them)\n",
			c.ViolationsReset, c.OrphansReset, s.HistoryStart.Seq)
	}
	if len(s.Distillations) > 0 {
		p("\nDISTILLATIONS\n")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  SEQ\tTRIGGER\tCOVERS\tTOKENS\tCLEAN\tNOTE")
		for _, d := range s.Distillations {
			seq := d.CompletedSeq
			if seq == 0 {
				seq = d.StartedSeq
			}
			note := strings.Join(d.DirtyReasons, ", ")
			if d.Skipped != "" {
				note = "skipped: " + d.Skipped
			}
			fmt.Fprintf(tw, "  %d\t%s\t%d..%d\t%d -> %d\t%v\t%s\n", seq, orDash(d.Trigger), d.FromSeq, d.ToSeq, d.TokensBefore, d.TokensAfter, d.Clean, note)
		}
		tw.Flush()
	}
	p("\nTURNS\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  #\tSTATUS\tSTAGE\tSTARTED\tDURATION\tSEQ\tPROMPT")
	for _, t := range s.Turns {
		status := string(t.Status)
		if t.Reason != "" && t.Reason != "end_turn" {
			status += " (" + cut(t.Reason, 60) + ")"
		}
		dur := "-"
		if t.DurationMS > 0 {
			dur = (time.Duration(t.DurationMS) * time.Millisecond).Round(time.Second).String()
		} else if !t.EndedAt.IsZero() && !t.StartedAt.IsZero() {
			dur = t.EndedAt.Sub(t.StartedAt).Round(time.Second).String()
		}
		seqs := fmt.Sprintf("%d..", t.StartedSeq)
		if t.EndedSeq != 0 {
			seqs += fmt.Sprint(t.EndedSeq)
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Index, status, turnStage(t), tableTime(t.StartedAt), dur,
			seqs, cut(t.Prompt, 60))
	}
	return tw.Flush()
}

// turnStage is the STAGE cell of a turn: where it is or was.
func turnStage(t projections.Turn) string {
	switch t.Status {
	case projections.TurnInFlight:
		return "in " + orDash(string(t.Stage))
	case projections.TurnFailed:
		return "failed in " + orDash(string(t.FailedStage))
	case projections.TurnAbandoned:
		return fmt.Sprintf("abandoned in %s (completed %s)", orDash(string(t.Stage)), orDash(string(t.LastStage)))
	}
	return orDash(string(t.LastStage))
}
