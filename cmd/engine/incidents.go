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
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/correlate"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/forensics"
	"github.com/turnstone-dev/turnstone/projections"
)

// incident is one line of `engine incidents --by session`.
type incident struct {
	Tenant       string    `json:"tenant"`
	Session      string    `json:"session"`
	LastTime     time.Time `json:"last_time"`
	Status       string    `json:"status"`
	FirstAnomaly string    `json:"first_anomaly"`
	AnomalySeq   uint64    `json:"anomaly_seq,omitempty"`
	Recovery     string    `json:"recovery"`
	Violations   int       `json:"violations"`
}

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

--by session lists the anomalous sessions instead, one line each, with the
first anomaly and the latest recovery outcome. --since keeps the signals
(and sessions) within that duration, by event time.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if by != "incident" && by != "session" {
				return fmt.Errorf("--by %q: want incident or session", by)
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
			if by == "incident" {
				incs, err := fleetIncidents(ctx, log, forensics.IncidentsConfig{Since: cutoff, Tenant: tenant, Correlate: correlate.Config{Gap: gap}})
				if err != nil {
					return err
				}
				if asJSON {
					if incs == nil {
						incs = []correlate.Incident{}
					}
					enc := json.NewEncoder(g.stdout)
					enc.SetIndent("", "  ")
					return enc.Encode(incs)
				}
				return printIncidents(g.stdout, incs, limit)
			}
			states, err := restoreAll(ctx, log, tenant)
			if err != nil {
				return err
			}
			var out []incident
			for _, s := range states {
				if !s.Anomalous() || (!cutoff.IsZero() && s.LastTime.Before(cutoff)) {
					continue
				}
				out = append(out, describeIncident(s))
			}
			sort.SliceStable(out, func(i, j int) bool { return out[i].LastTime.After(out[j].LastTime) })
			if asJSON {
				if out == nil {
					out = []incident{}
				}
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			if len(out) == 0 {
				fmt.Fprintln(g.stdout, "no incidents")
				return nil
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "LAST EVENT\tSESSION\tSTATUS\tFIRST ANOMALY\tRECOVERY")
			for _, in := range out {
				fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%s\t%s\n", in.LastTime.UTC().Format(time.DateTime), in.Tenant, in.Session, in.Status,
					cut(in.FirstAnomaly, 70), cut(in.Recovery, 60))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().DurationVar(&since, "since", 0, "only signals and sessions with an event within this duration (e.g. 24h)")
	cmd.Flags().StringVar(&tenant, "tenant", "", "only this tenant")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	cmd.Flags().StringVar(&by, "by", "incident", "incident: correlated fleet incidents; session: one line per anomalous session")
	cmd.Flags().DurationVar(&gap, "gap", correlate.DefaultGap, "a window of an incident ends when this long passes without a signal of its key")
	cmd.Flags().IntVar(&limit, "sessions", 5, "how many affected sessions each incident lists (text output)")
	return cmd
}

// fleetIncidents correlates the fleet's incidents from the fleet index,
// restoring only the anomalous sessions; a log without an index (older
// than the index, and no engine has run since) is read whole instead.
func fleetIncidents(ctx context.Context, log *events.Log, cfg forensics.IncidentsConfig) ([]correlate.Incident, error) {
	store, err := projections.NewSnapshotStore(log.JetStream(), projections.SnapshotConfig{})
	if err != nil {
		return nil, err
	}
	sums, err := projections.ReadIndex(ctx, log.JetStream(), projections.IndexFilter{Tenant: cfg.Tenant})
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		states, err := restoreAll(ctx, log, cfg.Tenant)
		if err != nil {
			return nil, err
		}
		sums = make([]projections.Summary, 0, len(states))
		for _, s := range states {
			sums = append(sums, s.Summary(0))
		}
	} else if err != nil {
		return nil, err
	}
	return forensics.Incidents(ctx, log, store, sums, cfg)
}

// printIncidents prints each incident as a block: its key, when it was
// seen, its sessions and the evidence.
func printIncidents(w io.Writer, incs []correlate.Incident, limit int) error {
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
		fmt.Fprintf(w, "%s  %s%s\n", in.ID, in.Title, tags)
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

func describeIncident(s *projections.Session) incident {
	in := incident{Tenant: s.Tenant, Session: s.Session, LastTime: s.LastTime, Status: s.Status(), Violations: s.Totals.Violations, Recovery: "none"}
	if v := s.FirstAnomaly(); v != nil {
		in.FirstAnomaly, in.AnomalySeq = fmt.Sprintf("seq %d %s: %s", v.Seq, v.Rule, v.Detail), v.Seq
	} else {
		for _, t := range s.Turns {
			if t.Status == projections.TurnFailed || t.Status == projections.TurnAbandoned {
				in.FirstAnomaly, in.AnomalySeq = fmt.Sprintf("seq %d turn %s %s %s", t.EndedSeq, t.ID, t.Status, t.FailedStage), t.EndedSeq
				break
			}
		}
		if in.FirstAnomaly == "" {
			switch {
			case s.Outputs.Count >= 3:
				in.FirstAnomaly = fmt.Sprintf("loop: the same output %d times in a row", s.Outputs.Count)
			case s.Errors.Streak.Count >= 3:
				in.FirstAnomaly = fmt.Sprintf("loop: the same error %d times in a row", s.Errors.Streak.Count)
			case len(s.Flaky) > 0:
				in.FirstAnomaly = fmt.Sprintf("flaky-suspected %s at seq %d", s.Flaky[0].Tool, s.Flaky[0].FailSeq)
			default:
				in.FirstAnomaly = "recovery"
			}
		}
	}
	if n := len(s.Commands); n > 0 {
		c := s.Commands[n-1]
		switch {
		case c.Parked:
			in.Recovery = fmt.Sprintf("%s parked: %s", c.Kind, c.ParkReason)
		case c.Outcome != "":
			in.Recovery = fmt.Sprintf("%s %s after %d attempt(s)", c.Kind, c.Outcome, c.Attempts)
		default:
			in.Recovery = fmt.Sprintf("%s in progress", c.Kind)
		}
	}
	return in
}
