package projections

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"

	"github.com/turnstone-dev/turnstone/events"
)

// Invariant 4 (docs/design.md): a turn's implementation budget is
// bounded; the same error N times in a row, or the same output hash N
// times in a row, is a loop, not progress. The fold only counts; the
// limits are the reconciler's policy.
//
//   - Errors.Streak: identical errors in a row (ErrorKey).
//   - Outputs: identical assistant outputs in a row (OutputStreak,
//     OutputHash).
//   - Turn.FailedAttempts: the budget a turn spent (its failed tool
//     results and recorded errors).
//   - Flaky: a failed tool call whose immediate identical re-run passed,
//     a flaky-suspected run (a test, a build): recorded for people, not a
//     violation and not a loop.

// DefaultLoopLimit is the run length from which Anomalous calls a streak
// of identical assistant outputs (Outputs.Count) or identical errors
// (Errors.Streak.Count) a loop. The reconciler's policy sets its own.
const DefaultLoopLimit = 3

// OutputStreak is the run of identical assistant outputs in a row
// (invariant 4). Each assistant message of the history counts once, when
// it is complete: when a user record arrives after it, when the turn of
// its first record ends (any turn's end, for a message of no turn), or
// when a distillation starts; its Message.Hash as of then is its output.
// A message with the run's Hash extends the run; another starts a new run
// of 1. The end of a turn does not reset the streak (a loop spans turns);
// a distillation.completed does (the history it compared is gone).
type OutputStreak struct {
	// Hash is the Message.Hash of the run's messages (empty when Count
	// is 0).
	Hash string `json:"hash,omitempty"`
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

// emptyOutputHash is OutputHash of no content: the first 16 hex digits
// of the SHA-256 of nothing.
const emptyOutputHash = "e3b0c44298fc1c14"

// OutputHash returns the hash that makes two assistant outputs "the same
// output" for an OutputStreak: 16 hex digits, chained over the content
// blocks in order, so that it does not depend on how the message was split
// into records. h0 is the first 16 hex digits of the SHA-256 of nothing;
// each block that counts gives h = the first 16 hex digits of
// SHA-256(h + "\n" + normalized block); the last h is the hash.
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
	sum := sha256.New()
	for i, part := range []string{h + "\n" + cb.Type, cb.Name, compactJSON(cb.Input), strings.Join(strings.Fields(cb.Text), " ")} {
		if i > 0 {
			sum.Write([]byte{0})
		}
		sum.Write([]byte(part))
	}
	return hex.EncodeToString(sum.Sum(nil)[:8])
}

// InputHash returns the first 16 hex digits of the SHA-256 of a tool
// input as compact JSON (white space outside strings removed): two tool
// calls with the same name and InputHash are the same call.
func InputHash(input json.RawMessage) string {
	sum := sha256.Sum256([]byte(compactJSON(input)))
	return hex.EncodeToString(sum[:8])
}

// countOutput counts assistant message m, now complete, in the output
// streak, unless it counted already.
func (s *Session) countOutput(m *Message) {
	if m == nil || m.Role != events.RoleAssistant || m.Index <= s.Outputs.Message || len(m.Seqs) == 0 {
		return
	}
	o := &s.Outputs
	o.Message, o.LastSeq = m.Index, m.Seqs[0]
	if o.Count > 0 && o.Hash == m.Hash {
		o.Count++
		if len(o.Seqs) < KeepOutputSeqs {
			o.Seqs = append(o.Seqs, m.Seqs[0])
		}
		return
	}
	o.Hash, o.Count, o.Seqs = m.Hash, 1, []uint64{m.Seqs[0]}
}

// completeOutput counts the history's latest message when it is an
// assistant message that due accepts.
func (s *Session) completeOutput(due func(*Message) bool) {
	if m := s.lastMessage(); m != nil && m.Role == events.RoleAssistant && (due == nil || due(m)) {
		s.countOutput(m)
	}
}

// toolRunStarts records the tool_use cb of ev (turn) as the session's
// latest tool run, a re-run of the previous one when it failed with the
// same name and input.
func (s *Session) toolRunStarts(ev events.Event, turn string, id string, cb *events.ContentBlock) {
	run := &ToolRun{ToolUseID: id, Name: cb.Name, Turn: turn, UseSeq: ev.Seq, InputHash: InputHash(cb.Input)}
	if p := s.LastTool; p != nil && p.ResultSeq != 0 && p.IsError && p.Name == run.Name && p.InputHash == run.InputHash {
		run.RerunOf = p.ResultSeq
	}
	s.LastTool = run
}

// toolRunEnds records the outcome of the tool call tc, answered by the
// (not synthetic) tool_result cb of ev: a failed attempt of its turn when
// cb is an error; a flaky-suspected run when it is the latest tool run, a
// re-run of a failed one, and passed.
func (s *Session) toolRunEnds(ev events.Event, tc *ToolCall, cb *events.ContentBlock) {
	if cb.IsError {
		if t := s.turn(tc.Turn); t != nil {
			t.FailedAttempts++
		}
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
