package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/turnstone-dev/turnstone/projections"
)

// The text printers of the CLI (sessions, inspect, replay, incidents,
// recovery list and show) write through console.NewWriter, so that no
// control character stored in the log reaches the terminal raw, and say
// the zone of every time they print (tableTime). The JSON printers write
// version 1 of the shapes docs/cli.md documents.

// tableTime is t as tables print it: RFC 3339 in UTC, to the second, so
// that the zone is part of the value ("2026-02-11T21:18:41Z"); "-" for
// the zero time.
func tableTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05Z")
}

// timelineTime is tableTime to the millisecond, for timelines.
func timelineTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// cut collapses white space runs to one space and cuts s to n runes,
// marking a cut with "...".
func cut(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "..."
}

// writeJSON writes v as indented JSON and a newline.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// countCell is a count column of a table: the open count, then what was
// fixed, so that a repaired orphan or a resolved violation reads as such
// ("0 (1 repaired)").
func countCell(open, fixed int, fixedWord string) string {
	if fixed == 0 {
		return fmt.Sprint(open)
	}
	return fmt.Sprintf("%d (%d %s)", open, fixed, fixedWord)
}

// anomalyText is a View's first anomaly in one line: "seq N what:
// detail", with its state after what when it was fixed or reset, so that a
// cut line still says so.
func anomalyText(a *projections.ViewAnomaly) string {
	if a == nil {
		return "-"
	}
	s := a.What
	if a.Seq != 0 {
		s = fmt.Sprintf("seq %d %s", a.Seq, s)
	}
	switch a.State {
	case projections.StateResolved:
		s += fmt.Sprintf(" (resolved at seq %d)", a.ResolvedSeq)
	case projections.StateReset:
		s += " (reset by a distillation)"
	}
	return s + ": " + a.Detail
}

// recoveryText is a View's latest recovery command in one line.
func recoveryText(c *projections.CommandRecord) string {
	if c == nil {
		return "none"
	}
	switch {
	case c.Parked:
		return fmt.Sprintf("%s parked: %s", c.Kind, c.ParkReason)
	case c.Outcome != "":
		s := fmt.Sprintf("%s %s", c.Kind, c.Outcome)
		var how []string
		if c.Strategy != "" {
			how = append(how, "strategy "+c.Strategy)
		}
		how = append(how, fmt.Sprintf("%d attempt(s)", c.Attempts))
		s += " (" + strings.Join(how, ", ") + ")"
		if c.Detail != "" {
			s += ": " + c.Detail
		}
		return s
	}
	s := fmt.Sprintf("%s in progress (%d attempt(s))", c.Kind, c.Attempts)
	if c.LastResult == "failed" {
		s += fmt.Sprintf(", last failed (%s): %s", c.LastClass, c.LastError)
	}
	return s
}
