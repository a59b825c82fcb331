package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/console"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

func newRecoveryCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "recovery",
		Short: "List, show and issue recovery commands",
		Example: cli.Examples(
			"every command with its state and outcome",
			"engine recovery list",
			"repair the orphans of a session by hand",
			"engine recovery issue demo/rt-01JGZ8Q0 --kind repair_orphans --reason \"runtime crashed\""),
	}
	cmd.AddCommand(newRecoveryListCommand(g), newRecoveryShowCommand(g), newRecoveryIssueCommand(g))
	return cmd
}

func newRecoveryListCommand(g *globals) *cobra.Command {
	var (
		state   string
		session string
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "list [--state S] [--session S] [--json]",
		Short: "List recovery commands with their state (" + stateList() + ")",
		Long: `List the recovery commands, newest first, each with its state (` + stateList() + `),
outcome (` + outcomeList() + `), attempts, worker and reason. --json prints
an array of {command, seq, status} (docs/cli.md). --session takes a
session token, a prefix of one, or TENANT/SESSION (as the table prints
it).`,
		Example: cli.Examples(
			"the commands that are still running",
			"engine recovery list --state running",
			"one session's commands, as JSON",
			"engine recovery list --session demo/rt-01JGZ8Q0 --json"),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if state != "" && !recovery.State(state).Valid() {
				return fmt.Errorf("--state %q: not a command state; one of: %s", state, stateList())
			}
			ctx := cmd.Context()
			nc, log, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			rows, err := recovery.List(ctx, log.JetStream())
			if err != nil {
				return err
			}
			tenant, prefix, byTenant := strings.Cut(session, "/")
			if !byTenant {
				prefix = session
			}
			kept := rows[:0]
			for _, r := range rows {
				if state != "" && r.Status.State != recovery.State(state) {
					continue
				}
				if (byTenant && r.Command.Tenant != tenant) || !strings.HasPrefix(r.Command.Session, prefix) {
					continue
				}
				kept = append(kept, r)
			}
			sort.SliceStable(kept, func(i, j int) bool { return kept[i].Seq > kept[j].Seq })
			return renderCommands(g.stdout, kept, asJSON)
		},
	}
	cmd.Flags().StringVar(&state, "state", "", "only commands in this state: "+stateList())
	cmd.Flags().StringVar(&session, "session", "", "only the commands of this session: a token, a prefix of one, or TENANT/SESSION")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array (docs/cli.md)")
	return cmd
}

// renderCommands prints rows as `engine recovery list` does: a table, or
// (asJSON) a JSON array.
func renderCommands(w io.Writer, rows []recovery.Entry, asJSON bool) error {
	if asJSON {
		return writeJSON(w, nonNil(rows))
	}
	tw := tabwriter.NewWriter(console.NewWriter(w), 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tID\tSESSION\tSTATE\tOUTCOME\tATTEMPTS\tWORKER\tUPDATED\tREASON")
	for _, r := range rows {
		reason := r.Status.Reason
		if reason == "" {
			reason = r.Command.Reason
		}
		if r.Invalid != "" {
			reason = "invalid: " + r.Invalid
		}
		fmt.Fprintf(tw, "%d\t%s\t%s/%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.Seq, r.Command.ID, r.Command.Tenant, r.Command.Session,
			r.Status.State, orDash(string(r.Status.Outcome)), r.Status.Attempts, orDash(r.Status.Worker), tableTime(r.Status.UpdatedAt), cut(reason, 60))
	}
	return tw.Flush()
}

// commandShown is what `engine recovery show --json` prints: the command
// with its status, and every event of its session's log that names it.
type commandShown struct {
	recovery.Entry
	Events []eventLine `json:"events"`
}

func newRecoveryShowCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "show ID [--json]",
		Short: "Show a recovery command, its status, and every attempt recorded in its session's log",
		Long: `Show one recovery command: what it asks, its state and outcome, and every
event of its session's log that names it (attempts, outcome, park), in
stream order. --json prints {command, seq, status, events} (docs/cli.md).`,
		Example: cli.Examples(
			"a command and every attempt recorded in its session's log",
			"engine recovery show repair_orphans-3f2a9c1d0b7e4a5f6c81"),
		Args: cli.ArgsNamed("a command id; engine recovery list shows them", "ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			nc, log, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			rows, err := recovery.List(ctx, log.JetStream())
			if err != nil {
				return err
			}
			var row *recovery.Entry
			for i := range rows {
				if rows[i].Command.ID == args[0] {
					row = &rows[i]
				}
			}
			if row == nil {
				return fmt.Errorf("command %q not found (engine recovery list shows them)", args[0])
			}
			shown := commandShown{Entry: *row}
			c := row.Command
			err = log.ReadSession(ctx, c.Tenant, c.Session, events.ReadOptions{}, func(ev events.Event) error {
				if strings.Contains(string(ev.Data), c.ID) {
					shown.Events = append(shown.Events, newEventLine(ev))
				}
				return nil
			})
			if err != nil && !errors.Is(err, events.ErrSessionNotFound) {
				return err
			}
			return renderCommand(g.stdout, shown, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the command, its status and its events as JSON (docs/cli.md)")
	return cmd
}

// renderCommand prints one command as `engine recovery show` does.
func renderCommand(w io.Writer, c commandShown, asJSON bool) error {
	if asJSON {
		c.Events = nonNil(c.Events)
		return writeJSON(w, c)
	}
	w = console.NewWriter(w)
	cmd, st := c.Command, c.Status
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("command     %s\n", cmd.ID)
	p("kind        %s\n", cmd.Kind)
	p("session     %s/%s\n", cmd.Tenant, cmd.Session)
	if cmd.Turn != "" {
		p("turn        %s\n", cmd.Turn)
	}
	p("reason      %s\n", cut(cmd.Reason, 200))
	p("issued      %s by %s (seq %d, issue %d, evidence %v)\n", tableTime(cmd.IssuedAt), orDash(cmd.IssuedBy), c.Seq, cmd.Issue, cmd.Evidence)
	if b, err := json.Marshal(cmd.Params); err == nil && string(b) != "{}" {
		p("params      %s\n", b)
	}
	p("state       %s", st.State)
	if !st.UpdatedAt.IsZero() {
		p(" (updated %s)", tableTime(st.UpdatedAt))
	}
	p("\n")
	if st.Outcome != "" {
		p("outcome     %s\n", st.Outcome)
	}
	p("attempts    %d\n", st.Attempts)
	p("worker      %s\n", orDash(st.Worker))
	if st.Reason != "" {
		p("why         %s\n", cut(st.Reason, 200))
	}
	p("\nIN THE SESSION'S LOG\n")
	if len(c.Events) == 0 {
		p("  none\n")
	}
	for _, e := range c.Events {
		p("%-24s  %6d  %-22s  %s\n", timelineTime(e.Time), e.Seq, e.Type, e.Summary)
	}
	return nil
}

func newRecoveryIssueCommand(g *globals) *cobra.Command {
	var (
		kind, reason, turn, tenant string
		params                     recovery.Params
		toolUseIDs                 []string
	)
	cmd := &cobra.Command{
		Use:   "issue SESSION --kind KIND [--turn T] [--reason TEXT]",
		Short: "Issue a recovery command by hand (workers execute it in the session's order)",
		Long: `Issue a recovery command for a session. KIND is one of:
` + kindList() + `.
The command id derives from the kind, the session, the turn and the
session's last sequence, so issuing the same command twice before the
session changes stores it once.

Without --turn, abandon_turn takes the session's oldest turn in flight,
and retry_turn its latest failed turn.`,
		Example: cli.Examples(
			"abandon a turn that will never end",
			"engine recovery issue demo/rt-01JGZ8Q0 --kind abandon_turn --turn 01JGZ8Q1 --reason \"runtime crashed\"",
			"repair a session's orphaned tool_use blocks",
			"engine recovery issue demo/rt-01JGZ8Q0 --kind repair_orphans"),
		Args: cli.ArgsNamed("a session token, a unique prefix of one, or TENANT/SESSION", "SESSION"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !recovery.Kind(kind).Valid() {
				return fmt.Errorf("--kind %q: not a command kind; one of: %s", kind, kindList())
			}
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
			if err := recovery.CheckSetUp(ctx, log.JetStream()); err != nil {
				return err
			}
			last, err := log.LastSeq(ctx, ref.Tenant, ref.Session)
			if err != nil {
				return err
			}
			if turn == "" && (recovery.Kind(kind) == recovery.KindAbandonTurn || recovery.Kind(kind) == recovery.KindRetryTurn) {
				if turn, err = turnToRecover(ctx, log, ref, recovery.Kind(kind)); err != nil {
					return err
				}
			}
			c := recovery.NewCommand(recovery.Kind(kind), ref.Tenant, ref.Session, turn, reason, []uint64{last})
			params.ToolUseIDs = toolUseIDs
			c.Params = params
			c.IssuedBy = "engine recovery issue"
			if c.Kind == recovery.KindAbortSession {
				c.Diagnostics = &recovery.Diagnostics{Failed: reason, Tried: []string{"issued by hand"}}
			}
			seq, dup, err := recovery.Issue(ctx, log.JetStream(), c)
			if err != nil {
				return err
			}
			note := ""
			if dup {
				note = " (already issued: stored once)"
			}
			fmt.Fprintf(g.stdout, "issued %s at seq %d%s\n", c.ID, seq, note)
			return nil
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "tenant of the session (default: search every tenant)")
	cmd.Flags().StringVar(&kind, "kind", "", "command kind (required): "+kindList())
	cmd.Flags().StringVar(&reason, "reason", "issued by hand", "why, for the log")
	cmd.Flags().StringVar(&turn, "turn", "", "turn concerned (abandon_turn: default the oldest in flight; retry_turn: default the latest failed)")
	cmd.Flags().StringSliceVar(&toolUseIDs, "tool-use-id", nil, "repair_orphans: only these tool_use ids (default every orphan)")
	cmd.Flags().Uint64Var(&params.ToSeq, "to-seq", 0, "rewind_session: the sequence to rewind to")
	cmd.Flags().Uint64Var(&params.AtSeq, "at-seq", 0, "fork_session: the last sequence of the prefix to copy")
	cmd.Flags().StringVar(&params.ForkSession, "fork-session", "", "fork_session: the new session's token")
	cmd.Flags().StringVar(&params.ToProvider, "to-provider", "", "switch_provider: the provider to move to")
	cmd.Flags().StringVar(&params.Strategy, "strategy", "", "pivot_strategy: the strategy to pivot to")
	_ = cmd.MarkFlagRequired("kind")
	return cmd
}

// turnToRecover is the turn a command of kind names when --turn is not
// given: for abandon_turn the session's oldest turn in flight, for
// retry_turn its latest failed turn. Error: the session has none.
func turnToRecover(ctx context.Context, log *events.Log, ref events.SessionRef, kind recovery.Kind) (string, error) {
	store, err := projections.NewSnapshotStore(log.JetStream(), projections.SnapshotConfig{})
	if err != nil {
		return "", err
	}
	s, err := projections.Restore(ctx, log, store, ref.Tenant, ref.Session)
	if err != nil {
		return "", err
	}
	if kind == recovery.KindAbandonTurn {
		if t := s.InFlightTurn(); t != nil {
			return t.ID, nil
		}
		return "", fmt.Errorf("--kind abandon_turn: %s/%s has no turn in flight (engine inspect shows its turns); name one with --turn", ref.Tenant, ref.Session)
	}
	for i := len(s.Turns) - 1; i >= 0; i-- {
		if s.Turns[i].Status == projections.TurnFailed {
			return s.Turns[i].ID, nil
		}
	}
	return "", fmt.Errorf("--kind retry_turn: %s/%s has no failed turn (engine inspect shows its turns); name one with --turn", ref.Tenant, ref.Session)
}

func stateList() string {
	var ss []string
	for _, s := range recovery.States {
		ss = append(ss, string(s))
	}
	return strings.Join(ss, ", ")
}

func outcomeList() string {
	var ss []string
	for _, o := range events.Outcomes {
		ss = append(ss, string(o))
	}
	return strings.Join(ss, ", ")
}

func kindList() string {
	var ks []string
	for _, k := range recovery.Kinds {
		ks = append(ks, string(k))
	}
	return strings.Join(ks, ", ")
}
