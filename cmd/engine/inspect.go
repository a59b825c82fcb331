package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/projections"
)

func newInspectCommand(g *globals) *cobra.Command {
	var (
		tenant string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "inspect SESSION",
		Short: "Show a session's projected state: turns, history, tool calls, orphans, violations",
		Long: `Show one session as its projection sees it, rebuilt from the last snapshot
plus the events after it: its turns and their outcomes, the message history
as the model API sees it (consecutive records of one role merged), tool
calls paired by id, orphaned tool_use blocks, violations of the invariants,
distillations, and error streaks.

SESSION is a session token, a unique prefix of one, or TENANT/SESSION.
--json prints the whole state; it always has the keys session, status,
turns, messages, orphaned_tool_use_ids and violations (arrays, possibly
empty).`,
		Args: cobra.ExactArgs(1),
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
			if asJSON {
				return printInspectJSON(g.stdout, s)
			}
			return printInspect(g.stdout, s)
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "tenant of the session (default: search every tenant)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the state as JSON")
	return cmd
}

// printInspectJSON prints the state with the keys `engine inspect --json`
// promises always present.
func printInspectJSON(w io.Writer, s *projections.Session) error {
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	for _, k := range []string{"turns", "messages", "violations", "tool_calls", "orphans", "distillations"} {
		if m[k] == nil {
			m[k] = []any{}
		}
	}
	ids := s.OrphanedToolUseIDs()
	if ids == nil {
		ids = []string{}
	}
	m["orphaned_tool_use_ids"] = ids
	m["status"] = s.Status()
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(m)
}

func printInspect(w io.Writer, s *projections.Session) error {
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
	p("status      %s\n", s.Status())
	p("events      %d (seq %d..%d), %s .. %s\n", s.Events, s.FirstSeq, s.LastSeq, ts(s.FirstTime), ts(s.LastTime))

	counts := map[projections.TurnStatus]int{}
	for _, t := range s.Turns {
		counts[t.Status]++
	}
	p("turns       %d: %d completed, %d failed, %d abandoned, %d in flight\n", s.Totals.Turns,
		counts[projections.TurnCompleted], counts[projections.TurnFailed], counts[projections.TurnAbandoned], counts[projections.TurnInFlight])
	p("history     %d messages since seq %d\n", len(s.Messages), s.HistoryStart.Seq)
	p("tool calls  %d, %d pending\n", s.Totals.ToolCalls, len(s.Pending))
	p("errors      %d", s.Errors.Total)
	if s.Errors.Streak.Count > 1 {
		p(", the last one %d times in a row", s.Errors.Streak.Count)
	}
	p("\n")
	if s.Paused {
		p("paused      %s (seq %d)\n", s.PauseReason, s.PausedSeq)
	}

	p("\nORPHANED TOOL_USE\n")
	if len(s.Orphans) == 0 {
		p("  none\n")
	}
	for _, o := range s.Orphans {
		p("  %s  %s  seq %d  turn %s\n", o.ToolUseID, o.Name, o.Seq, orDash(o.Turn))
	}
	p("\nVIOLATIONS\n")
	if len(s.Violations) == 0 {
		p("  none\n")
	}
	for _, v := range s.Violations {
		p("  seq %-6d %-30s %s\n", v.Seq, v.Rule, v.Detail)
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
		stage := string(t.LastStage)
		if t.FailedStage != "" {
			stage = "failed in " + string(t.FailedStage)
		}
		status := string(t.Status)
		if t.Reason != "" && t.Reason != "end_turn" {
			status += " (" + t.Reason + ")"
		}
		dur := "-"
		if t.DurationMS > 0 {
			dur = (time.Duration(t.DurationMS) * time.Millisecond).Round(time.Second).String()
		} else if !t.EndedAt.IsZero() && !t.StartedAt.IsZero() {
			dur = t.EndedAt.Sub(t.StartedAt).Round(time.Second).String()
		}
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\t%d..%d\t%s\n", t.Index, status, orDash(stage), ts(t.StartedAt), dur,
			t.StartedSeq, t.EndedSeq, cut(t.Prompt, 60))
	}
	return tw.Flush()
}

func ts(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.DateTime)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func cut(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "..."
}
