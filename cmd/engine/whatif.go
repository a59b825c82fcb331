package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/audit"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/console"
	"github.com/turnstone-dev/turnstone/internal/reconciler"
	"github.com/turnstone-dev/turnstone/internal/whatif"
)

func newWhatifCommand(g *globals) *cobra.Command {
	var (
		tenant, policyFile, baseline, clock string
		assumeLive, asJSON                  bool
	)
	cmd := &cobra.Command{
		Use:   "whatif [--policy FILE] [--baseline recorded|FILE] [--assume-live] [--clock event|stored] [--json] (TENANT/SESSION... | --tenant T)",
		Short: "Replay recorded sessions through the reconciler under a policy, and compare its decisions with what was recorded",
		Long: `Fold each session's recorded runtime events and run the reconciler's own
Decide at each event and at each time a deadline falls due between two
events, as the engine would have. Print, per session, the decisions the
policy takes (the command kind, or distillation_skipped for a deferred
distillation, and the seq of the latest runtime event folded when it is
taken), each compared with the baseline: same, added, changed (taken at
another seq: baseline_seq) or removed (the baseline takes it, the policy
does not), and the first divergence.

--policy is the policy to try (default: the policy in force, as the
engines recorded it in the audit stream when they loaded it; the default
policy when none was recorded). --baseline recorded (the default)
compares with the commands the reconciler issued and the answers it
wrote; --baseline FILE with what that policy would decide on the same
replay. --clock event takes every time from the events themselves (how
the session ran: a transcript's times); --clock stored (the default) from
when the log stored them, the clock the engine reads. --assume-live
judges history sessions (imports) as live sessions.

The log effects of each decision are folded as the worker writes them
(an abandoned turn ends, a repaired orphan is answered), the outcomes of
the runtime's part (a retry, a distillation) as recorded. Presence is not
recorded: the replay assumes no runtime present and never resumes a
session. It writes nothing and publishes nothing; the same log gives the
same output on every run. --json prints an array of objects with tenant,
session, events, decisions and first_divergence (docs/cli.md).`,
		Example: cli.Examples(
			"what the engine would have decided for tenant demo's sessions with a 5-minute turn deadline",
			"engine whatif --tenant demo --policy short-deadline.yaml",
			"an imported transcript judged as if it had been followed live, on its own clock",
			"engine whatif grow/55604662 --assume-live --clock event"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (len(args) == 0) == (tenant == "") {
				return errors.New("name sessions (TENANT/SESSION...) or one tenant (--tenant T), not both")
			}
			if tenant != "" && !events.ValidToken(tenant) {
				return fmt.Errorf("--tenant %q: must be 1-%d characters of [A-Za-z0-9_-]", tenant, events.MaxTokenLen)
			}
			c := whatif.Clock(clock)
			if c != whatif.ClockEvent && c != whatif.ClockStored {
				return fmt.Errorf("--clock %q: want event or stored", clock)
			}
			ctx := cmd.Context()
			nc, log, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			cfg := whatif.Config{Log: log, AssumeLive: assumeLive, Clock: c, ScanChildren: tenant != ""}
			var tried, against string
			if cfg.Policy, tried, err = whatifPolicy(ctx, log.JetStream(), policyFile); err != nil {
				return err
			}
			switch baseline {
			case "", "recorded":
				against = "what was recorded"
			default:
				if cfg.Baseline, err = reconciler.LoadPolicy(baseline); err != nil {
					return err
				}
				against = baseline
			}
			refs, err := whatifSessions(ctx, log, args, tenant)
			if err != nil {
				return err
			}
			res, err := whatif.Run(ctx, cfg, refs)
			if err != nil {
				return err
			}
			if asJSON {
				if res == nil {
					res = []whatif.Result{}
				}
				for i := range res {
					if res[i].Decisions == nil {
						res[i].Decisions = []whatif.Decision{}
					}
				}
				return writeJSON(g.stdout, res)
			}
			return printWhatif(g.stdout, res, tried, against, c, assumeLive)
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", "", "replay every session of this tenant")
	cmd.Flags().StringVar(&policyFile, "policy", "", "the policy file to try (default: the policy recorded in force, else the defaults)")
	cmd.Flags().StringVar(&baseline, "baseline", "recorded", "compare with what was recorded, or with what this policy FILE decides")
	cmd.Flags().StringVar(&clock, "clock", string(whatif.ClockStored), "where times come from: event (the events' own times) or stored (the log's)")
	cmd.Flags().BoolVar(&assumeLive, "assume-live", false, "judge history sessions (imports) as live")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array of results (docs/cli.md)")
	return cmd
}

// whatifPolicy is the policy to try and what to call it: the file's, or
// the one last recorded in the audit stream, or the defaults.
func whatifPolicy(ctx context.Context, js jetstream.JetStream, file string) (*reconciler.Policy, string, error) {
	if file != "" {
		p, err := reconciler.LoadPolicy(file)
		return p, file, err
	}
	rec, err := audit.LatestPolicy(ctx, js)
	switch {
	case err == nil:
		p, err := reconciler.ParsePolicy([]byte(rec.Policy))
		if err != nil {
			return nil, "", fmt.Errorf("the policy recorded at audit seq %d: %w", rec.Seq, err)
		}
		return p, fmt.Sprintf("the policy in force (recorded at audit seq %d, %s)", rec.Seq, tableTime(rec.Stored)), nil
	case errors.Is(err, jetstream.ErrMsgNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return reconciler.DefaultPolicy(), "the default policy (none recorded)", nil
	}
	return nil, "", err
}

// whatifSessions resolves the sessions named, or lists the tenant's.
func whatifSessions(ctx context.Context, log *events.Log, args []string, tenant string) ([]whatif.Ref, error) {
	var refs []whatif.Ref
	if tenant != "" {
		all, err := log.Sessions(ctx, tenant)
		if err != nil {
			return nil, err
		}
		for _, r := range all {
			if !strings.HasPrefix(r.Session, "_") {
				refs = append(refs, whatif.Ref{Tenant: r.Tenant, Session: r.Session})
			}
		}
		return refs, nil
	}
	for _, a := range args {
		r, err := resolveSession(ctx, log, a, "")
		if err != nil {
			return nil, err
		}
		refs = append(refs, whatif.Ref{Tenant: r.Tenant, Session: r.Session})
	}
	return refs, nil
}

// printWhatif prints the results as a table per session.
func printWhatif(w io.Writer, res []whatif.Result, tried, against string, clock whatif.Clock, assumeLive bool) error {
	w = console.NewWriter(w)
	live := ""
	if assumeLive {
		live = ", history judged as live"
	}
	fmt.Fprintf(w, "policy %s, compared with %s; clock %s%s\n", tried, against, clock, live)
	for _, r := range res {
		fmt.Fprintf(w, "\n%s/%s: %d events, %d decisions, first divergence: %s\n", r.Tenant, r.Session, r.Events, len(r.Decisions), r.FirstDivergence)
		if len(r.Decisions) == 0 {
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CHANGE\tSEQ\tTIME\tKIND\tTURN\tREASON")
		for _, d := range r.Decisions {
			change := d.Change
			if d.Change == whatif.Changed {
				change = fmt.Sprintf("changed (was seq %d at %s)", d.BaselineSeq, timelineTime(d.BaselineTime))
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", change, d.Seq, timelineTime(d.Time), d.Kind, orDash(d.Turn), cut(d.Reason, 120))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}
