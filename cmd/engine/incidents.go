package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/console"
	"github.com/turnstone-dev/turnstone/internal/correlate"
	"github.com/turnstone-dev/turnstone/internal/forensics"
	"github.com/turnstone-dev/turnstone/projections"
)

func newIncidentsCommand(g *globals) *cobra.Command {
	var (
		since  time.Duration
		tenant string
		asJSON bool
		by     string
		gap    time.Duration
		limit  int
	)
	cmd := &cobra.Command{
		Use:   "incidents [--since DURATION] [--by incident|session]",
		Short: "Fleet incidents: errors and anomalies of many sessions correlated by provider, error class and code, tool, runtime, model",
		Long: `List the fleet's incidents, newest first. The errors (failed turns,
recorded errors) and anomalies (violations, orphans, abandoned turns, flaky
tools) of every anomalous session are grouped by a correlation key whose
fields follow the error class (a provider's outage is one incident whatever
the model; a bad request is one per model; a runtime that leaves orphans is
one per runtime version; docs/forensics.md has the whole rule), and split
into windows where --gap passes without a signal. An incident seen in two
or more windows is recurring. Each one names its sessions and tenants, the
recovery outcome of each session, and a hypothesis that states only the
evidence ("30 sessions on provider anthropic failed with overloaded_error
(529) at 16:07 UTC; 28 recovered by switch_provider, 2 with no recovery").

Sessions come from the fleet index; only the anomalous ones are restored.

--by session lists the anomalous sessions instead, newest first, one line
each: its status, its first anomaly (marked resolved when a repair fixed
it) and its latest recovery command with its outcome; subjects that name
no valid session are listed too; --json then prints the sessions' views
(docs/cli.md). --since keeps the signals (and sessions) within that
duration, by event time: a Go duration or a number of days ("90m", "24h",
"7d"). --json prints the incidents (docs/cli.md, docs/schema).`,
		Example: cli.Examples(
			"the incidents of the last day",
			"engine incidents --since 1d",
			"one line per anomalous session of tenant acme, as JSON",
			"engine incidents --by session --tenant acme --json"),
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if by != "incident" && by != "session" {
				return fmt.Errorf("--by %q: want incident or session", by)
			}
			if tenant != "" && !events.ValidToken(tenant) {
				return fmt.Errorf("--tenant %q: must be 1-%d characters of [A-Za-z0-9_-]", tenant, events.MaxTokenLen)
			}
			nc, log, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			cutoff := time.Time{}
			if since > 0 {
				cutoff = time.Now().Add(-since)
			}
			store, err := projections.NewSnapshotStore(log.JetStream(), projections.SnapshotConfig{})
			if err != nil {
				return err
			}
			if by == "incident" {
				incs, err := forensics.FleetIncidents(ctx, log, store, forensics.IncidentsConfig{Since: cutoff, Tenant: tenant, Correlate: correlate.Config{Gap: gap}})
				if err != nil {
					return err
				}
				if asJSON {
					if incs == nil {
						incs = []correlate.Incident{}
					}
					return writeJSON(g.stdout, incs)
				}
				return printIncidents(g.stdout, incs, limit)
			}
			views, err := forensics.AnomalousViews(ctx, log, store, tenant)
			if err != nil {
				return err
			}
			return renderIncidents(g.stdout, forensics.Recent(views, cutoff), asJSON)
		},
	}
	cli.DurationVar(cmd.Flags(), &since, "since", 0, "only signals and sessions with an event within this duration: 90m, 24h, 7d")
	cmd.Flags().StringVar(&tenant, "tenant", "", "only this tenant")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array: the incidents, or with --by session the sessions' views (docs/cli.md)")
	cmd.Flags().StringVar(&by, "by", "incident", "incident: correlated fleet incidents; session: one line per anomalous session")
	cmd.Flags().DurationVar(&gap, "gap", correlate.DefaultGap, "a window of an incident ends when this long passes without a signal of its key")
	cmd.Flags().IntVar(&limit, "sessions", 5, "how many affected sessions each incident lists (text output)")
	return cmd
}

// printIncidents prints each incident as a block: its key, when it was
// seen, its sessions and the evidence.
func printIncidents(w io.Writer, incs []correlate.Incident, limit int) error {
	w = console.NewWriter(w) // stored text never reaches the terminal raw
	if len(incs) == 0 {
		_, err := fmt.Fprintln(w, "no incidents")
		return err
	}
	for i, in := range incs {
		if i > 0 {
			fmt.Fprintln(w)
		}
		tags := ""
		if in.Open {
			tags += " [open]"
		}
		if in.Recurring {
			tags += " [recurring]"
		}
		fmt.Fprintf(w, "%s  [%s] %s: %s%s\n", in.ID, in.Severity, in.Label, in.Title, tags)
		fmt.Fprintf(w, "  seen      %s .. %s UTC, %d window(s)\n", in.FirstSeen.Format(time.DateTime), in.LastSeen.Format(time.DateTime), len(in.Windows))
		fmt.Fprintf(w, "  affected  %d session(s) of %d tenant(s) (%s), %d signal(s)\n", len(in.Sessions), len(in.Tenants), strings.Join(in.Tenants, ", "), in.Signals)
		fmt.Fprintf(w, "  evidence  %s\n", in.Hypothesis)
		if in.Example != "" {
			fmt.Fprintf(w, "  example   %s\n", cut(in.Example, 100))
		}
		for j, a := range in.Sessions {
			if j == limit {
				fmt.Fprintf(w, "            ... %d more (--json lists them all)\n", len(in.Sessions)-limit)
				break
			}
			out := a.Outcome
			if a.By != "" {
				out += " by " + a.By
			}
			fmt.Fprintf(w, "  session   %s/%s at seq %d: %s\n", a.Tenant, a.Session, a.Seq, out)
		}
	}
	return nil
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
