package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
)

type replayFlags struct {
	tenant    string
	untilSeq  uint64
	untilTime string
	json      bool
}

func newReplayCommand(g *globals) *cobra.Command {
	var f replayFlags
	cmd := &cobra.Command{
		Use:   "replay SESSION",
		Short: "Replay a session's events as a timeline, flagging each anomaly where it arises",
		Long: `Replay a session from its first event: one line per event (time, stream
sequence, type, summary), with each broken invariant flagged under the event
that broke it, and the session's state at the end.

SESSION is a session token, a unique prefix of one, or TENANT/SESSION.
--until-seq stops after that stream sequence; --until-time stops before the
first event whose time (RFC 3339) is after T. --json prints one JSON object
per event (JSON Lines) instead.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			var until time.Time
			if f.untilTime != "" {
				t, err := time.Parse(time.RFC3339Nano, f.untilTime)
				if err != nil {
					return fmt.Errorf("--until-time %q: want RFC 3339, such as 2026-02-11T21:18:41Z", f.untilTime)
				}
				until = t
			}
			nc, log, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer nc.Close()
			ref, err := resolveSession(ctx, log, args[0], f.tenant)
			if err != nil {
				return err
			}
			r := &replayer{ctx: ctx, log: log, w: g.stdout, json: f.json, until: until}
			err = log.ReadSession(ctx, ref.Tenant, ref.Session, events.ReadOptions{UntilSeq: f.untilSeq}, r.event)
			if err != nil && !errors.Is(err, errStopReplay) {
				return err
			}
			return r.end()
		},
	}
	cmd.Flags().StringVar(&f.tenant, "tenant", "", "tenant of the session (default: search every tenant)")
	cmd.Flags().Uint64Var(&f.untilSeq, "until-seq", 0, "stop after this stream sequence")
	cmd.Flags().StringVar(&f.untilTime, "until-time", "", "stop before the first event whose time is after this RFC 3339 time")
	cmd.Flags().BoolVar(&f.json, "json", false, "print JSON Lines: one object per event")
	return cmd
}

var errStopReplay = errors.New("replay reached --until-time")

// replayer folds a session event by event and prints the timeline. It
// holds no event: a rewind (session.rewound) that needs a refold reads the
// session again from the log, up to the rewind, so a replay streams
// whatever the session's length.
type replayer struct {
	ctx   context.Context
	log   projections.SessionReader
	w     io.Writer
	json  bool
	until time.Time
	state projections.Session
	n     int
}

// replayLine is one event of `engine replay --json`.
type replayLine struct {
	Seq       uint64                  `json:"seq"`
	Time      time.Time               `json:"time"`
	Type      events.Type             `json:"type"`
	ID        string                  `json:"id,omitempty"`
	Turn      string                  `json:"turn,omitempty"`
	Summary   string                  `json:"summary"`
	Invalid   string                  `json:"invalid,omitempty"`
	Anomalies []projections.Violation `json:"anomalies"`
}

func (r *replayer) event(ev events.Event) error {
	if !r.until.IsZero() && ev.Time.After(r.until) {
		return errStopReplay
	}
	anomalies := r.state.Apply(ev)
	r.n++
	if r.state.NeedsRefold {
		if err := r.state.RefoldLog(r.ctx, r.log); err != nil {
			return err
		}
	}
	if r.json {
		line := replayLine{Seq: ev.Seq, Time: ev.Time, Type: ev.Type, ID: ev.ID, Turn: ev.Turn, Summary: ev.Summary(), Anomalies: anomalies}
		if ev.Err != nil {
			line.Invalid = ev.Err.Error()
		}
		if line.Anomalies == nil {
			line.Anomalies = []projections.Violation{}
		}
		b, err := json.Marshal(line)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(r.w, "%s\n", b)
		return err
	}
	typ := string(ev.Type)
	if typ == "" {
		typ = "?"
	}
	ts := "-"
	if !ev.Time.IsZero() {
		ts = ev.Time.UTC().Format("2006-01-02T15:04:05.000Z")
	}
	if _, err := fmt.Fprintf(r.w, "%s  %6d  %-22s  %s\n", ts, ev.Seq, typ, ev.Summary()); err != nil {
		return err
	}
	for _, a := range anomalies {
		if _, err := fmt.Fprintf(r.w, "%32s!! %s: %s\n", "", a.Rule, a.Detail); err != nil {
			return err
		}
	}
	return nil
}

func (r *replayer) end() error {
	if r.json {
		return nil
	}
	s := &r.state
	_, err := fmt.Fprintf(r.w, "\n%d events replayed: %s; turns %d; orphaned tool_use %v; violations %d (%d resolved)\n",
		r.n, s.Status(), s.Totals.Turns, s.OrphanedToolUseIDs(), s.Totals.Violations, s.Totals.Resolved)
	return err
}
