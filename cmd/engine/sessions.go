package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/console"
	"github.com/turnstone-dev/turnstone/projections"
)

func newSessionsCommand(g *globals) *cobra.Command {
	var (
		tenant string
		asJSON bool
		broken bool
	)
	cmd := &cobra.Command{
		Use:   "sessions [--tenant T] [--broken] [--json]",
		Short: "List the sessions in the log: tenant, session, turns, status, orphans, violations",
		Long: `List every session in the log, one line each: tenant, session, turns,
status (paused, in_turn, broken or idle), open orphaned tool_use blocks
(and how many were repaired), open violations (and how many were
resolved), what happened last (the latest anomaly and the latest
recovery with its outcome, such as "turn abandoned by hand ·
repair_orphans recovered"), events and the time of the last event. The rows come from the
fleet index the engines keep (bucket turnstone_sessions: one summary per
session, written within a second of its last event), so listing 100,000
sessions takes a moment; inspect a session for its whole state.

Events stored under a subject that names no valid session (a token the
contract forbids, such as a literal "*") are listed too, with status
"invalid" and the reason below the table.

--broken lists only the sessions with an open orphan or an open violation
(whatever their status shows first) and the invalid subjects. --json
prints an array of the sessions' summaries (docs/cli.md).`,
		Example: cli.Examples(
			"every session, one line each",
			"engine sessions",
			"the sessions of tenant acme with an open orphan or violation, as JSON",
			"engine sessions --tenant acme --broken --json"),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if tenant != "" && !events.ValidToken(tenant) {
				return fmt.Errorf("--tenant %q: must be 1-%d characters of [A-Za-z0-9_-]", tenant, events.MaxTokenLen)
			}
			ctx := cmd.Context()
			nc, log, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			rows, err := projections.ReadIndex(ctx, log.JetStream(), projections.IndexFilter{Tenant: tenant})
			if err != nil {
				return fmt.Errorf("read the fleet index: %w (has an engine run on this log? engine setup builds the index)", err)
			}
			if broken {
				rows = brokenRows(rows)
			}
			return renderSessions(g.stdout, rows, asJSON)
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "list only this tenant's sessions")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of summaries (docs/cli.md)")
	cmd.Flags().BoolVar(&broken, "broken", false, "list only sessions with an open orphan or violation, and invalid subjects")
	return cmd
}

// brokenRows keeps the rows with an open orphan or an open violation,
// and the invalid subjects: the rows whose ORPHANS or VIOLATIONS column
// does not start with 0.
func brokenRows(rows []projections.Summary) []projections.Summary {
	var kept []projections.Summary
	for _, v := range rows {
		if v.Status == projections.StatusInvalid || v.Counts.OrphansOpen > 0 || v.Counts.ViolationsOpen > 0 {
			kept = append(kept, v)
		}
	}
	return kept
}

// renderSessions prints the fleet index's rows as `engine sessions`
// does: a table, with the invalid subjects' reasons below it, or (asJSON)
// a JSON array of the rows.
func renderSessions(w io.Writer, views []projections.Summary, asJSON bool) error {
	if asJSON {
		if views == nil {
			views = []projections.Summary{}
		}
		return writeJSON(w, views)
	}
	w = console.NewWriter(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tSESSION\tTURNS\tSTATUS\tORPHANS\tVIOLATIONS\tWHAT HAPPENED\tEVENTS\tLAST EVENT")
	var invalid []projections.Summary
	for _, v := range views {
		if v.Status == projections.StatusInvalid {
			invalid = append(invalid, v)
			fmt.Fprintf(tw, "%s\t%s\t-\t%s\t-\t-\t-\t%d\t-\n", orDash(v.Tenant), orDash(v.Session), v.Status, v.Events)
			continue
		}
		c := v.Counts
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\n", v.Tenant, v.Session, c.TurnsTotal, v.Status,
			countCell(c.OrphansOpen, c.OrphansRepaired, "repaired"), countCell(c.ViolationsOpen, c.ViolationsResolved, "resolved"),
			orDash(cut(v.Triage.Text(), 60)), v.Events, tableTime(v.LastTime))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, v := range invalid {
		if _, err := fmt.Fprintf(w, "invalid: subject %s (%d event(s)): %s\n", v.Subject, v.Events, v.StatusDetail); err != nil {
			return err
		}
	}
	return nil
}
