package events

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// summaryWidth bounds the previews Summary quotes, in runes.
const summaryWidth = 80

// Summary is a one-line, human-readable account of the event for timelines
// (`engine replay`): for a message its role and blocks, for a turn's end its
// outcome, for an error its class and message. An invalid event says what is
// wrong with it; an event of an unknown type says so.
func (e Event) Summary() string {
	if e.Err != nil {
		return "INVALID: " + oneLine(e.Err.Error(), 160)
	}
	p, err := e.Payload()
	if err != nil {
		return oneLine(err.Error(), 160)
	}
	switch p := p.(type) {
	case *SessionStarted:
		parts := []string{}
		fork := ""
		if p.ForkedFrom != "" {
			fork = fmt.Sprintf("%s@%d", p.ForkedFrom, p.ForkSeq)
		}
		for _, kv := range [][2]string{{"kind", p.Kind}, {"runtime", p.Runtime}, {"model", p.Model}, {"parent", p.ParentSession}, {"via", p.ParentToolUseID}, {"forked_from", fork}} {
			if kv[1] != "" {
				parts = append(parts, kv[0]+"="+kv[1])
			}
		}
		return strings.Join(parts, " ")
	case *SessionPaused:
		return "paused: " + oneLine(p.Reason, summaryWidth)
	case *SessionResumed:
		return "resumed " + oneLine(p.Reason, summaryWidth)
	case *TurnStarted:
		return fmt.Sprintf("turn %s: %q", e.Turn, oneLine(p.Prompt, summaryWidth))
	case *TurnStageCompleted:
		return fmt.Sprintf("turn %s: %s done%s", e.Turn, p.Stage, ms(p.DurationMS))
	case *TurnCompleted:
		r := p.Reason
		if r == "" {
			r = "end_turn"
		}
		return fmt.Sprintf("turn %s: completed (%s)%s", e.Turn, r, ms(p.DurationMS))
	case *TurnFailed:
		return fmt.Sprintf("turn %s: FAILED in %s: %s", e.Turn, p.Stage, errorLine(p.Error))
	case *TurnAbandoned:
		return fmt.Sprintf("turn %s: ABANDONED in %s (last stage completed: %s): %s", e.Turn, orNone(string(p.InStage())),
			orNone(string(p.Completed())), oneLine(p.Reason, summaryWidth))
	case *MessageAppended:
		return messageLine(p)
	case *ToolCallStarted:
		return fmt.Sprintf("%s %s started", oneLine(p.Name, idWidth), oneLine(p.ToolUseID, idWidth))
	case *ToolCallCompleted:
		s := fmt.Sprintf("%s %s completed%s", oneLine(p.Name, idWidth), oneLine(p.ToolUseID, idWidth), ms(p.DurationMS))
		if p.IsError {
			s += " with an error"
		}
		return s
	case *ErrorRecorded:
		s := errorLine(p.ErrorInfo)
		if p.Consecutive > 1 {
			s += fmt.Sprintf(" (%d in a row)", p.Consecutive)
		}
		return s
	case *DistillationRequested:
		return "requested " + oneLine(p.Reason, summaryWidth)
	case *DistillationStarted:
		return "started" + seqRange(p.FromSeq, p.ToSeq)
	case *DistillationCompleted:
		s := "completed" + seqRange(p.FromSeq, p.ToSeq)
		if p.TokensBefore > 0 || p.TokensAfter > 0 {
			s += fmt.Sprintf(", %d -> %d tokens", p.TokensBefore, p.TokensAfter)
		}
		if p.Trigger != "" {
			s += " (" + p.Trigger + ")"
		}
		return s
	case *DistillationSkipped:
		return "SKIPPED: " + p.Reason + " " + oneLine(p.Detail, summaryWidth)
	case *SnapshotTaken:
		return fmt.Sprintf("snapshot covers seq %d", p.CoversSeq)
	case *SessionRewound:
		return fmt.Sprintf("REWOUND to seq %d: %s", p.ToSeq, oneLine(p.Reason, summaryWidth))
	case *SessionForked:
		return fmt.Sprintf("forked at seq %d into %s", p.AtSeq, p.ForkSession)
	case *RecoveryAttempted:
		s := fmt.Sprintf("%s %s attempt %d", p.Kind, p.CommandID, p.Attempt)
		if p.Strategy != "" {
			s += " (" + p.Strategy + ")"
		}
		s += ": " + string(p.Result)
		if p.Class != "" {
			s += " (" + p.Class + ")"
		}
		if p.Error != nil {
			// The class names what went wrong; the error's own kind tag
			// would name it a second time, in other words.
			e := *p.Error
			if p.Class != "" {
				e.Kind = ""
			}
			s += ": " + errorLine(e)
		}
		return s
	case *RecoveryCompleted:
		s := fmt.Sprintf("%s %s: %s", p.Kind, p.CommandID, strings.ToUpper(string(p.Outcome)))
		var how []string
		if p.Strategy != "" {
			how = append(how, "strategy "+p.Strategy)
		}
		if p.Attempts > 0 {
			how = append(how, fmt.Sprintf("%d attempt(s)", p.Attempts))
		}
		if len(how) > 0 {
			s += " (" + strings.Join(how, ", ") + ")"
		}
		if p.Detail != "" {
			s += ": " + oneLine(p.Detail, summaryWidth)
		}
		return s
	case *RecoveryParked:
		return fmt.Sprintf("%s %s PARKED: %s", p.Kind, p.CommandID, oneLine(p.Reason, summaryWidth))
	case *BreakerChanged:
		return fmt.Sprintf("breaker %s: %s -> %s %s", p.Provider, p.From, p.To, oneLine(p.Reason, summaryWidth))
	}
	return ""
}

func messageLine(p *MessageAppended) string {
	var b strings.Builder
	b.WriteString(string(p.Role))
	if p.Meta {
		b.WriteString(" (meta)")
	}
	if p.Synthetic {
		b.WriteString(" (synthetic)")
	}
	b.WriteString(":")
	for i, c := range p.Content {
		if i > 0 {
			b.WriteString(" |")
		}
		b.WriteString(" ")
		b.WriteString(blockLine(c))
		if b.Len() > 200 && i < len(p.Content)-1 {
			fmt.Fprintf(&b, " | +%d blocks", len(p.Content)-1-i)
			break
		}
	}
	return b.String()
}

func blockLine(c ContentBlock) string {
	switch c.Type {
	case BlockText:
		return fmt.Sprintf("%q", oneLine(c.Text, summaryWidth))
	case BlockThinking:
		return fmt.Sprintf("thinking %q", oneLine(c.Thinking, 40))
	case BlockToolUse:
		return fmt.Sprintf("tool_use %s %s %s", oneLine(c.Name, idWidth), oneLine(c.ID, idWidth), oneLine(string(c.Input), 60))
	case BlockToolResult:
		s := "tool_result " + oneLine(c.ToolUseID, idWidth)
		if c.IsError {
			s += " ERROR"
		}
		return s + " " + fmt.Sprintf("%q", oneLine(resultText(c.Content), 60))
	}
	return c.Type
}

// resultText is the text of a tool_result's content: the string, or the
// text blocks of the array joined.
func resultText(raw []byte) string {
	if len(raw) == 0 {
		return ""
	}
	var s string
	if unmarshal(raw, &s) == nil {
		return s
	}
	var blocks []ContentBlock
	if unmarshal(raw, &blocks) == nil {
		var parts []string
		for _, b := range blocks {
			if b.Type == BlockText {
				parts = append(parts, b.Text)
			} else {
				parts = append(parts, "["+b.Type+"]")
			}
		}
		return strings.Join(parts, " ")
	}
	return string(raw)
}

func errorLine(e ErrorInfo) string {
	var tags []string
	if e.Kind != "" {
		tags = append(tags, string(e.Kind))
	}
	if e.Provider != "" {
		tags = append(tags, e.Provider)
	}
	if e.HTTPStatus != 0 {
		tags = append(tags, fmt.Sprint(e.HTTPStatus))
	}
	if e.Code != "" {
		tags = append(tags, e.Code)
	}
	s := oneLine(e.Message, 120)
	if len(tags) > 0 {
		s = "[" + strings.Join(tags, " ") + "] " + s
	}
	return s
}

func ms(d int64) string {
	if d <= 0 {
		return ""
	}
	return fmt.Sprintf(" in %dms", d)
}

func seqRange(from, to uint64) string {
	if from == 0 && to == 0 {
		return ""
	}
	return fmt.Sprintf(" over seq %d..%d", from, to)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// oneLine collapses whitespace runs to one space and cuts s to max runes,
// marking a cut with "...".
// idWidth is how many runes of an id or a tool name a summary shows: ids
// have no length limit on the wire, and a summary is one line.
const idWidth = 64

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	r := []rune(s)
	return string(r[:max]) + "..."
}
