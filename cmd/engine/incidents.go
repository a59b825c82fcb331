package main

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/console"
	"github.com/turnstone-dev/turnstone/projections"
)

func newIncidentsCommand(g *globals) *cobra.Command {
	var (
		since  time.Duration
		tenant string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "incidents [--since DURATION] [--tenant T] [--json]",
		Short: "Sessions with anomalies across the fleet, newest first, with the first anomaly and the recovery outcome",
		Long: `List the sessions that broke an invariant or needed recovery (orphans,
violations, failed or abandoned turns, loops, parked or failed commands,
flaky verifier runs), newest first: each with its status, its first
anomaly (marked resolved when a repair fixed it) and its latest recovery
command with its outcome. Events stored under a subject that names no
valid session are listed too. --since keeps sessions active within that
duration (by event time). --json prints an array of the sessions' views,
the same objects as sessions --json (docs/cli.md).`,
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
			views, err := loadViews(ctx, log, tenant)
			if err != nil {
				return err
			}
			cutoff := time.Time{}
			if since > 0 {
				cutoff = time.Now().Add(-since)
			}
			return renderIncidents(g.stdout, incidents(views, cutoff), asJSON)
		},
	}
	cmd.Flags().DurationVar(&since, "since", 0, "only sessions with an event within this duration (e.g. 24h)")
	cmd.Flags().StringVar(&tenant, "tenant", "", "only this tenant")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of views (docs/cli.md)")
	return cmd
}

// incidents keeps the anomalous views (View.Anomalous) with an event
// after cutoff (any when zero; invalid subjects have no time and are
// always kept), newest first.
func incidents(views []projections.View, cutoff time.Time) []projections.View {
	var out []projections.View
	for _, v := range views {
		if !v.Anomalous || (!cutoff.IsZero() && v.Status != projections.StatusInvalid && v.LastTime.Before(cutoff)) {
			continue
		}
		out = append(out, v)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].LastTime.After(out[j].LastTime) })
	return out
}

// renderIncidents prints views as `engine incidents` does: a table, or
// (asJSON) a JSON array of the views.
func renderIncidents(w io.Writer, views []projections.View, asJSON bool) error {
	if asJSON {
		return writeJSON(w, nonNil(views))
	}
	w = console.NewWriter(w)
	if len(views) == 0 {
		_, err := fmt.Fprintln(w, "no incidents")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LAST EVENT\tSESSION\tSTATUS\tORPHANS\tVIOLATIONS\tFIRST ANOMALY\tRECOVERY")
	for _, v := range views {
		name := v.Tenant + "/" + v.Session
		orphans, violations := "-", "-"
		if v.Status == projections.StatusInvalid {
			name = v.Subject
		} else {
			c := v.Counts
			orphans = countCell(c.OrphansOpen, c.OrphansRepaired, "repaired")
			violations = countCell(c.ViolationsOpen, c.ViolationsResolved, "resolved")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", tableTime(v.LastTime), name, v.Status, orphans, violations,
			cut(anomalyText(v.FirstAnomaly), 90), cut(recoveryText(v.LastCommand), 70))
	}
	return tw.Flush()
}
