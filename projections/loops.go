package projections

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"slices"

	"github.com/cespare/xxhash/v2"
	"github.com/turnstone-dev/turnstone/events"
)

// Invariant 4 (docs/design.md): a turn's implementation budget is
// bounded; the same error N times in a row, or the same output hash N
// times in a row, is a loop, not progress. The fold only counts; the
// limits are the reconciler's policy.
//
//   - Errors.Streak: identical errors in a row (ErrorKey).
//   - Outputs: the same assistant output in reply to the same input, in
//     a row (OutputStreak, OutputHash, Message.Hash).
//   - Turn.FailedAttempts and Steps: the budget a turn in flight spent,
//     counted per step: failed attempts at one step (the same tool on
//     the same operand, or one stage) with no success of that step
//     between them. A long turn's failures at different steps (a grep
//     with no match, a test run that fails before it passes) are
//     ordinary work and spend nothing lasting.
//   - Flaky: a failed tool call whose immediate identical re-run passed,
//     a flaky-suspected run (a test, a build): recorded for people, not a
//     violation and not a loop.
//
// They were calibrated on real Claude Code sessions
// (test/detectors_test.go): each reports nothing on a healthy one.

// DefaultLoopLimit is the run length from which Anomalous calls a streak
// of identical assistant outputs (Outputs.Count) or identical errors
// (Errors.Streak.Count) a loop. The reconciler's policy sets its own.
const DefaultLoopLimit = 3

// OutputStreak is the run of the same assistant output in reply to the
// same input, in a row (invariant 4). Each assistant message of the
// history counts once, when it is complete: when a user record arrives
// after it, when the turn of its first record ends (any turn's end, for a
// message of no turn), or when a distillation starts; its Message.Hash as
// of then is its output, and the Message.Hash of the user message right
// before it (what it answers: a prompt, or the results of the previous
// tool calls) is its input. A message with the run's Hash and Input
// extends the run; another starts a new run of 1. The end of a turn does
// not reset the streak (a loop spans turns); a distillation.completed
// does (the history it compared is gone).
//
// An output repeated in reply to inputs that differ is not a loop: the
// agent is waiting on something that changes (a background job it polls,
// whose status and time stamp change with each poll), or answering a
// person who says something new each time. Only the same input, to the
// byte, answered with the same output is no progress.
type OutputStreak struct {
	// Hash is the Message.Hash of the run's messages (empty when Count
	// is 0).
	Hash string `json:"hash,omitempty"`
	// Input is the Message.Hash of the user message each of the run's
	// messages answers (empty at the start of a history).
	Input string `json:"input,omitempty"`
	// Count is how many assistant messages in a row had it.
	Count int `json:"count"`
	// Seqs are the sequences of the first records (message.appended) of
	// the run's first KeepOutputSeqs messages: Seqs[0] is where the run
	// began.
	Seqs []uint64 `json:"seqs,omitempty"`
	// LastSeq is the sequence of the first record of the run's latest
	// message.
	LastSeq uint64 `json:"last_seq,omitzero"`
	// Message is the Index of the latest assistant message counted, so
	// that none counts twice.
	Message int `json:"message,omitzero"`
	// Before is the streak as it was before that message counted, kept
	// when the message has a message_id and counted because tool results
	// came: a later message.appended of the same response (a piece
	// recorded after its tool results, see Message.MessageID) adds blocks
	// to it, and it counts again, with its whole output, from there.
	Before *OutputRun `json:"before,omitempty"`
}

// OutputRun is an OutputStreak's run without its Before: what the streak
// was before its latest message counted.
type OutputRun struct {
	Hash    string   `json:"hash,omitempty"`
	Input   string   `json:"input,omitempty"`
	Count   int      `json:"count"`
	Seqs    []uint64 `json:"seqs,omitempty"`
	LastSeq uint64   `json:"last_seq,omitzero"`
	Message int      `json:"message,omitzero"`
}

// run returns the streak's run, its Seqs copied.
func (o *OutputStreak) run() *OutputRun {
	return &OutputRun{Hash: o.Hash, Input: o.Input, Count: o.Count, Seqs: slices.Clone(o.Seqs), LastSeq: o.LastSeq, Message: o.Message}
}

// restore sets the streak back to the run r, with no Before.
func (o *OutputStreak) restore(r *OutputRun) {
	*o = OutputStreak{Hash: r.Hash, Input: r.Input, Count: r.Count, Seqs: r.Seqs, LastSeq: r.LastSeq, Message: r.Message}
}

// ToolRun is the session's latest tool_use and how it ran: what the next
// tool_use is compared with to spot a re-run.
type ToolRun struct {
	// ToolUseID, Name and Turn are the tool_use's id, tool name and turn;
	// UseSeq the sequence of the record holding it.
	ToolUseID string `json:"tool_use_id"`
	Name      string `json:"name"`
	Turn      string `json:"turn,omitempty"`
	UseSeq    uint64 `json:"use_seq"`
	// InputHash is InputHash of its input.
	InputHash string `json:"input_hash"`
	// ResultSeq and IsError are those of the tool_result that answered
	// it (0 and false until one did; a synthetic result does not count).
	ResultSeq uint64 `json:"result_seq,omitzero"`
	IsError   bool   `json:"is_error,omitzero"`
	// RerunOf is the ResultSeq of the failed run this one re-runs, or 0:
	// the tool_use before it had the same Name and InputHash, and its
	// tool_result, an error, arrived before this tool_use.
	RerunOf uint64 `json:"rerun_of,omitzero"`
}

// Flaky is a flaky-suspected tool run: a tool call whose tool_result was
// an error, and whose immediate re-run passed. The re-run is the next
// tool_use of the session (no other tool call between them), with the same
// tool name and the same input (InputHash), made after the failed result
// arrived; it passed when its own tool_result is not an error. Tool calls
// in one assistant message run in parallel, so identical calls there are
// not re-runs. Synthetic results (repairs) are no runs.
type Flaky struct {
	// Tool is the tool's name; InputHash is InputHash of the input both
	// runs had.
	Tool      string `json:"tool"`
	InputHash string `json:"input_hash"`
	// FailSeq and PassSeq are the sequences of the records holding the
	// failed and the passing tool_result.
	FailSeq uint64 `json:"fail_seq"`
	PassSeq uint64 `json:"pass_seq"`
	// Turn is the re-run's turn.
	Turn string `json:"turn,omitempty"`
}

// emptyOutputHash is OutputHash of no content: shortHash of nothing.
const emptyOutputHash = "ef46db3751d8e999"

// OutputHash returns the hash that makes two assistant outputs "the same
// output" for an OutputStreak: 16 hex digits, chained over the content
// blocks in order, so that it does not depend on how the message was split
// into records. h0 is shortHash of nothing; each block that counts gives
// h = shortHash(h + "\n" + normalized block); the last h is the hash.
//
// A block's normalized form is its type, tool name, input as compact JSON
// (white space outside strings removed) and text with every run of white
// space collapsed to one space and trimmed, joined by NUL bytes. Ids
// (a tool_use's id, a result's tool_use_id), signatures, data, result
// content and sources are left out, and thinking and redacted_thinking
// blocks do not count at all: the same tool call with a fresh id, or the
// same answer after different thoughts, is the same output.
func OutputHash(blocks []events.ContentBlock) string {
	h := emptyOutputHash
	for i := range blocks {
		h = chainOutput(h, &blocks[i])
	}
	return h
}

// chainOutput returns the output hash h extended with block cb.
func chainOutput(h string, cb *events.ContentBlock) string {
	if cb.Type == events.BlockThinking || cb.Type == "redacted_thinking" {
		return h
	}
	var scratch [1024]byte // the hashed bytes, on the stack unless they are longer
	b := append(scratch[:0], h...)
	b = append(b, '\n')
	b = append(b, cb.Type...)
	b = append(b, 0)
	b = append(b, cb.Name...)
	b = append(b, 0)
	b = appendCompact(b, cb.Input, len(cb.Input))
	b = append(b, 0)
	b = appendFields(b, cb.Text)
	return shortHash(b)
}

// chainInput returns the hash h of a user message extended with block cb:
// shortHash(h + "\n" + type, is_error, text,
// content, source, data), exactly as they are (no white space folded). A
// tool_result's tool_use_id is left out: the same result of a fresh call
// is the same input. Two user messages with the same hash said the same
// thing to the model.
func chainInput(h string, cb *events.ContentBlock) string {
	var scratch [1024]byte
	b := append(scratch[:0], h...)
	b = append(b, '\n')
	b = append(b, cb.Type...)
	if cb.IsError {
		b = append(b, 0, 1)
	}
	b = append(b, 0)
	b = append(b, cb.Text...)
	b = append(b, 0)
	b = append(b, cb.Content...)
	b = append(b, 0)
	b = append(b, cb.Source...)
	b = append(b, 0)
	b = append(b, cb.Data...)
	return shortHash(b)
}

// InputHash returns shortHash of a tool
// input as compact JSON (white space outside strings removed): two tool
// calls with the same name and InputHash are the same call.
func InputHash(input json.RawMessage) string {
	var scratch [1024]byte
	return shortHash(appendCompact(scratch[:0], input, len(input)))
}

// shortHash is the 64-bit xxHash (XXH64, seed 0; github.com/cespare/xxhash)
// of b in 16 hex digits, big-endian. The loop and budget detectors only
// compare these hashes within one session's state, where a hash of
// 64 bits makes a chance collision negligible; none is a security
// boundary (a tenant could only fool its own session's detectors), and
// SHA-256 was a seventh of a fold's CPU (state Version 12).
func shortHash(b []byte) string {
	var sum [8]byte
	binary.BigEndian.PutUint64(sum[:], xxhash.Sum64(b))
	var out [16]byte
	hex.Encode(out[:], sum[:])
	return string(out[:])
}

// countOutput counts assistant message m, now complete, in the output
// streak, unless it counted already. keep keeps the streak as it was
// before (OutputStreak.Before), for a record of m's response that may
// continue it.
func (s *Session) countOutput(m *Message, keep bool) {
	if m == nil || m.Role != events.RoleAssistant || m.Index <= s.Outputs.Message || len(m.Seqs) == 0 {
		return
	}
	input := ""
	if in := s.message(m.Index - 1); in != nil && in.Role == events.RoleUser {
		input = in.Hash
	}
	o := &s.Outputs
	o.Before = nil
	if keep {
		o.Before = o.run()
	}
	o.Message, o.LastSeq = m.Index, m.Seqs[0]
	if o.Count > 0 && o.Hash == m.Hash && o.Input == input {
		o.Count++
		if len(o.Seqs) < KeepOutputSeqs {
			o.Seqs = append(o.Seqs, m.Seqs[0])
		}
		return
	}
	o.Hash, o.Input, o.Count, o.Seqs = m.Hash, input, 1, []uint64{m.Seqs[0]}
}

// message returns the kept message of the current history with Index i,
// or nil.
func (s *Session) message(i int) *Message {
	for j := len(s.Messages) - 1; j >= 0; j-- {
		switch m := &s.Messages[j]; {
		case m.Index == i:
			return m
		case m.Index < i:
			return nil
		}
	}
	return nil
}

// completeOutput counts the history's latest message when it is an
// assistant message that due accepts.
func (s *Session) completeOutput(due func(*Message) bool) {
	if m := s.lastMessage(); m != nil && m.Role == events.RoleAssistant && (due == nil || due(m)) {
		s.countOutput(m, false)
	}
}

// toolRunStarts records the tool_use cb of ev (turn) as the session's
// latest tool run, a re-run of the previous one when it failed with the
// same name and input.
func (s *Session) toolRunStarts(ev *events.Event, turn string, id string, cb *events.ContentBlock) {
	run := &ToolRun{ToolUseID: id, Name: cb.Name, Turn: turn, UseSeq: ev.Seq, InputHash: InputHash(cb.Input)}
	if p := s.LastTool; p != nil && p.ResultSeq != 0 && p.IsError && p.Name == run.Name && p.InputHash == run.InputHash {
		run.RerunOf = p.ResultSeq
	}
	s.LastTool = run
}

// toolRunEnds records the outcome of the tool call tc, answered by the
// (not synthetic) tool_result cb of ev: a failed attempt at its step when
// cb is an error, else a success of that step; a flaky-suspected run when
// it is the latest tool run, a re-run of a failed one, and passed.
func (s *Session) toolRunEnds(ev *events.Event, tc *ToolCall, cb *events.ContentBlock) {
	if cb.IsError {
		s.stepFailed(ev, tc.Turn, tc.Step, tc.Name)
	} else {
		s.stepPassed(tc.Turn, tc.Step)
	}
	r := s.LastTool
	if r == nil || r.ToolUseID != tc.ToolUseID || r.UseSeq != tc.UseSeq || r.ResultSeq != 0 {
		return
	}
	r.ResultSeq, r.IsError = ev.Seq, cb.IsError
	if !cb.IsError && r.RerunOf != 0 {
		s.Flaky = append(s.Flaky, Flaky{Tool: r.Name, InputHash: r.InputHash, FailSeq: r.RerunOf, PassSeq: ev.Seq, Turn: r.Turn})
		s.Totals.Flaky++
	}
}

// FailedStep is one step of a turn in flight that failed and has not succeeded
// since: what the implementation budget counts (invariant 4). A step is
// a tool called on one operand (StepKey of its tool_use), or a stage of
// the runtime's pipeline whose errors were recorded (error.recorded; for
// the execute stage that is the model call, which succeeds when the
// model answers with an assistant message; another stage succeeds with
// its turn.stage_completed). A failure of the step adds one to Failures;
// a success of the step removes it, whatever else failed or passed in
// between; the end of its turn removes every step of the turn.
type FailedStep struct {
	// Turn is the turn whose step it is.
	Turn string `json:"turn"`
	// Key identifies the step in its turn: StepKey of the tool call, or
	// "stage:<stage>".
	Key string `json:"key"`
	// Name is the tool's name (IDKey), or the stage.
	Name string `json:"name"`
	// Failures is how many attempts at it failed since it last succeeded
	// (or since its turn started).
	Failures int `json:"failures"`
	// FirstSeq and LastSeq are the sequences of the first and the latest
	// of those failures (the records holding the failed tool_result, or
	// the error.recorded events).
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
}

// stageStep is the FailedStep.Key of a stage's failures.
func stageStep(stage events.Stage) string {
	if stage == "" {
		stage = events.StageExecute
	}
	return "stage:" + string(stageKey(stage))
}

// StepKey returns the key that makes two tool calls "the same step" for
// the implementation budget: shortHash of
// the tool's name, a NUL byte and the call's operand: the first member of
// its input object (name and value as compact JSON, every run of white
// space collapsed to one space), or the whole input when it is not an
// object with members. Tool inputs name what they act on first (a shell
// command, a file path, a URL, a search pattern; Claude Code's Bash,
// Read, Edit, Write, Grep, WebFetch), and what follows is commentary or
// detail that varies between attempts at the same thing (a description,
// a timeout, the text an edit tries to replace): a command re-run with
// another description, or a file that keeps refusing edits, is one step.
func StepKey(name string, input json.RawMessage) string {
	var scratch, compact [1024]byte
	b := append(scratch[:0], name...)
	b = append(b, 0)
	member := firstMember(input)
	return shortHash(appendFields(b, string(appendCompact(compact[:0], member, len(member)))))
}

// firstMember returns the first member ("name":value) of the JSON object
// raw, or raw itself when raw is not an object with at least one member.
// It reads no further than that member.
func firstMember(raw json.RawMessage) json.RawMessage {
	i := 0
	for i < len(raw) && isSpace(raw[i]) {
		i++
	}
	if i == len(raw) || raw[i] != '{' {
		return raw
	}
	start := i + 1
	depth, inString, escaped := 0, false, false
	for j := start; j < len(raw); j++ {
		c := raw[j]
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
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			if depth == 0 {
				return raw[start:j]
			}
			depth--
		case c == ',' && depth == 0:
			return raw[start:j]
		}
	}
	return raw
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// stepFailed counts a failed attempt at step key (named name) of turn,
// when the turn is in flight. Past MaxSteps steps, the one with the
// fewest failures (the oldest of those) is forgotten.
func (s *Session) stepFailed(ev *events.Event, turn, key, name string) {
	t := s.turn(turn)
	if t == nil || t.Ended() || key == "" {
		return
	}
	st := s.step(turn, key)
	if st == nil {
		if len(s.Steps) >= MaxSteps {
			drop := 0
			for i := range s.Steps {
				if s.Steps[i].Failures < s.Steps[drop].Failures {
					drop = i
				}
			}
			s.Steps = slices.Delete(s.Steps, drop, drop+1)
		}
		s.Steps = append(s.Steps, FailedStep{Turn: turn, Key: key, Name: name, FirstSeq: ev.Seq})
		st = &s.Steps[len(s.Steps)-1]
	}
	st.Failures++
	st.LastSeq = ev.Seq
	s.spent(t)
}

// stepPassed forgets the failures of step key of turn: it succeeded.
func (s *Session) stepPassed(turn, key string) {
	i := slices.IndexFunc(s.Steps, func(st FailedStep) bool { return st.Turn == turn && st.Key == key })
	if i < 0 {
		return
	}
	s.Steps = slices.Delete(s.Steps, i, i+1)
	if len(s.Steps) == 0 {
		s.Steps = nil
	}
	if t := s.turn(turn); t != nil && !t.Ended() {
		s.spent(t)
	}
}

// endSteps forgets the steps of turn t, which ended; its FailedAttempts
// keep their value.
func (s *Session) endSteps(t *Turn) {
	s.Steps = slices.DeleteFunc(s.Steps, func(st FailedStep) bool { return st.Turn == t.ID })
	if len(s.Steps) == 0 {
		s.Steps = nil
	}
}

// spent sets t.FailedAttempts: the most failures of one of its steps.
func (s *Session) spent(t *Turn) {
	if st := s.BudgetStep(t.ID); st != nil {
		t.FailedAttempts = st.Failures
		return
	}
	t.FailedAttempts = 0
}

func (s *Session) step(turn, key string) *FailedStep {
	for i := range s.Steps {
		if s.Steps[i].Turn == turn && s.Steps[i].Key == key {
			return &s.Steps[i]
		}
	}
	return nil
}

// BudgetStep returns the step of turn (in flight) with the most failures
// in a row, the one whose run began first among equals: the step the
// turn's FailedAttempts counts. Nil when no step of the turn is failing.
func (s *Session) BudgetStep(turn string) *FailedStep {
	var best *FailedStep
	for i := range s.Steps {
		st := &s.Steps[i]
		if st.Turn == turn && (best == nil || st.Failures > best.Failures || st.Failures == best.Failures && st.FirstSeq < best.FirstSeq) {
			best = st
		}
	}
	return best
}
