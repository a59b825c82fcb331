package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/projections"
)

// incident is one line of `engine incidents`.
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
	)
	cmd := &cobra.Command{
		Use:   "incidents [--since DURATION]",
		Short: "Sessions with anomalies across the fleet, newest first, with the first anomaly and the recovery outcome",
		Long: `List the sessions that broke an invariant or needed recovery (orphans,
violations, failed or abandoned turns, loops, parked commands, flaky
verifier runs), newest first: each with its first anomaly and the outcome
of its latest recovery command. --since keeps sessions active within that
duration (by event time).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			nc, log, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			states, err := restoreAll(ctx, log, tenant)
			if err != nil {
				return err
			}
			cutoff := time.Time{}
			if since > 0 {
				cutoff = time.Now().Add(-since)
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
	cmd.Flags().DurationVar(&since, "since", 0, "only sessions with an event within this duration (e.g. 24h)")
	cmd.Flags().StringVar(&tenant, "tenant", "", "only this tenant")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	return cmd
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
