package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/console"
	"github.com/turnstone-dev/turnstone/projections"
)

func newSessionsCommand(g *globals) *cobra.Command {
	var (
		tenant      string
		asJSON      bool
		broken      bool
		limit, page int
	)
	cmd := &cobra.Command{
		Use:   "sessions [--tenant T] [--broken] [--json]",
		Short: "List the sessions in the log: tenant, session, turns, status, orphans, violations",
		Long: `List every session in the log, one line each: tenant, session, turns,
status (paused, broken, interrupted, in_turn or idle), open orphaned tool_use blocks
(and how many were repaired), open violations (and how many were
resolved), what happened last (the latest anomaly and the latest
recovery with its outcome, such as "turn abandoned by hand ·
repair_orphans recovered"), events and the time of the last event. The rows come from the
fleet index the engines keep (bucket turnstone_sessions: one summary per
session, written within a second of its last event); inspect a session
for its whole state.

The table shows a page of --limit rows (default 1,000; --page N for the
next ones, --limit 0 for all): a page reads the index's keys and only its
own rows, so it comes in well under a second at 100,000 sessions. --json
prints every row unless --limit is given.

A history session (an import) whose turn is in flight and whose last
event is older than the live horizon (30 minutes) is "interrupted": the
transcript ends mid-turn. The pending tool_use ids it left are named
below the table. Nothing is written for it: importing the grown file
continues the turn.

The table and --json show the fleet index, which the engine's projector
writes as it folds the log: when it has events still to fold, a note on
stderr says how many, and rows may trail the log for that moment.

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
			if page < 1 {
				return fmt.Errorf("--page %d: pages count from 1", page)
			}
			if limit < 0 {
				limit = 1000 // the table's default page
				if asJSON || cmd.Flags().Changed("limit") {
					limit = 0
				}
			}
			nc, err := g.dial()
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstreamOf(nc)
			if err != nil {
				return err
			}
			// The projector's backlog is read before the rows: when it is
			// 0, the rows hold every event stored before they were read.
			bctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			backlog, berr := projections.Backlog(bctx, js, "")
			cancel()
			defer func() {
				if berr == nil && backlog > 0 {
					fmt.Fprintf(g.stderr, "note: the engine's projector had %d event(s) still to fold: rows may trail the log; run again in a moment\n", backlog)
				}
			}()
			l, err := listSessions(ctx, js, projections.IndexFilter{Tenant: tenant}, broken, limit, page)
			if err != nil {
				return fmt.Errorf("read the fleet index: %w (has an engine run on this log? engine setup builds the index)", err)
			}
			now := time.Now()
			if asJSON {
				rows, err := projections.RowsStatusAt(l.rows, now, projections.DefaultLiveHorizon)
				if err != nil {
					return err
				}
				return writeRawJSON(g.stdout, rows)
			}
			sums, err := decodeRows(l.rows)
			if err != nil {
				return err
			}
			for i := range sums {
				sums[i].Status = sums[i].StatusAt(now, projections.DefaultLiveHorizon)
			}
			if err := renderSessions(g.stdout, sums, false); err != nil {
				return err
			}
			if l.total > len(l.rows) && len(l.rows) > 0 {
				first := (page-1)*limit + 1
				fmt.Fprintf(g.stdout, "sessions %d-%d of %d (--page %d for the next, --limit 0 for all)\n", first, first+len(l.rows)-1, l.total, page+1)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "list only this tenant's sessions")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of summaries (docs/cli.md)")
	cmd.Flags().BoolVar(&broken, "broken", false, "list only sessions with an open orphan or violation, and invalid subjects")
	cmd.Flags().IntVar(&limit, "limit", -1, "rows per page (default 1000 for the table, every row for --json; 0: every row)")
	cmd.Flags().IntVar(&page, "page", 1, "which page of --limit rows, from 1")
	return cmd
}

// sessionList is a page of the fleet index's rows (not decoded) and how
// many rows the listing holds in all.
type sessionList struct {
	rows  []projections.IndexRow
	total int
}

// listSessions reads page (from 1) of limit rows (0: every row) of the
// fleet index the filter selects. A page of the whole index reads its
// keys, then only the page's rows; --broken (which needs every row's
// counts) and limit 0 read every row.
func listSessions(ctx context.Context, js jetstream.JetStream, f projections.IndexFilter, broken bool, limit, page int) (sessionList, error) {
	if limit > 0 && !broken {
		keys, err := projections.IndexKeys(ctx, js, f)
		if err != nil {
			return sessionList{}, err
		}
		from := min((page-1)*limit, len(keys))
		rows, err := projections.GetIndexRows(ctx, js, keys[from:min(from+limit, len(keys))], f.Tenant)
		return sessionList{rows: rows, total: len(keys)}, err
	}
	rows, err := projections.ReadIndexRows(ctx, js, f)
	if err != nil {
		return sessionList{}, err
	}
	if broken {
		sums, err := decodeRows(rows)
		if err != nil {
			return sessionList{}, err
		}
		kept := rows[:0]
		for i, s := range sums {
			if isBroken(s) {
				kept = append(kept, rows[i])
			}
		}
		rows = kept
	}
	total := len(rows)
	if limit > 0 {
		from := min((page-1)*limit, len(rows))
		rows = rows[from:min(from+limit, len(rows))]
	}
	return sessionList{rows: rows, total: total}, nil
}

// decodeRows decodes index rows into their summaries.
func decodeRows(rows []projections.IndexRow) ([]projections.Summary, error) {
	return projections.DecodeIndexRows(rows)
}

// writeRawJSON prints index rows as a JSON array of their summaries, each
// as the index stores it (the Summary's JSON, docs/cli.md), one a line:
// 100,000 rows are printed without being decoded.
func writeRawJSON(w io.Writer, rows []projections.IndexRow) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	bw.WriteString("[")
	for i, r := range rows {
		if i > 0 {
			bw.WriteString(",")
		}
		bw.WriteString("\n")
		bw.Write(r.Value)
	}
	if len(rows) > 0 {
		bw.WriteString("\n")
	}
	bw.WriteString("]\n")
	return bw.Flush()
}

// brokenRows keeps the rows isBroken keeps.
func brokenRows(rows []projections.Summary) []projections.Summary {
	var kept []projections.Summary
	for _, v := range rows {
		if isBroken(v) {
			kept = append(kept, v)
		}
	}
	return kept
}

// isBroken reports whether a row has an open orphan or an open
// violation, or is an invalid subject's: a row whose ORPHANS or
// VIOLATIONS column does not start with 0.
func isBroken(v projections.Summary) bool {
	return v.Status == projections.StatusInvalid || v.Counts.OrphansOpen > 0 || v.Counts.ViolationsOpen > 0
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
	for _, v := range views {
		if v.Status != projections.StatusInterrupted {
			continue
		}
		pending := "none"
		if len(v.PendingToolUseIDs) > 0 {
			pending = strings.Join(v.PendingToolUseIDs, ", ")
			if more := v.PendingToolUses - len(v.PendingToolUseIDs); more > 0 {
				pending += fmt.Sprintf(" and %d more", more)
			}
		}
		if _, err := fmt.Fprintf(w, "interrupted: %s/%s ends mid-turn (last event %s); tool_use without its result: %s\n",
			v.Tenant, v.Session, tableTime(v.LastTime), pending); err != nil {
			return err
		}
	}
	return nil
}
