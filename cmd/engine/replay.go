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
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/console"
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
		Use:   "replay SESSION [--until-seq N] [--until-time T] [--json]",
		Short: "Replay a session's events as a timeline, flagging each anomaly where it arises",
		Long: `Replay a session from its first event, in stream order: one line per event
(time, stream sequence, type, summary), with each broken invariant flagged
under the event that broke it ("!!"), each one a repair resolved flagged
under the repair ("ok"), and the session's state at the end.

A snapshot.taken event carries the time of the last event its snapshot
covers, which is earlier than the events stored before it: its line
shows no time of its own, only the sequence it covers and that time.

SESSION is a session token, a unique prefix of one, or TENANT/SESSION.
--until-seq stops after that stream sequence; --until-time stops before the
first event whose time (RFC 3339) is after T. --json prints JSON Lines
instead: one object per event, the whole event (envelope and data,
masked) with its anomalies, then one object with the final view
(docs/cli.md).

A range that holds no event of the session (--until-seq or --until-time
before its first event) is an error that says where the session starts.`,
		Example: cli.Examples(
			"the timeline of a session, anomalies flagged where they arise",
			"engine replay 258c7280",
			"the state as of stream sequence 120, as JSON Lines",
			"engine replay demo/rt-01JGZ8Q0 --until-seq 120 --json"),
		Args: cli.ArgsNamed("a session token, a unique prefix of one, or TENANT/SESSION; engine sessions lists them", "SESSION"),
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
			r := newReplayer(g.stdout, f.json)
			state, err := projections.Replay(ctx, log, ref.Tenant, ref.Session,
				projections.ReplayRange{To: f.untilSeq, UntilTime: until}, r.step)
			if err != nil {
				return err
			}
			if r.n == 0 && (f.untilSeq > 0 || !until.IsZero()) {
				return noEventsBefore(ctx, log, ref, f.untilSeq, until)
			}
			return r.end(state)
		},
	}
	cmd.Flags().StringVar(&f.tenant, "tenant", "", "tenant of the session (default: search every tenant)")
	cmd.Flags().Uint64Var(&f.untilSeq, "until-seq", 0, "stop after this stream sequence")
	cmd.Flags().StringVar(&f.untilTime, "until-time", "", "stop before the first event whose time is after this RFC 3339 time")
	cmd.Flags().BoolVar(&f.json, "json", false, "print JSON Lines: one object per event, then the final view (docs/cli.md)")
	return cmd
}

// noEventsBefore is the error of a replay whose range holds no event of
// the session: it names the session's first event.
func noEventsBefore(ctx context.Context, log *events.Log, ref events.SessionRef, untilSeq uint64, until time.Time) error {
	var first events.Event
	found := false
	err := log.ReadSession(ctx, ref.Tenant, ref.Session, events.ReadOptions{}, func(ev events.Event) error {
		first, found = ev, true
		return errStopRead
	})
	if err != nil && !errors.Is(err, errStopRead) {
		return err
	}
	where := "the session has no event"
	if found {
		where = fmt.Sprintf("%s/%s starts at seq %d (%s)", ref.Tenant, ref.Session, first.Seq, timelineTime(first.Time))
	}
	if untilSeq > 0 {
		return fmt.Errorf("--until-seq %d: no event of the session up to it: %s", untilSeq, where)
	}
	return fmt.Errorf("--until-time %s: no event of the session up to it: %s", until.UTC().Format(time.RFC3339Nano), where)
}

// errStopRead ends a read early.
var errStopRead = errors.New("stop reading")

// replayer prints the steps of a replay (projections.Replay) as the
// timeline. It holds no event, so a replay streams whatever the
// session's length.
type replayer struct {
	w    io.Writer
	json bool
	n    int
}

// newReplayer returns a replayer printing to w: text through
// console.NewWriter, or (asJSON) JSON Lines.
func newReplayer(w io.Writer, asJSON bool) *replayer {
	if !asJSON {
		w = console.NewWriter(w)
	}
	return &replayer{w: w, json: asJSON}
}

// eventLine is one event as the JSON outputs print it (replay --json,
// recovery show --json): its position, its one-line summary, and the
// whole event, masked (docs/cli.md).
type eventLine struct {
	Seq     uint64          `json:"seq"`
	Time    time.Time       `json:"time"`
	Type    events.Type     `json:"type"`
	ID      string          `json:"id,omitempty"`
	Turn    string          `json:"turn,omitempty"`
	Summary string          `json:"summary"`
	Invalid string          `json:"invalid,omitempty"`
	Event   json.RawMessage `json:"event"`
}

func newEventLine(ev events.Event) eventLine {
	l := eventLine{Seq: ev.Seq, Time: ev.Time, Type: ev.Type, ID: ev.ID, Turn: ev.Turn, Summary: ev.Summary(), Event: wholeEvent(ev)}
	if ev.Err != nil {
		l.Invalid = ev.Err.Error()
	}
	return l
}

// replayLine is one event of `engine replay --json`: the event, the
// violations it gave rise to (anomalies) and those a repair in it
// resolved (resolved).
type replayLine struct {
	eventLine
	Anomalies []projections.Violation `json:"anomalies"`
	Resolved  []projections.Violation `json:"resolved"`
}

// replayEnd is the last line of `engine replay --json`: how many events
// were replayed and the view of the state they fold to.
type replayEnd struct {
	Replayed int              `json:"replayed"`
	View     projections.View `json:"view"`
}

// step prints one step.
func (r *replayer) step(s projections.Step) error {
	ev := s.Event
	r.n++
	anomalies, resolved := s.Anomalies, s.Resolved
	if r.json {
		line := replayLine{eventLine: newEventLine(ev), Anomalies: nonNil(anomalies), Resolved: nonNil(resolved)}
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
	ts, summary := timelineTime(ev.Time), ev.Summary()
	if p, err := ev.Payload(); err == nil && ev.Err == nil {
		if snap, ok := p.(*events.SnapshotTaken); ok {
			// Stamped with the time of the last event it covers: that time
			// would run the timeline backwards.
			ts, summary = "", fmt.Sprintf("snapshot of the state up to seq %d (time of that event: %s)", snap.CoversSeq, timelineTime(ev.Time))
		}
	}
	if _, err := fmt.Fprintf(r.w, "%-24s  %6d  %-22s  %s\n", ts, ev.Seq, typ, summary); err != nil {
		return err
	}
	for _, a := range anomalies {
		if _, err := fmt.Fprintf(r.w, "%32s!! %s: %s\n", "", a.Rule, a.Detail); err != nil {
			return err
		}
	}
	for _, a := range resolved {
		if _, err := fmt.Fprintf(r.w, "%32sok resolved %s of seq %d: %s\n", "", a.Rule, a.Seq, a.Detail); err != nil {
			return err
		}
	}
	return nil
}

// wholeEvent is ev as `replay --json` prints it: the envelope and data as
// stored, with secrets masked (events.Mask on data, events.MaskString on
// the free-text source). Data that is not JSON is printed as a string.
func wholeEvent(ev events.Event) json.RawMessage {
	events.Mask(&ev)
	ev.Source = events.MaskString(ev.Source)
	if b, err := json.Marshal(ev); err == nil {
		return b
	}
	raw := string(ev.Data)
	ev.Data = nil
	b, err := json.Marshal(struct {
		events.Event
		Data string `json:"data"`
	}{ev, events.MaskString(raw)})
	if err != nil {
		return json.RawMessage("null")
	}
	return b
}

// end prints the last line: the events replayed and the view of state.
func (r *replayer) end(state *projections.Session) error {
	v := state.View()
	if r.json {
		b, err := json.Marshal(replayEnd{Replayed: r.n, View: v})
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(r.w, "%s\n", b)
		return err
	}
	c := v.Counts
	_, err := fmt.Fprintf(r.w, "\n%d events replayed: %s; turns %d; orphaned tool_use: %d open %v, %d repaired; violations: %d open, %d resolved, %d reset\n",
		r.n, v.Status, c.TurnsTotal, c.OrphansOpen, nonNil(v.OrphanedToolUseIDs), c.OrphansRepaired, c.ViolationsOpen, c.ViolationsResolved, c.ViolationsReset)
	return err
}
