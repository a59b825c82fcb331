package projections

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/turnstone-dev/turnstone/events"
)

// The history rules (invariant 2) follow the Anthropic Messages API
// (https://docs.anthropic.com/en/docs/build-with-claude/tool-use):
//
//   - Consecutive records of one role form one API message; roles then
//     alternate by construction. The history's first message (at the
//     session's start, or after a distillation reset it) must be a user
//     message: else first_message_not_user.
//   - Each tool_use id of an assistant message gets exactly one
//     tool_result in the user message that immediately follows it. That
//     user message is complete, and judged, when the next assistant
//     message starts, when a new turn starts, when the turn holding the
//     tool_use ends, or when a distillation starts or completes. Then each
//     tool_use without a result becomes an orphan (tool_use_without_result);
//     before that it is pending: the tool is running.
//   - Each tool_result answers a pending tool_use of the previous assistant
//     message: else tool_result_without_tool_use (the id is unknown, or in
//     an earlier message), duplicate_tool_result (already answered) or
//     late_tool_result (already an orphan; the orphan stays).
//   - In a user message holding tool_result blocks, they come first:
//     results_not_first.
//   - Repair: a synthetic user record (written by a repair_orphans
//     command) whose tool_result answers an orphan repairs it when the
//     orphan's assistant message is still the history's latest assistant
//     message and no late result answered it yet: the synthesized result
//     then sits in the user message right after the tool_use, as the API
//     requires. The tool call becomes repaired, the orphan leaves
//     OrphanedToolUseIDs, and its tool_use_without_result violation is
//     resolved (it no longer counts for Status or for a distillation's
//     check). The repaired result counts as placed among the message's
//     leading tool_result blocks (its digest is inserted there), whatever
//     the message already holds. A repair comes after the turn ended (its
//     end declared the orphan); the user message it joins or opens is
//     merged like any other. Any other result for an orphan, or a
//     synthetic one after a later assistant message, is late.

// CallOnly is the ToolCall status while only tool_call.* events named the
// id: no tool_use block of the history holds it (yet).
const CallOnly ToolStatus = "call_only"

// The reason Distillation.DirtyReasons lists when a turn other than the
// distillation's own was in flight.
const DirtyTurnInFlight = "turn_in_flight"

// appendMessage folds one message.appended record into the history.
func (s *Session) appendMessage(ev events.Event, turn string, p *events.MessageAppended) {
	if why := checkContent(p); why != "" {
		s.invalid(ev, why)
		return
	}
	m := s.lastMessage()
	if m != nil && m.Role == events.RoleAssistant && p.Role == events.RoleUser {
		s.countOutput(m) // the assistant message is complete
	}
	if m != nil && m.Role == p.Role {
		m.Seqs = append(m.Seqs, ev.Seq)
	} else {
		if p.Role == events.RoleAssistant {
			s.judge(ev, "", "the next assistant message")
			if m == nil {
				s.violate(ev, RuleFirstMessageNotUser, "the history starts with an assistant message", "", turn)
			}
		}
		s.Totals.Messages++
		s.Messages = append(s.Messages, Message{
			Index: s.Totals.Messages,
			Role:  p.Role,
			Seqs:  []uint64{ev.Seq},
			Turn:  turn,
		})
		m = &s.Messages[len(s.Messages)-1]
		if p.Role == events.RoleAssistant {
			m.Hash = emptyOutputHash
		}
	}
	m.Meta = m.Meta || p.Meta
	m.Synthetic = m.Synthetic || p.Synthetic
	if p.Role == events.RoleAssistant {
		if p.Model != "" {
			s.Model = p.Model
		}
		if p.StopReason != "" {
			m.StopReason = p.StopReason
		}
		for i := range p.Content {
			cb := &p.Content[i]
			m.Blocks = append(m.Blocks, digest(cb))
			m.Hash = chainOutput(m.Hash, cb)
			if cb.Type == events.BlockToolUse {
				s.toolUse(ev, turn, m.Index, cb)
			}
		}
		return
	}

	// A user record: tool_result blocks must come first in the merged
	// message; flag the first one after another block, once per message.
	other, flagged := false, false
	for _, b := range m.Blocks {
		if b.Type != events.BlockToolResult {
			other = true
		} else if other {
			flagged = true
		}
	}
	for i := range p.Content {
		cb := &p.Content[i]
		if p.Synthetic && cb.Type == events.BlockToolResult {
			if tc := s.repairable(cb.ToolUseID); tc != nil {
				at := 0
				for at < len(m.Blocks) && m.Blocks[at].Type == events.BlockToolResult {
					at++
				}
				m.Blocks = slices.Insert(m.Blocks, at, digest(cb))
				s.repair(ev, tc, cb)
				continue
			}
		}
		m.Blocks = append(m.Blocks, digest(cb))
		if cb.Type != events.BlockToolResult {
			other = true
			continue
		}
		if other && !flagged {
			flagged = true
			s.violate(ev, RuleResultsNotFirst, fmt.Sprintf("tool_result for %s comes after another block in user message %d", cb.ToolUseID, m.Index), validKey(cb.ToolUseID), turn)
		}
		s.answer(ev, cb, p.Synthetic)
	}
}

// checkContent returns why a record cannot be folded, or "": the fold needs
// at least one block, ids on tool blocks, and tool_use blocks only in
// assistant records, tool_result blocks only in user ones (the contract's
// own rules, checked here too for events that did not come from the log).
func checkContent(p *events.MessageAppended) string {
	if len(p.Content) == 0 {
		return "message.appended without content blocks"
	}
	for i, cb := range p.Content {
		switch cb.Type {
		case events.BlockToolUse:
			if p.Role != events.RoleAssistant {
				return fmt.Sprintf("content[%d]: tool_use block in a %s message", i, p.Role)
			}
			if cb.ID == "" {
				return fmt.Sprintf("content[%d]: tool_use block without id", i)
			}
		case events.BlockToolResult:
			if p.Role != events.RoleUser {
				return fmt.Sprintf("content[%d]: tool_result block in a %s message", i, p.Role)
			}
			if cb.ToolUseID == "" {
				return fmt.Sprintf("content[%d]: tool_result block without tool_use_id", i)
			}
		}
	}
	return ""
}

// lastMessage returns the history's last message, or nil.
func (s *Session) lastMessage() *Message {
	if len(s.Messages) == 0 {
		return nil
	}
	return &s.Messages[len(s.Messages)-1]
}

// lastAssistant returns the history's latest assistant message, or nil.
func (s *Session) lastAssistant() *Message {
	for i := len(s.Messages) - 1; i >= 0; i-- {
		if s.Messages[i].Role == events.RoleAssistant {
			return &s.Messages[i]
		}
	}
	return nil
}

// toolUse tracks a tool_use block of assistant message msg: it is pending
// until its tool_result arrives or the next user message is judged. A
// tool_use id the history already holds is a violation and is not tracked
// again (the first one keeps the id).
func (s *Session) toolUse(ev events.Event, turn string, msg int, cb *events.ContentBlock) {
	id := validKey(cb.ID)
	tc := s.toolCall(id)
	if tc != nil && tc.Message != 0 {
		s.violate(ev, RuleDuplicateToolUse, fmt.Sprintf("tool_use id %s already used at seq %d", id, tc.UseSeq), id, turn)
		s.LastTool = nil // a tool call ran between, but it cannot be followed
		return
	}
	if tc == nil {
		tc = s.newToolCall(id)
	}
	tc.Name, tc.Turn, tc.Message = cb.Name, turn, msg
	tc.UseSeq, tc.Status = ev.Seq, ToolPending
	s.Pending = append(s.Pending, id)
	s.toolRunStarts(ev, turn, id, cb)
}

// newToolCall appends a tool call for id and returns it.
func (s *Session) newToolCall(id string) *ToolCall {
	s.ToolCalls = append(s.ToolCalls, ToolCall{ToolUseID: id, Status: CallOnly})
	s.Totals.ToolCalls++
	i := len(s.ToolCalls) - 1
	s.index().toolCalls[id] = i
	return &s.ToolCalls[i]
}

// answer pairs a tool_result block with its tool_use, or records why it
// answers none. A result that pairs and is not synthetic is the tool's run:
// it may be a failed attempt of the tool_use's turn, or a flaky-suspected
// re-run.
func (s *Session) answer(ev events.Event, cb *events.ContentBlock, synthetic bool) {
	id := validKey(cb.ToolUseID)
	tc := s.toolCall(id)
	switch {
	case tc == nil || tc.Message == 0:
		s.unmatched(ev, id, UnmatchedUnknown, RuleToolResultWithoutToolUse,
			fmt.Sprintf("tool_result for %s, which no tool_use of the history holds", id), "")
	case tc.Status == ToolOrphaned:
		for i := len(s.Orphans) - 1; i >= 0; i-- {
			if o := &s.Orphans[i]; o.ToolUseID == id {
				if o.LateResultSeq == 0 {
					o.LateResultSeq = ev.Seq
				}
				break
			}
		}
		s.unmatched(ev, id, UnmatchedLate, RuleLateToolResult,
			fmt.Sprintf("tool_result for %s (%s), already declared an orphan", id, tc.Name), tc.Turn)
	case tc.Status == ToolAnswered || tc.Status == ToolRepaired:
		if a := s.lastAssistant(); a != nil && a.Index == tc.Message {
			s.unmatched(ev, id, UnmatchedDuplicate, RuleDuplicateToolResult,
				fmt.Sprintf("second tool_result for %s (%s), first at seq %d", id, tc.Name, tc.ResultSeq), tc.Turn)
			return
		}
		s.unmatched(ev, id, UnmatchedNotPrevious, RuleToolResultWithoutToolUse,
			fmt.Sprintf("tool_result for %s (%s), whose tool_use is in an earlier message (seq %d)", id, tc.Name, tc.UseSeq), tc.Turn)
	default: // pending: a tool_use of the previous assistant message
		for i, p := range s.Pending {
			if p == id {
				s.Pending = append(s.Pending[:i:i], s.Pending[i+1:]...)
				break
			}
		}
		if len(s.Pending) == 0 {
			s.Pending = nil
		}
		tc.Status, tc.ResultSeq = ToolAnswered, ev.Seq
		tc.IsError = tc.IsError || cb.IsError
		if !synthetic {
			s.toolRunEnds(ev, tc, cb)
		}
	}
}

// repairable returns the orphaned tool call a synthetic tool_result for id
// repairs, or nil: its assistant message must still be the history's
// latest assistant message, and no late result may have answered it.
func (s *Session) repairable(id string) *ToolCall {
	id = validKey(id)
	tc := s.toolCall(id)
	if tc == nil || tc.Message == 0 || tc.Status != ToolOrphaned {
		return nil
	}
	if a := s.lastAssistant(); a == nil || a.Index != tc.Message {
		return nil
	}
	if o := s.orphan(id); o != nil && (o.LateResultSeq != 0 || o.Repaired) {
		return nil
	}
	return tc
}

// repair marks tc repaired by the tool_result cb of ev, its orphan
// repaired and the violations its orphaning caused resolved.
func (s *Session) repair(ev events.Event, tc *ToolCall, cb *events.ContentBlock) {
	tc.Status, tc.ResultSeq = ToolRepaired, ev.Seq
	tc.IsError = tc.IsError || cb.IsError
	if o := s.orphan(tc.ToolUseID); o != nil {
		o.Repaired, o.RepairedSeq = true, ev.Seq
	}
	for i := since(s.HistoryStart.Violations, s.Totals.Violations, len(s.Violations)); i < len(s.Violations); i++ {
		if v := &s.Violations[i]; !v.Resolved && v.Rule == RuleToolUseWithoutResult && v.ToolUseID == tc.ToolUseID {
			v.Resolved, v.ResolvedSeq = true, ev.Seq
			s.Totals.Resolved++
		}
	}
}

// orphan returns the latest orphan of the current history with tool_use
// id, or nil.
func (s *Session) orphan(id string) *Orphan {
	for i := len(s.Orphans) - 1; i >= since(s.HistoryStart.Orphans, s.Totals.Orphans, len(s.Orphans)); i-- {
		if s.Orphans[i].ToolUseID == id {
			return &s.Orphans[i]
		}
	}
	return nil
}

// unmatched records a tool_result that answers no pending tool_use.
func (s *Session) unmatched(ev events.Event, id, reason string, rule Rule, detail, turn string) {
	s.UnmatchedResults = append(s.UnmatchedResults, UnmatchedResult{ToolUseID: id, Seq: ev.Seq, Reason: reason})
	s.Totals.UnmatchedResults++
	s.violate(ev, rule, detail, id, turn)
}

// judge completes the user message after the latest assistant message: each
// pending tool_use becomes an orphan. With turn set (the turn that ended),
// only the tool_use blocks of that turn are judged. why completes "got no
// tool_result before ...".
func (s *Session) judge(ev events.Event, turn, why string) {
	s.judgeWhere(ev, why, func(tc *ToolCall) bool { return turn == "" || tc.Turn == turn })
}

// judgeStale judges the pending tool_use blocks whose turn is no longer in
// flight (or that belong to no turn): a new turn's start completes those,
// while a tool of a turn still running (a second message arrived mid-turn)
// stays pending until its own turn ends.
func (s *Session) judgeStale(ev events.Event, why string) {
	s.judgeWhere(ev, why, func(tc *ToolCall) bool {
		t := s.turn(tc.Turn)
		return t == nil || t.Ended()
	})
}

func (s *Session) judgeWhere(ev events.Event, why string, due func(*ToolCall) bool) {
	if len(s.Pending) == 0 {
		return
	}
	kept := s.Pending[:0]
	for _, id := range s.Pending {
		tc := s.toolCall(id)
		if tc == nil {
			continue
		}
		if !due(tc) {
			kept = append(kept, id)
			continue
		}
		tc.Status = ToolOrphaned
		s.Orphans = append(s.Orphans, Orphan{ToolUseID: id, Name: tc.Name, Seq: tc.UseSeq, Turn: tc.Turn, DeclaredSeq: ev.Seq})
		s.Totals.Orphans++
		s.violate(ev, RuleToolUseWithoutResult,
			fmt.Sprintf("tool_use %s (%s, seq %d) got no tool_result before %s", id, tc.Name, tc.UseSeq, why), id, tc.Turn)
	}
	s.Pending = kept
	if len(s.Pending) == 0 {
		s.Pending = nil
	}
}

// toolCallEvent returns the tool call a tool_call.* event names, creating
// it (status CallOnly) when no tool_use block named it yet.
func (s *Session) toolCallEvent(ev events.Event, turn, id, name string) *ToolCall {
	id = validKey(id)
	if id == "" {
		s.invalid(ev, string(ev.Type)+" without tool_use_id")
		return nil
	}
	tc := s.toolCall(id)
	if tc == nil {
		tc = s.newToolCall(id)
		tc.Name, tc.Turn = name, turn
	}
	return tc
}

// distillationRequested records a request; a request while an earlier one
// has not started yet is the same request.
func (s *Session) distillationRequested(ev events.Event, turn string, p *events.DistillationRequested) {
	d := s.openDistillation(turn, notStarted)
	if d.RequestedSeq == 0 {
		d.RequestedSeq, d.RequestReason = ev.Seq, p.Reason
	}
}

// distillationStarted records a start and checks invariant 3. The user
// message after the latest assistant message is complete: pending
// tool_use blocks are judged first, so they show as unanswered.
func (s *Session) distillationStarted(ev events.Event, turn string, p *events.DistillationStarted) {
	d := s.openDistillation(turn, notStarted)
	d.StartedSeq = ev.Seq
	if turn != "" {
		d.Turn = turn
	}
	s.cover(d, p.FromSeq, p.ToSeq)
	s.judge(ev, "", "a distillation started")
	s.completeOutput(nil)
	s.checkDistillation(ev, d)
}

// distillationCompleted records the end of a distillation, checks
// invariant 3 if no start was seen, and resets the history (and the output
// streak, which compared its messages): the runtime appends the summary as
// the next message.
func (s *Session) distillationCompleted(ev events.Event, turn string, p *events.DistillationCompleted) {
	d := s.openDistillation(turn, anyDistillation)
	started := d.StartedSeq != 0
	d.CompletedSeq = ev.Seq
	if d.Turn == "" {
		d.Turn = turn
	}
	d.TokensBefore, d.TokensAfter, d.Trigger = p.TokensBefore, p.TokensAfter, p.Trigger
	s.cover(d, p.FromSeq, p.ToSeq)
	s.judge(ev, "", "a distillation completed")
	if !started {
		s.checkDistillation(ev, d)
	}
	s.Messages, s.Pending, s.ToolCalls, s.idx = nil, nil, nil, nil
	s.Outputs = OutputStreak{}
	s.HistoryStart = HistoryMark{Seq: ev.Seq, Violations: s.Totals.Violations, Orphans: s.Totals.Orphans, Resolved: s.Totals.Resolved}
}

// PendingDistillation returns the request for a distillation that has not
// run yet, or nil: the latest distillation that was requested
// (RequestedSeq != 0) and has neither started nor completed, provided no
// distillation started or completed after it (one that ran since answers
// it). A skipped request is still pending: the reconciler defers it and
// runs it once the history is clean (see DistillationDeferred). The
// pointer is into the state: read it, do not keep it across Apply.
func (s *Session) PendingDistillation() *Distillation {
	for i := len(s.Distillations) - 1; i >= 0; i-- {
		d := &s.Distillations[i]
		switch {
		case d.StartedSeq != 0 || d.CompletedSeq != 0:
			return nil
		case d.RequestedSeq != 0:
			return d
		}
	}
	return nil
}

// DistillationDeferred reports whether the pending distillation request
// (PendingDistillation) was skipped: it waits for a clean history.
func (s *Session) DistillationDeferred() bool {
	d := s.PendingDistillation()
	return d != nil && (d.SkippedSeq != 0 || d.Skipped != "")
}

func notStarted(d *Distillation) bool      { return d.StartedSeq == 0 }
func anyDistillation(d *Distillation) bool { return true }

// openDistillation returns the latest distillation if it is open and
// match accepts it, else a new one for turn.
func (s *Session) openDistillation(turn string, match func(*Distillation) bool) *Distillation {
	if n := len(s.Distillations); n > 0 {
		if d := &s.Distillations[n-1]; d.open() && match(d) {
			return d
		}
	}
	s.Distillations = append(s.Distillations, Distillation{Turn: turn})
	s.Totals.Distillations++
	return &s.Distillations[len(s.Distillations)-1]
}

// cover sets the range of events d covers: from and to when the event gave
// them; else, where d has none yet, from the previous distillation's end + 1
// (or the session's first sequence) to the sequence before this event.
func (s *Session) cover(d *Distillation, from, to uint64) {
	if from != 0 {
		d.FromSeq = from
	}
	if to != 0 {
		d.ToSeq = to
	}
	if d.FromSeq == 0 {
		d.FromSeq = s.FirstSeq
		for i := len(s.Distillations) - 1; i >= 0; i-- {
			if p := &s.Distillations[i]; p != d && p.CompletedSeq != 0 && p.ToSeq != 0 {
				d.FromSeq = p.ToSeq + 1
				break
			}
		}
	}
	if d.ToSeq == 0 {
		d.ToSeq = s.LastSeq
	}
}

// checkDistillation applies invariant 3 at the start of d (or at its
// completion when no start was seen): no turn other than d's own in
// flight, and a clean history.
func (s *Session) checkDistillation(ev events.Event, d *Distillation) {
	d.Clean, d.DirtyReasons = true, nil
	for _, id := range s.InFlight {
		if id == d.Turn {
			continue
		}
		if d.Clean {
			d.DirtyReasons = append(d.DirtyReasons, DirtyTurnInFlight)
		}
		d.Clean = false
		s.violate(ev, RuleDistillationDuringTurn, fmt.Sprintf("distillation started while turn %s is in flight", id), "", id)
	}

	reasons := s.historyReasons()
	if len(reasons) == 0 {
		return
	}
	d.Clean = false
	d.DirtyReasons = append(d.DirtyReasons, reasons...)
	s.violate(ev, RuleDistillationDirtyHistory, "distillation over a dirty history: "+strings.Join(reasons, ", "), "", d.Turn)
}

// DirtyReasons returns why a distillation that started now, run by turn
// (the turn that compacts inline; "" for none), would not be clean
// (invariant 3), in the order Distillation.DirtyReasons lists them:
// DirtyTurnInFlight when a turn other than turn is in flight,
// DirtyUnansweredToolUse when the latest assistant message holds a
// tool_use without its tool_result (pending, or orphaned and not
// repaired), then each history Rule broken since the last distillation by
// a violation that is not resolved. It returns nil when the distillation
// would be clean. A runtime or the reconciler asks it before distilling.
func (s *Session) DirtyReasons(turn string) []string {
	var reasons []string
	for _, id := range s.InFlight {
		if id != turn {
			reasons = append(reasons, DirtyTurnInFlight)
			break
		}
	}
	return append(reasons, s.historyReasons()...)
}

// historyReasons returns the history's part of DirtyReasons.
func (s *Session) historyReasons() []string {
	var reasons []string
	if s.tailUnanswered() {
		reasons = append(reasons, DirtyUnansweredToolUse)
	}
	var broken [16]bool // by index in historyRules
	for _, v := range s.Violations[since(s.HistoryStart.Violations, s.Totals.Violations, len(s.Violations)):] {
		if v.Resolved {
			continue
		}
		for i, r := range historyRules {
			if v.Rule == r {
				broken[i] = true
			}
		}
	}
	for i, r := range historyRules {
		if broken[i] {
			reasons = append(reasons, string(r))
		}
	}
	return reasons
}

// tailUnanswered reports whether the latest assistant message holds a
// tool_use without its tool_result (pending or orphaned, not repaired).
func (s *Session) tailUnanswered() bool {
	m := s.lastAssistant()
	if m == nil {
		return false
	}
	for _, b := range m.Blocks {
		if b.Type != events.BlockToolUse {
			continue
		}
		if tc := s.toolCall(b.ID); tc != nil && tc.Message == m.Index && tc.Status != ToolAnswered && tc.Status != ToolRepaired {
			return true
		}
	}
	return false
}

// rawPrefix is how much of a raw JSON value the previews read: enough for
// PreviewRunes runes even if each is a 12-byte escaped surrogate pair.
const rawPrefix = 12*PreviewRunes + 64

// digest returns the Block for a content block.
func digest(cb *events.ContentBlock) Block {
	b := Block{Type: cb.Type}
	switch cb.Type {
	case events.BlockText:
		b.Text, b.Size = preview(cb.Text, PreviewRunes), len(cb.Text)
	case events.BlockThinking:
		b.Text, b.Size = preview(cb.Thinking, PreviewRunes), len(cb.Thinking)
	case events.BlockToolUse:
		b.ID, b.Name = validKey(cb.ID), cb.Name
		b.Text, b.Size = preview(compactPrefix(cb.Input, rawPrefix), PreviewRunes), len(cb.Input)
	case events.BlockToolResult:
		b.ToolUseID, b.IsError = validKey(cb.ToolUseID), cb.IsError
		b.Text, b.Size = preview(resultText(cb.Content), PreviewRunes), len(cb.Content)
	default:
		b.Text = preview(cb.Text, PreviewRunes)
		b.Size = len(cb.Text) + len(cb.Thinking) + len(cb.Data) + len(cb.Input) + len(cb.Content) + len(cb.Source)
	}
	return b
}

// compactPrefix returns about the first max bytes of the JSON value raw
// with the white space outside strings removed, without reading further.
func compactPrefix(raw []byte, max int) string {
	var b strings.Builder
	inString, escaped := false, false
	for _, c := range raw {
		if b.Len() >= max {
			break
		}
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// resultText returns the start of a tool_result's content as text: the
// string, or the text blocks of an array joined by newlines. Only the
// first rawPrefix bytes of a string are decoded.
func resultText(raw json.RawMessage) string {
	raw = trimSpace(raw)
	if len(raw) == 0 {
		return ""
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(stringPrefix(raw, rawPrefix), &s); err != nil {
			return ""
		}
		return s
	case '[':
		var blocks []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if err := json.Unmarshal(raw, &blocks); err != nil {
			return ""
		}
		var parts []string
		for _, bl := range blocks {
			if bl.Type == events.BlockText && bl.Text != "" {
				parts = append(parts, bl.Text)
			}
		}
		return strings.Join(parts, "\n")
	}
	return ""
}

// stringPrefix returns the JSON string raw cut, at a character boundary of
// the encoding, after about max bytes, and closed with a quote.
func stringPrefix(raw []byte, max int) []byte {
	if len(raw) <= max {
		return raw
	}
	i := 1
	for i < max && i < len(raw)-1 {
		switch {
		case raw[i] == '\\' && i+1 < len(raw) && raw[i+1] == 'u':
			i += 6
		case raw[i] == '\\':
			i += 2
		default:
			i++
		}
	}
	if i > len(raw)-1 {
		return raw
	}
	out := make([]byte, 0, i+1)
	out = append(out, raw[:i]...)
	return append(out, '"')
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}
