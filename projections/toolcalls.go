package projections

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

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

// Message is one message of the history in the model API's view: one or
// more consecutive message.appended records of one role, merged.
type Message struct {
	// Index is the message's number in the session, from 1, counting the
	// messages distillations removed.
	Index int `json:"index"`
	// Role is user or assistant.
	Role events.Role `json:"role"`
	// Seqs are the sequences of the records merged into it, in order: the
	// first MaxMessageSeqs; SeqsDropped counts the later ones.
	Seqs        []uint64 `json:"seqs"`
	SeqsDropped int      `json:"seqs_dropped,omitzero"`
	// Turn is the turn of its first record.
	Turn string `json:"turn,omitempty"`
	// Blocks digest its content blocks, in order: the first
	// MaxMessageBlocks; BlocksDropped counts the later ones (each Block
	// names the record that holds it in full).
	Blocks        []Block `json:"blocks"`
	BlocksDropped int     `json:"blocks_dropped,omitzero"`
	// ToolUses counts its tool_use blocks; the state tracks the first
	// MaxToolUsesPerMessage (see ToolCall) and counts the others in
	// UntrackedToolUses.
	ToolUses          int `json:"tool_uses,omitzero"`
	UntrackedToolUses int `json:"untracked_tool_uses,omitzero"`
	// NonResult is set once a user message holds a block other than
	// tool_result; ResultsNotFirst once a tool_result came after such a
	// block (results_not_first, flagged once per message). The rule reads
	// them, not Blocks, which keeps only the first blocks.
	NonResult       bool `json:"non_result,omitzero"`
	ResultsNotFirst bool `json:"results_not_first,omitzero"`
	// StopReason is the latest record's stop_reason (assistant messages).
	StopReason string `json:"stop_reason,omitempty"`
	// MessageID is the message_id (IDKey) of an assistant message's first
	// record: the provider's response id.
	MessageID string `json:"message_id,omitempty"`
	// Meta is true when a record of it was added by the runtime (command
	// output, a compaction summary); Synthetic when one was written by
	// Turnstone (a repaired tool_result).
	Meta      bool `json:"meta,omitzero"`
	Synthetic bool `json:"synthetic,omitzero"`
	// Hash is an assistant message's output hash: OutputHash of the
	// content blocks of all its records, in order; for a user message, the
	// hash of what it says, exactly (its blocks chained with chainInput,
	// in order, from the same start). The OutputStreak compares both.
	Hash string `json:"hash,omitempty"`
}

// Block is a digest of one content block; the full content stays in the
// log.
type Block struct {
	// Type is the block's type ("text", "tool_use", "tool_result", ...).
	Type string `json:"type"`
	// Seq is the sequence of the record that holds the block in full.
	Seq uint64 `json:"seq,omitzero"`
	// ID and Name are a tool_use block's id and tool name (IDKey).
	ID   string `json:"id,omitempty"`
	Name string `json:"name,omitempty"`
	// ToolUseID (IDKey) and IsError are a tool_result block's.
	ToolUseID string `json:"tool_use_id,omitempty"`
	IsError   bool   `json:"is_error,omitzero"`
	// Text is a preview (PreviewRunes runes) of the text, the thinking,
	// the tool_result's text content, or the tool_use's input as compact
	// JSON.
	Text string `json:"text,omitempty"`
	// Size is the size, in bytes, of the original content (text,
	// thinking, input, result content, data or source).
	Size int `json:"size"`
}

// ToolStatus is where a tool_use stands.
type ToolStatus string

// The tool call statuses.
const (
	// ToolPending: no tool_result yet, and the user message that must hold
	// it is not complete: the tool is running.
	ToolPending ToolStatus = "pending"
	// ToolAnswered: exactly one tool_result answered it in the next user
	// message.
	ToolAnswered ToolStatus = "answered"
	// ToolOrphaned: the user message that had to hold its tool_result is
	// complete without it.
	ToolOrphaned ToolStatus = "orphaned"
	// ToolRepaired: it was orphaned, then a synthetic tool_result (written
	// by a repair_orphans command) answered it while its assistant message
	// was still the history's latest, so the history is valid again.
	ToolRepaired ToolStatus = "repaired"
)

// CallOnly is the ToolCall status while only tool_call.* events named the
// id: no tool_use block of the history holds it (yet).
const CallOnly ToolStatus = "call_only"

// ToolCall is one tool_use of the current history paired with its
// tool_result, and the tool_call.* events that tell its execution.
type ToolCall struct {
	// ToolUseID is the tool_use block's id ("toolu_..."); Name the tool's
	// name. Both are IDKey: an id longer than MaxKeyBytes is a digest,
	// its full value in the record at UseSeq.
	ToolUseID string `json:"tool_use_id"`
	Name      string `json:"name"`
	// Turn is the turn of the event that holds the tool_use.
	Turn string `json:"turn,omitempty"`
	// Step is StepKey of the tool_use (its name and operand): the step of
	// Turn whose attempt it is, for the implementation budget.
	Step string `json:"step,omitempty"`
	// Message is the Index of the assistant message that holds the
	// tool_use; 0 when only tool_call.* events named the id so far.
	Message int `json:"message"`
	// UseSeq is the sequence of the record holding the tool_use; ResultSeq
	// the one holding its tool_result (0 until answered).
	UseSeq    uint64 `json:"use_seq"`
	ResultSeq uint64 `json:"result_seq,omitzero"`
	// IsError is true when the tool_result or tool_call.completed reported
	// a failure.
	IsError bool `json:"is_error,omitzero"`
	// Status is pending, answered, orphaned, repaired, or CallOnly.
	Status ToolStatus `json:"status"`
	// StartedSeq, CompletedSeq and DurationMS (milliseconds) come from
	// tool_call.started and tool_call.completed, when the runtime sends
	// them.
	StartedSeq   uint64 `json:"started_seq,omitzero"`
	CompletedSeq uint64 `json:"completed_seq,omitzero"`
	DurationMS   int64  `json:"duration_ms,omitzero"`
	// UsedAt is when the log stored the record holding the tool_use (the
	// log's clock; zero without a store time); TimeoutMS is the timeout
	// the call declared for itself in its input, in milliseconds (see
	// DeclaredTimeoutMS; 0: none). The reconciler gives a pending call
	// that long, plus a grace, from UsedAt (docs/policy.md).
	UsedAt    time.Time `json:"used_at,omitzero"`
	TimeoutMS int64     `json:"timeout_ms,omitzero"`
}

// Orphan is a tool_use judged to have no tool_result: the user message
// that had to hold it was complete without it.
type Orphan struct {
	// ToolUseID and Name are the tool_use block's id and tool name
	// (IDKey: a digest for an id longer than MaxKeyBytes, whose full value
	// is in the record at Seq).
	ToolUseID string `json:"tool_use_id"`
	Name      string `json:"name"`
	// Seq is the sequence of the assistant record holding the tool_use.
	Seq uint64 `json:"seq"`
	// Turn is the turn of that record.
	Turn string `json:"turn,omitempty"`
	// DeclaredSeq is the sequence of the event that completed the user
	// message without the result.
	DeclaredSeq uint64 `json:"declared_seq"`
	// LateResultSeq is the sequence of a tool_result that arrived after
	// the orphan was declared and could not repair it (the orphan is kept;
	// the result is unmatched).
	LateResultSeq uint64 `json:"late_result_seq,omitzero"`
	// Repaired is set when a synthetic tool_result repaired it (see
	// ToolRepaired); RepairedSeq is the sequence of the record holding it.
	// A repaired orphan leaves OrphanedToolUseIDs.
	Repaired    bool   `json:"repaired,omitzero"`
	RepairedSeq uint64 `json:"repaired_seq,omitzero"`
}

// The reasons of an UnmatchedResult.
const (
	// UnmatchedUnknown: no tool_use with that id is in the history.
	UnmatchedUnknown = "unknown_tool_use"
	// UnmatchedNotPrevious: the tool_use is in an earlier message, not the
	// previous assistant message.
	UnmatchedNotPrevious = "not_in_previous_message"
	// UnmatchedDuplicate: the tool_use was already answered.
	UnmatchedDuplicate = "duplicate"
	// UnmatchedLate: the tool_use was already declared an orphan.
	UnmatchedLate = "late_result"
	// UnmatchedNotHeld: no tool_use the state holds has that id, and the
	// state no longer holds every tool call of the current history (see
	// KeepToolCalls): the id is unknown or in an earlier message; either
	// way the result breaks tool_result_without_tool_use.
	UnmatchedNotHeld = "not_held"
	// UnmatchedUntracked: no tool_use the state holds has that id, and the
	// previous assistant message has tool_use blocks past
	// MaxToolUsesPerMessage that the state did not track: the result may
	// answer one of them, so it is recorded without a violation.
	UnmatchedUntracked = "untracked_tool_use"
)

// UnmatchedResult is a tool_result that answers no open tool_use of the
// previous assistant message.
type UnmatchedResult struct {
	// ToolUseID is the id the tool_result names.
	ToolUseID string `json:"tool_use_id"`
	// Seq is the sequence of the user record holding it.
	Seq uint64 `json:"seq"`
	// Reason is one of the Unmatched constants.
	Reason string `json:"reason"`
}

// appendMessage folds one message.appended record into the history.
func (s *Session) appendMessage(ev *events.Event, turn string, p *events.MessageAppended) {
	if why := checkContent(p); why != "" {
		s.invalid(ev, why)
		return
	}
	m := s.lastMessage()
	if a := s.continued(m, p); a != nil {
		s.continueMessage(ev, turn, a, p)
		return
	}
	if m != nil && m.Role == events.RoleAssistant && p.Role == events.RoleUser {
		// The assistant message is complete; a later record of its
		// response may still continue it after results (see continued).
		s.countOutput(m, m.MessageID != "" && onlyResults(p))
	}
	if m != nil && m.Role == p.Role {
		if len(m.Seqs) < MaxMessageSeqs {
			m.Seqs = append(m.Seqs, ev.Seq)
		} else {
			m.SeqsDropped++
		}
	} else {
		if p.Role == events.RoleAssistant {
			s.judge(ev, "", "the next assistant message")
			if m == nil && s.MessagesDropped == 0 {
				s.violate(ev, RuleFirstMessageNotUser, "the history starts with an assistant message", "", turn)
			}
		}
		s.Totals.Messages++
		if s.Messages == nil {
			// The most the list holds (trim lets it grow a quarter past
			// KeepMessages), at once: growing to it by doubling copied
			// its messages three times over in every session's first
			// turns (a sixth of the bytes a fold allocated).
			s.Messages = make([]Message, 0, KeepMessages+KeepMessages/4+1)
		}
		s.Messages = append(s.Messages, Message{
			Index: s.Totals.Messages,
			Role:  p.Role,
			Seqs:  []uint64{ev.Seq},
			Turn:  turn,
		})
		m = &s.Messages[len(s.Messages)-1]
		m.Hash = emptyOutputHash
		if p.Role == events.RoleAssistant && p.MessageID != "" {
			m.MessageID = IDKey(p.MessageID)
		}
	}
	m.Meta = m.Meta || p.Meta
	m.Synthetic = m.Synthetic || p.Synthetic
	if p.Role == events.RoleAssistant {
		s.addOutput(ev, turn, m, p)
		return
	}
	for i := range p.Content {
		m.Hash = chainInput(m.Hash, &p.Content[i])
	}

	// A user record: tool_result blocks must come first in the merged
	// message; flag the first one after another block, once per message.
	for i := range p.Content {
		cb := &p.Content[i]
		if p.Synthetic && cb.Type == events.BlockToolResult {
			if tc := s.repairable(cb.ToolUseID); tc != nil {
				at := 0
				for at < len(m.Blocks) && m.Blocks[at].Type == events.BlockToolResult {
					at++
				}
				if at < MaxMessageBlocks {
					m.Blocks = slices.Insert(m.Blocks, at, digest(cb, ev.Seq))
					if len(m.Blocks) > MaxMessageBlocks {
						m.Blocks = m.Blocks[:MaxMessageBlocks]
						m.BlocksDropped++
					}
				} else {
					m.BlocksDropped++
				}
				s.repair(ev, tc, cb)
				continue
			}
		}
		m.addBlock(digest(cb, ev.Seq))
		if cb.Type != events.BlockToolResult {
			m.NonResult = true
			continue
		}
		if m.NonResult && !m.ResultsNotFirst {
			m.ResultsNotFirst = true
			s.violate(ev, RuleResultsNotFirst, fmt.Sprintf("tool_result for %s comes after another block in user message %d", IDKey(cb.ToolUseID), m.Index), IDKey(cb.ToolUseID), turn)
		}
		s.answer(ev, cb, p.Synthetic)
	}
}

// addOutput folds the content of p, an assistant record, into the
// assistant message m: its blocks, its output hash, its tool_use blocks,
// its model and stop_reason; the model answered.
func (s *Session) addOutput(ev *events.Event, turn string, m *Message, p *events.MessageAppended) {
	if p.Model != "" {
		s.Model = IDKey(p.Model)
	}
	if p.StopReason != "" {
		m.StopReason = IDKey(p.StopReason)
	}
	for i := range p.Content {
		cb := &p.Content[i]
		m.addBlock(digest(cb, ev.Seq))
		m.Hash = chainOutput(m.Hash, cb)
		if cb.Type == events.BlockToolUse {
			s.toolUse(ev, turn, m, cb)
		}
	}
	if !p.Synthetic {
		s.stepPassed(turn, stageStep(events.StageExecute)) // the model answered
	}
}

// onlyResults reports whether p holds tool_result blocks only, and is no
// runtime's or Turnstone's own addition (meta, synthetic).
func onlyResults(p *events.MessageAppended) bool {
	if p.Meta || p.Synthetic {
		return false
	}
	for i := range p.Content {
		if p.Content[i].Type != events.BlockToolResult {
			return false
		}
	}
	return true
}

// continued returns the assistant message that p, an assistant record,
// continues, or nil. An importer that reads a transcript cut inside one
// model response (Claude Code writes a response one content block a
// record, and runs a tool as soon as its block is written) records the
// response as far as it goes, with the tool results written between its
// blocks; the grown transcript's next blocks then come as a
// message.appended of the same message_id after those results. In the
// model API's view they are one assistant message, followed by one user
// message with the results: p continues the previous assistant message
// when it has that message's message_id and everything after that message
// is one user message of tool_result blocks only (not meta, not
// synthetic).
func (s *Session) continued(m *Message, p *events.MessageAppended) *Message {
	if m == nil || p.Role != events.RoleAssistant || p.MessageID == "" || m.Role != events.RoleUser ||
		m.NonResult || m.Meta || m.Synthetic || len(s.Messages) < 2 {
		return nil
	}
	a := &s.Messages[len(s.Messages)-2]
	if a.Role != events.RoleAssistant || a.Index != m.Index-1 || a.MessageID == "" || a.MessageID != IDKey(p.MessageID) {
		return nil
	}
	return a
}

// continueMessage folds p, a later record of the assistant message a (see
// continued), into a: its blocks and tool_use blocks are a's, as if they
// had come before the results that follow a. a was counted in the output
// streak when the results arrived; it counts again, from the streak before
// it, with its whole output.
func (s *Session) continueMessage(ev *events.Event, turn string, a *Message, p *events.MessageAppended) {
	if len(a.Seqs) < MaxMessageSeqs {
		a.Seqs = append(a.Seqs, ev.Seq)
	} else {
		a.SeqsDropped++
	}
	s.addOutput(ev, turn, a, p)
	if o := &s.Outputs; o.Message == a.Index && o.Before != nil {
		o.restore(o.Before)
		s.countOutput(a, true)
	}
}

// addBlock appends b to the message's digests, or counts it when the
// message keeps MaxMessageBlocks already.
func (m *Message) addBlock(b Block) {
	if len(m.Blocks) < MaxMessageBlocks {
		m.Blocks = append(m.Blocks, b)
		return
	}
	m.BlocksDropped++
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

// toolUse tracks a tool_use block of assistant message m: it is pending
// until its tool_result arrives or the next user message is judged. A
// tool_use id the history already holds is a violation and is not tracked
// again (the first one keeps the id). Past MaxToolUsesPerMessage blocks
// of m, a tool_use is only counted.
func (s *Session) toolUse(ev *events.Event, turn string, m *Message, cb *events.ContentBlock) {
	id := IDKey(cb.ID)
	m.ToolUses++
	tc := s.toolCall(id)
	if tc != nil && tc.Message != 0 {
		s.violate(ev, RuleDuplicateToolUse, fmt.Sprintf("tool_use id %s already used at seq %d", id, tc.UseSeq), id, turn)
		s.LastTool = nil // a tool call ran between, but it cannot be followed
		return
	}
	if m.ToolUses > MaxToolUsesPerMessage {
		m.UntrackedToolUses++
		s.Totals.UntrackedToolUses++
		s.LastTool = nil
		return
	}
	if tc == nil {
		tc = s.newToolCall(id)
	}
	name := IDKey(cb.Name)
	tc.Name, tc.Turn, tc.Message = name, turn, m.Index
	tc.Step = StepKey(cb.Name, cb.Input)
	tc.UseSeq, tc.Status = ev.Seq, ToolPending
	tc.UsedAt, tc.TimeoutMS = ev.Stored.Round(0), DeclaredTimeoutMS(cb.Name, cb.Input)
	s.Pending = append(s.Pending, id)
	run := *cb
	run.Name = name // the state compares names as keys
	s.toolRunStarts(ev, turn, id, &run)
}

// newToolCall appends a tool call for id and returns it.
func (s *Session) newToolCall(id string) *ToolCall {
	s.ToolCalls = append(s.ToolCalls, ToolCall{ToolUseID: id, Status: CallOnly})
	s.Totals.ToolCalls++
	i := len(s.ToolCalls) - 1
	if s.idx != nil {
		s.idx.toolCalls[id] = i
	}
	return &s.ToolCalls[i]
}

// toolCallEvent returns the tool call a tool_call.* event names, creating
// it (status CallOnly) when no tool_use block named it yet.
func (s *Session) toolCallEvent(ev *events.Event, turn, id, name string) *ToolCall {
	if id == "" {
		s.invalid(ev, string(ev.Type)+" without tool_use_id")
		return nil
	}
	id = IDKey(id)
	tc := s.toolCall(id)
	if tc == nil {
		tc = s.newToolCall(id)
		tc.Name, tc.Turn = IDKey(name), turn
	}
	return tc
}

// answer pairs a tool_result block with its tool_use, or records why it
// answers none. A result that pairs and is not synthetic is the tool's run:
// it may be a failed attempt of the tool_use's turn, or a flaky-suspected
// re-run.
func (s *Session) answer(ev *events.Event, cb *events.ContentBlock, synthetic bool) {
	id := IDKey(cb.ToolUseID)
	tc := s.toolCall(id)
	var orphan *Orphan
	if tc == nil {
		// A tool call the state no longer holds may still be an orphan
		// it keeps (Orphans keeps more).
		if orphan = s.orphan(id); orphan != nil && orphan.Repaired {
			orphan = nil
		}
	}
	switch {
	case orphan != nil:
		if orphan.LateResultSeq == 0 {
			orphan.LateResultSeq = ev.Seq
		}
		s.unmatched(ev, id, UnmatchedLate, RuleLateToolResult,
			fmt.Sprintf("tool_result for %s (%s), already declared an orphan", id, orphan.Name), orphan.Turn)
	case (tc == nil || tc.Message == 0) && s.untracked():
		s.UnmatchedResults = append(s.UnmatchedResults, UnmatchedResult{ToolUseID: id, Seq: ev.Seq, Reason: UnmatchedUntracked})
		s.Totals.UnmatchedResults++
	case (tc == nil || tc.Message == 0) && s.Totals.ToolCalls-s.HistoryStart.ToolCalls > len(s.ToolCalls):
		s.unmatched(ev, id, UnmatchedNotHeld, RuleToolResultWithoutToolUse,
			fmt.Sprintf("tool_result for %s, which no tool_use of the previous assistant message holds (the state keeps the latest %d tool calls)", id, KeepToolCalls), "")
	case tc == nil || tc.Message == 0:
		s.unmatched(ev, id, UnmatchedUnknown, RuleToolResultWithoutToolUse,
			fmt.Sprintf("tool_result for %s, which no tool_use of the history holds", id), "")
	case tc.Status == ToolOrphaned:
		if o := s.orphan(id); o != nil && o.LateResultSeq == 0 {
			o.LateResultSeq = ev.Seq
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
		if !synthetic {
			s.toolError(tc, cb.IsError)
		}
		if !synthetic {
			s.toolRunEnds(ev, tc, cb)
		}
	}
}

// toolError marks tc failed when isError (a tool_result or a
// tool_call.completed with is_error), counting each tool call once in
// Totals.ToolErrors.
func (s *Session) toolError(tc *ToolCall, isError bool) {
	if isError && !tc.IsError {
		s.Totals.ToolErrors++
	}
	tc.IsError = tc.IsError || isError
}

// repairable returns the orphaned tool call a synthetic tool_result for id
// repairs, or nil: its assistant message must still be the history's
// latest assistant message, and no late result may have answered it.
func (s *Session) repairable(id string) *ToolCall {
	id = IDKey(id)
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
func (s *Session) repair(ev *events.Event, tc *ToolCall, cb *events.ContentBlock) {
	tc.Status, tc.ResultSeq = ToolRepaired, ev.Seq
	tc.IsError = tc.IsError || cb.IsError
	if o := s.orphan(tc.ToolUseID); o != nil {
		o.Repaired, o.RepairedSeq = true, ev.Seq
	}
	// The orphan's tool_use_without_result violation is resolved, whether
	// Violations still keeps it or not, so that Status and the
	// distillation check count it out.
	s.Totals.Resolved++
	if s.HistoryBroken[RuleToolUseWithoutResult] > 0 {
		if s.HistoryBroken[RuleToolUseWithoutResult]--; s.HistoryBroken[RuleToolUseWithoutResult] == 0 {
			delete(s.HistoryBroken, RuleToolUseWithoutResult)
		}
	}
	for i := len(s.Violations) - 1; i >= since(s.HistoryStart.Violations, s.Totals.Violations, len(s.Violations)); i-- {
		if v := &s.Violations[i]; !v.Resolved && v.Rule == RuleToolUseWithoutResult && v.ToolUseID == tc.ToolUseID {
			v.Resolved, v.ResolvedSeq = true, ev.Seq
			break
		}
	}
}

// untracked reports whether the previous assistant message has tool_use
// blocks the state did not track (past MaxToolUsesPerMessage).
func (s *Session) untracked() bool {
	m := s.lastAssistant()
	return m != nil && m.UntrackedToolUses > 0
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
func (s *Session) unmatched(ev *events.Event, id, reason string, rule Rule, detail, turn string) {
	s.UnmatchedResults = append(s.UnmatchedResults, UnmatchedResult{ToolUseID: id, Seq: ev.Seq, Reason: reason})
	s.Totals.UnmatchedResults++
	s.violate(ev, rule, detail, id, turn)
}

// judge completes the user message after the latest assistant message: each
// pending tool_use becomes an orphan. With turn set (the turn that ended),
// only the tool_use blocks of that turn are judged. why completes "got no
// tool_result before ...".
func (s *Session) judge(ev *events.Event, turn, why string) {
	s.judgeWhere(ev, why, func(tc *ToolCall) bool { return turn == "" || tc.Turn == turn })
}

// judgeStale judges the pending tool_use blocks whose turn is no longer in
// flight (or that belong to no turn): a new turn's start completes those,
// while a tool of a turn still running (a second message arrived mid-turn)
// stays pending until its own turn ends.
func (s *Session) judgeStale(ev *events.Event, why string) {
	s.judgeWhere(ev, why, func(tc *ToolCall) bool {
		t := s.turn(tc.Turn)
		return t == nil || t.Ended()
	})
}

func (s *Session) judgeWhere(ev *events.Event, why string, due func(*ToolCall) bool) {
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

// containsFold reports whether b holds word (lower-case ASCII letters
// and '_') in any case.
func containsFold(b []byte, word string) bool {
	for i := 0; i+len(word) <= len(b); i++ {
		if b[i]|0x20 != word[0] {
			continue
		}
		j := 1
		for j < len(word) && (b[i+j]|0x20 == word[j] || b[i+j] == word[j]) {
			j++
		}
		if j == len(word) {
			return true
		}
	}
	return false
}

// MaxDeclaredTimeoutMS bounds the timeout a tool call may declare for
// itself (DeclaredTimeoutMS): one day. A larger value counts as that.
const MaxDeclaredTimeoutMS = 24 * 60 * 60 * 1000

// DeclaredTimeoutMS returns the timeout, in milliseconds, that a tool
// call declares in its input, or 0 when it declares none: the member
// "timeout_ms" of any tool (Codex's shell and exec tools, in the
// arguments its importer turns into the input), or "timeout" of Claude
// Code's Bash and TaskOutput tools, whose documented unit is
// milliseconds (at most 600000). A value that is not a positive number is no timeout; one over
// MaxDeclaredTimeoutMS counts as that bound.
func DeclaredTimeoutMS(name string, input json.RawMessage) int64 {
	if len(input) == 0 || input[0] != '{' && !isSpace(input[0]) {
		return 0
	}
	// Most inputs name no timeout: say so without decoding them (the
	// decode was a fifth of a fold's Apply). encoding/json matches
	// member names without regard to case (Unicode simple folding, which
	// maps nothing but ASCII letters to those of "timeout"), and an escape
	// (\u) may spell one, so only an input with neither may be answered
	// here; FuzzDeclaredTimeoutMS checks both paths agree. A decoder that
	// also ignored '_' and '-' in names (go-json-experiment's
	// MatchCaseInsensitiveNames) would break this test.
	if !containsFold(input, "timeout") && !bytes.Contains(input, []byte(`\u`)) {
		return 0
	}
	return declaredTimeoutDecoded(name, input)
}

// declaredTimeoutDecoded is DeclaredTimeoutMS by decoding the input.
func declaredTimeoutDecoded(name string, input json.RawMessage) int64 {
	var in struct {
		TimeoutMS any `json:"timeout_ms"`
		Timeout   any `json:"timeout"`
	}
	if json.Unmarshal(input, &in) != nil {
		return 0
	}
	v := in.TimeoutMS
	if v == nil && (name == "Bash" || name == "TaskOutput") {
		v = in.Timeout
	}
	f, ok := v.(float64)
	if !ok || !(f > 0) || math.IsInf(f, 0) {
		return 0
	}
	if f > MaxDeclaredTimeoutMS {
		return MaxDeclaredTimeoutMS
	}
	return int64(f)
}
