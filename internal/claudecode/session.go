package claudecode

import (
	"fmt"
	"strings"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/importer"
)

// promptPreviewRunes is how much of a prompt turn.started carries.
const promptPreviewRunes = 200

// Turn triggers written to turn.started.
const (
	triggerUser             = "user"
	triggerCommand          = "command"
	triggerTaskNotification = "task_notification"
	triggerSubagent         = "subagent"
	triggerCompaction       = "compaction"
	triggerWarmup           = "warmup"
)

// warmupPrompt is the prompt Claude Code 2.0 sends each subagent type when
// a session starts, to warm its prompt cache; no Task call runs it.
const warmupPrompt = "Warmup"

// outcome is the last user-visible thing of a turn, which decides how it
// ends.
type outcome int

const (
	outcomeMessage     outcome = iota // end_turn
	outcomeInterrupted                // the person stopped it
	outcomeAPIError                   // the model call failed
)

// toolCall is a tool_use block whose tool_call.started was emitted.
type toolCall struct {
	id, name, uuid string
	time           time.Time
	line           int
}

// pendingMessage is an assistant message being assembled from the records
// Claude Code writes one per content block, with the tool results that
// arrived between those records held back until the message is complete.
type pendingMessage struct {
	first    *record
	msgID    string
	model    string
	usage    *events.Usage
	recs     []pieceRecord
	calls    []toolCall
	deferred []*record
}

// pieceRecord is one record of a pending message: the blocks it added
// and its stop_reason, so that the message can be recorded in pieces
// (importer.PieceKey) when the file ends inside it.
type pieceRecord struct {
	uuid       string
	time       time.Time
	line       int
	blocks     []events.ContentBlock
	stopReason string
	usage      *events.Usage // the response's usage as of this record
}

// blocks returns the content blocks of records from..to, the latest
// stop_reason they set, and the usage as of record to.
func (p *pendingMessage) blocks(from, to int) ([]events.ContentBlock, string, *events.Usage) {
	var out []events.ContentBlock
	stop := ""
	for _, r := range p.recs[from : to+1] {
		out = append(out, r.blocks...)
		if r.stopReason != "" {
			stop = r.stopReason
		}
	}
	return out, stop, p.recs[to].usage
}

// answers reports whether every tool_result of r answers a tool_use of p.
func (p *pendingMessage) answers(r *record) bool {
	n := 0
	for i := range r.blocks {
		b := &r.blocks[i]
		if b.Type != events.BlockToolResult {
			continue
		}
		found := false
		for _, c := range p.calls {
			if c.id == b.ToolUseID {
				found = true
				break
			}
		}
		if !found {
			return false
		}
		n++
	}
	return n > 0
}

// sessionConv turns one session's records into events. See the package
// documentation for the rules.
type sessionConv struct {
	c    *Converter
	s    *Session
	recs []*record
	res  *Result
	seen map[string]bool // record uuids converted
	em   *importer.Emitter
	live bool // the file is still being written (importer.Input.Live)

	stopped bool // live mode: the conversion stopped before a record the next ones decide

	turn      string
	turnStart time.Time
	turnLast  time.Time // the time of the turn's latest user or assistant record
	awaiting  bool      // the turn's latest user or assistant record is a user record the model has not answered
	idle      bool      // a stop hook or turn_duration said the turn is over
	outcome   outcome
	lastErr   events.ErrorInfo

	pending    *pendingMessage
	settled    bool                // a record after the pending message says it is complete
	open       map[string]toolCall // tool calls started and not completed
	calls      map[string]bool     // tool_use ids taken for a tool_call.started: each starts once
	unanswered []string            // tool_use ids of the latest assistant message without a result yet

	taskPrompt string // the prompt of the Task call that ran this sidechain, when known
	warmup     bool   // a sidechain no Task call ran: Claude Code's warm-up request

	errStreak int
	errKey    string
}

func newSessionConv(c *Converter, s *Session, recs []*record, res *Result, in importer.Input) *sessionConv {
	src := c.opts.Source
	if src == "" {
		src = SourcePrefix + s.Session
	}
	return &sessionConv{
		c: c, s: s, recs: recs, res: res, seen: map[string]bool{},
		em: importer.NewEmitter(s, res, src, in.Stored), live: in.Live,
		open: map[string]toolCall{}, calls: map[string]bool{},
	}
}

// emit appends one event at time at, keyed (for its deterministic id) by
// key under the session and at, or reports a Diagnostic for line when the
// event is invalid.
func (sc *sessionConv) emit(at time.Time, key, turn string, p events.Payload, line int) {
	sc.em.Emit(at, key, turn, p, line)
}

// emitID is emit with the id's time idAt apart from the event's time at.
func (sc *sessionConv) emitID(at, idAt time.Time, key, turn string, p events.Payload, line int) {
	sc.em.EmitID(at, idAt, key, turn, p, line)
}

func (sc *sessionConv) skip(what string) { sc.res.Skipped[what]++ }

// run converts the records: session.started, then each record in order,
// then the end of the last turn when the transcript says how it ended.
//
// In live mode (importer.Input.Live: the file may still grow) it waits
// for more lines before what they decide: anything at all before the
// session's first model response (session.started describes it), a slash
// command or compaction whose meaning the next record decides (a local
// command's output; the next model call's context size). A response that
// may still get blocks is recorded as far as it goes (see finish).
func (sc *sessionConv) run(labels map[string]string) {
	first := firstResponse(sc.recs)
	if sc.live && first < 0 {
		return
	}
	sc.started(labels, first)
	lastUA, lastA := -1, -1 // the last user or assistant record, the last assistant record
	for i, r := range sc.recs {
		switch r.typ {
		case recAssistant:
			lastUA, lastA = i, i
		case recUser:
			lastUA = i
		}
	}
	sc.prompt()
	for i, r := range sc.recs {
		if sc.live && (r.typ == recUser && r.class == classCommand && i >= lastUA ||
			r.typ == recSystem && r.subtype == subCompact && i > lastA) {
			sc.settled = true // a record follows the pending message
			sc.stopped = true
			break
		}
		if r.uuid != "" && r.typ != recSystem {
			if sc.seen[r.uuid] {
				sc.skip("duplicate " + r.typ)
				continue
			}
			sc.seen[r.uuid] = true
		}
		switch r.typ {
		case recAssistant:
			sc.assistant(r)
		case recUser:
			sc.user(r, i)
		case recSystem:
			if r.subtype == subStopHook || r.subtype == subTurnDur {
				sc.settled = true // written once the response is complete
			}
			sc.system(r, i)
		}
		sc.touch(r)
	}
	sc.finish()
}

// firstResponse is the index of the session's first model response (an
// assistant record that is not an API error, of a real model), or -1.
func firstResponse(recs []*record) int {
	for i, r := range recs {
		if r.typ == recAssistant && !r.apiError && r.model != "" && r.model != "<synthetic>" {
			return i
		}
	}
	return -1
}

// prompt starts the turn of a sidechain whose transcript begins with the
// model's response: Claude Code (2.0.42 to 2.0.55) did not write the
// prompt of its warm-up requests (the "Warmup" it sends each subagent type
// when a session starts, which 2.0.28 to 2.0.37 and 2.0.64 write as a
// user record). The prompt is the Task call's, when a Task call ran the
// sidechain, else "Warmup"; it is written as a meta and synthetic user
// message (the runtime sent it, Turnstone wrote it down), so that the
// history starts with a user message as the model saw it.
func (sc *sessionConv) prompt() {
	if sc.s.Kind == KindMain {
		return
	}
	var r *record
	for _, x := range sc.recs {
		if x.typ == recUser || x.typ == recAssistant {
			r = x
			break
		}
	}
	if r == nil || r.typ != recAssistant || r.parentUUID != "" {
		if r != nil && r.typ == recUser && r.class == classPrompt && sc.taskPrompt == "" && strings.TrimSpace(r.text) == warmupPrompt {
			sc.warmup = true
		}
		return
	}
	text, trigger := sc.taskPrompt, sc.promptTrigger()
	if text == "" {
		text, trigger = warmupPrompt, triggerWarmup
	}
	sc.turn = token(r.uuid)
	sc.turnStart, sc.turnLast = r.time, r.time
	sc.emit(r.time, r.uuid+"/prompt/turn.started", sc.turn, &events.TurnStarted{
		Prompt: clip(strings.TrimSpace(text), promptPreviewRunes), Trigger: trigger,
	}, r.line)
	sc.emit(r.time, r.uuid+"/prompt/message", sc.turn, &events.MessageAppended{
		Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockText, Text: text}}, Meta: true, Synthetic: true,
	}, r.line)
}

// started emits session.started at the session's first record. It reads
// the records up to and including the first model response (index first;
// all of them when there is none), so that it says the same whatever the
// transcript holds after that: the runtime's version, the model, and the
// cwd, git_branch and slug labels as first set.
func (sc *sessionConv) started(labels map[string]string, first int) {
	p := &events.SessionStarted{Provider: providerAnthropic, Kind: sc.s.Kind,
		ParentSession: sc.s.Parent, ParentToolUseID: sc.s.ParentToolUseID, History: !sc.live}
	if labels == nil {
		labels = map[string]string{}
	}
	recs := sc.recs
	if first >= 0 {
		recs = recs[:first+1]
	}
	var at time.Time
	line := 0
	for _, r := range recs {
		if at.IsZero() && !r.time.IsZero() {
			at, line = r.time, r.line
		}
		if p.Runtime == "" && r.version != "" {
			p.Runtime = "claude-code " + r.version
		}
		if p.Model == "" && r.typ == recAssistant && !r.apiError && r.model != "" && r.model != "<synthetic>" {
			p.Model = r.model
		}
		setLabel(labels, "cwd", r.cwd)
		setLabel(labels, "git_branch", r.gitBranch)
		setLabel(labels, "slug", r.slug)
	}
	if p.Runtime == "" {
		p.Runtime = "claude-code"
	}
	if at.IsZero() {
		at = time.Unix(0, 0).UTC()
	}
	// Labels may come from a file name (a subagent's agent id), which
	// need not be UTF-8; the envelope's strings must be.
	for k, v := range labels {
		labels[k] = strings.ToValidUTF8(v, "\uFFFD")
	}
	if len(labels) > 0 {
		p.Labels = labels
	}
	// A live session.started is another event than a history one: a
	// session imported as history whose file then grows under --follow
	// becomes live (the latest session.started decides), and a history
	// import of a followed file makes it history again.
	key := "session.started"
	if sc.live {
		key += "/live"
	}
	sc.emit(at, key, "", p, line)
}

func setLabel(labels map[string]string, k, v string) {
	if v != "" && labels[k] == "" {
		labels[k] = v
	}
}

// touch extends the current turn to r's time when r is a user or
// assistant record (the turn's own messages: system records such as a
// stop hook's summary come after the turn and may not be written yet when
// a later import ends it), and notes whether the model still owes an
// answer to it.
func (sc *sessionConv) touch(r *record) {
	if sc.turn == "" || r.typ != recUser && r.typ != recAssistant {
		return
	}
	if r.time.After(sc.turnLast) {
		sc.turnLast = r.time
	}
	sc.awaiting = r.typ == recUser && r.class != classInterruption
}

func (sc *sessionConv) assistant(r *record) {
	if r.apiError {
		sc.flush(true)
		sc.apiError(r)
		return
	}
	sc.errStreak, sc.errKey = 0, ""
	sc.idle = false
	sc.outcome = outcomeMessage
	p := sc.pending
	if p == nil || r.msgID == "" || r.msgID != p.msgID {
		sc.flush(true)
		p = &pendingMessage{first: r, msgID: r.msgID, model: r.model}
		sc.pending = p
	}
	sc.settled = false
	// Every record of one response repeats its usage; the last one written
	// holds the final output count.
	if u := r.usage.event(); u != nil {
		p.usage = u
	}
	p.recs = append(p.recs, pieceRecord{uuid: r.uuid, time: r.time, line: r.line, blocks: r.blocks, stopReason: r.stopReason, usage: p.usage})
	for _, b := range r.blocks {
		if b.Type != events.BlockToolUse {
			continue
		}
		// A tool_use id names one call (the Messages API refuses a
		// history that repeats one): a block that repeats an earlier id,
		// as a record copied under a new uuid does, stays in the message
		// the transcript holds but starts no second call.
		if sc.calls[b.ID] {
			sc.skip("tool_use (id repeated)")
			continue
		}
		sc.calls[b.ID] = true
		p.calls = append(p.calls, toolCall{id: b.ID, name: b.Name, uuid: r.uuid, time: r.time, line: r.line})
	}
}

// flush emits the pending assistant message, a tool_call.started for each
// of its tool_use blocks, and the tool results held back for it. closed
// says that a record after the message shows it complete; an open message
// (the file ends inside the response, or right after it) is recorded as a
// piece, and a message whose first records the log holds as pieces
// already (Input.Stored) is recorded from the first record they do not
// hold, as a piece of the same message_id: see importer.PieceKey. Before
// its turn's first model output, the turn's context and history stages
// are recorded as completed.
func (sc *sessionConv) flush(closed bool) {
	p := sc.pending
	if p == nil {
		return
	}
	sc.pending = nil
	n := len(p.recs)
	all, _, _ := p.blocks(0, n-1)
	if len(all) == 0 {
		sc.res.Skipped["assistant (no content)"] += n
	} else {
		sc.em.Stages(p.first.time, sc.turn, p.first.line)
		id := func(i, j int, whole bool) string {
			return sc.em.ID(p.recs[i].time, importer.PieceKey(p.recs[i].uuid, p.recs[j].uuid, whole))
		}
		for _, pc := range sc.em.Pieces(n, closed, id) {
			blocks, stop, usage := p.blocks(pc.From, pc.To)
			if len(blocks) == 0 {
				continue
			}
			// Every piece is at the response's first record's time, as the
			// whole message is; its id is its own first record's.
			r := p.recs[pc.From]
			sc.emitID(p.first.time, r.time, importer.PieceKey(r.uuid, p.recs[pc.To].uuid, pc.Whole), sc.turn, &events.MessageAppended{
				Role: events.RoleAssistant, Content: blocks,
				MessageID: p.msgID, Model: p.model, StopReason: stop,
				Usage: usage,
			}, r.line)
		}
	}
	sc.unanswered = sc.unanswered[:0]
	for _, c := range p.calls {
		sc.unanswered = append(sc.unanswered, c.id)
	}
	// The tool calls and the results held back, in file order: Claude
	// Code runs a tool as soon as its block is streamed.
	calls := p.calls
	if len(all) == 0 {
		calls = nil
	}
	for _, d := range p.deferred {
		for len(calls) > 0 && calls[0].line < d.line {
			sc.callStarted(calls[0])
			calls = calls[1:]
		}
		sc.toolResult(d)
	}
	for _, c := range calls {
		sc.callStarted(c)
	}
}

// callStarted emits tool_call.started for a tool_use block.
func (sc *sessionConv) callStarted(c toolCall) {
	sc.emit(c.time, c.uuid+"/tool_call.started/"+c.id, sc.turn,
		&events.ToolCallStarted{ToolUseID: c.id, Name: c.name}, c.line)
	sc.open[c.id] = c
}

func (sc *sessionConv) user(r *record, i int) {
	if r.class == classToolResult {
		sc.idle = false
		sc.outcome = outcomeMessage
		if sc.pending != nil && sc.pending.answers(r) {
			sc.pending.deferred = append(sc.pending.deferred, r)
			return
		}
		sc.flush(true)
		sc.toolResult(r)
		return
	}
	sc.flush(true)
	if r.class != classMeta {
		// The transcript goes on past the latest tool_use blocks: if they
		// lack results, that is not the process dying between the two.
		sc.unanswered = sc.unanswered[:0]
	}
	switch r.class {
	case classPrompt:
		sc.startTurn(r, sc.promptTrigger(), r.text)
		return
	case classTaskNotification:
		prompt := between(r.text, "<summary>", "</summary>")
		if prompt == "" {
			prompt = r.text
		}
		sc.startTurn(r, triggerTaskNotification, prompt)
		return
	case classCommand:
		if !sc.localCommand(i) {
			sc.startTurn(r, triggerCommand, commandPreview(r.text))
			return
		}
		sc.endTurn()
		sc.message(r, false)
	case classCaveat, classBashInput:
		sc.endTurn()
		sc.message(r, r.class == classCaveat)
	case classInterruption:
		sc.message(r, false)
		sc.outcome = outcomeInterrupted
	case classMeta, classCompactSummary, classCommandOutput:
		sc.message(r, true)
	default:
		sc.message(r, r.meta)
	}
}

// message emits a user record as message.appended.
func (sc *sessionConv) message(r *record, meta bool) {
	if len(r.blocks) == 0 {
		sc.skip("user (no content)")
		return
	}
	sc.emit(r.time, r.uuid+"/message", sc.turn, &events.MessageAppended{
		Role: events.RoleUser, Content: r.blocks, Meta: meta,
	}, r.line)
}

// toolResult emits tool_call.completed for each tool_result of r whose
// tool call was started, then r as message.appended.
func (sc *sessionConv) toolResult(r *record) {
	results := 0
	for i := range r.blocks {
		if r.blocks[i].Type == events.BlockToolResult {
			results++
		}
	}
	for i := range r.blocks {
		b := &r.blocks[i]
		if b.Type != events.BlockToolResult {
			continue
		}
		sc.answered(b.ToolUseID)
		c, ok := sc.open[b.ToolUseID]
		if !ok {
			continue
		}
		delete(sc.open, b.ToolUseID)
		dur, ok := int64(0), false
		if results == 1 {
			dur, ok = toolDurationMS(r.toolResult)
		}
		if !ok {
			if d := r.time.Sub(c.time).Milliseconds(); d > 0 {
				dur = d
			}
		}
		sc.emit(r.time, r.uuid+"/tool_call.completed/"+b.ToolUseID, sc.turn, &events.ToolCallCompleted{
			ToolUseID: b.ToolUseID, Name: c.name, DurationMS: dur, IsError: b.IsError,
		}, r.line)
	}
	sc.message(r, r.meta)
}

func (sc *sessionConv) answered(id string) {
	for i, u := range sc.unanswered {
		if u == id {
			sc.unanswered = append(sc.unanswered[:i], sc.unanswered[i+1:]...)
			return
		}
	}
}

func (sc *sessionConv) promptTrigger() string {
	if sc.warmup {
		return triggerWarmup
	}
	switch sc.s.Kind {
	case KindSubagent:
		return triggerSubagent
	case KindCompaction:
		return triggerCompaction
	}
	return triggerUser
}

// localCommand reports whether the slash command at index i ran locally
// (/compact, /mcp, /model: no model call, so no turn): Claude Code writes a
// <local-command-caveat> before such a command or its
// <local-command-stdout> after it. A command that expands to a prompt
// (/init, a custom command) is followed by its isMeta text instead.
func (sc *sessionConv) localCommand(i int) bool {
	for j := i - 1; j >= 0; j-- {
		if r := sc.recs[j]; r.typ == recUser || r.typ == recAssistant {
			if r.typ == recUser && r.class == classCaveat {
				return true
			}
			break
		}
	}
	for j := i + 1; j < len(sc.recs); j++ {
		if r := sc.recs[j]; r.typ == recUser || r.typ == recAssistant {
			return r.typ == recUser && r.class == classCommandOutput
		}
	}
	return false
}

// startTurn ends the turn in flight and starts one at the prompt record r:
// turn.started (turn = r's uuid), then r as message.appended.
func (sc *sessionConv) startTurn(r *record, trigger, prompt string) {
	sc.endTurn()
	sc.turn = token(r.uuid)
	sc.turnStart, sc.turnLast = r.time, r.time
	sc.idle = false
	sc.outcome = outcomeMessage
	sc.lastErr = events.ErrorInfo{}
	sc.emit(r.time, r.uuid+"/turn.started", sc.turn, &events.TurnStarted{
		Prompt: clip(strings.TrimSpace(prompt), promptPreviewRunes), Trigger: trigger,
	}, r.line)
	sc.message(r, false)
}

// endTurn ends the turn in flight, if any: turn.failed when its last
// user-visible record was an API error, else turn.completed with reason
// "interrupted" or "end_turn" and the time from its prompt to its latest
// message. The end is a function of the turn's own records, and its id of
// the turn alone (the time of its prompt and the key "<turn>/end"), so
// that an import of the transcript before or after it grew ends a turn
// once, with the same event.
func (sc *sessionConv) endTurn() {
	if sc.turn == "" {
		return
	}
	turn := sc.turn
	sc.turn = ""
	if sc.outcome == outcomeAPIError {
		sc.emitID(sc.turnLast, sc.turnStart, turn+"/end", turn, &events.TurnFailed{
			Stage: events.StageExecute, Error: sc.lastErr,
		}, 0)
		return
	}
	dur := int64(0)
	if d := sc.turnLast.Sub(sc.turnStart).Milliseconds(); d > 0 {
		dur = d
	}
	reason := "end_turn"
	if sc.outcome == outcomeInterrupted {
		reason = "interrupted"
	}
	sc.emitID(sc.turnLast, sc.turnStart, turn+"/end", turn, &events.TurnCompleted{Reason: reason, DurationMS: dur}, 0)
}

// apiError emits error.recorded for an API error record, which ends the
// model call for good: it is the turn's outcome unless a response follows.
func (sc *sessionConv) apiError(r *record) {
	info := sc.recordError(r)
	sc.outcome = outcomeAPIError
	sc.lastErr = info
	sc.unanswered = sc.unanswered[:0]
}

// recordError emits error.recorded for r. Consecutive counts the API errors
// in a row (no model response between them) with the same HTTP status, or
// the same code when there is no status.
func (sc *sessionConv) recordError(r *record) events.ErrorInfo {
	info := apiErrorInfo(r)
	sc.em.Stages(r.time, sc.turn, r.line) // the model was called
	key := fmt.Sprint(info.HTTPStatus)
	if info.HTTPStatus == 0 {
		key = "code:" + info.Code
	}
	if sc.errStreak > 0 && key == sc.errKey {
		sc.errStreak++
	} else {
		sc.errStreak, sc.errKey = 1, key
	}
	sc.emit(r.time, r.uuid+"/error.recorded", sc.turn, &events.ErrorRecorded{
		ErrorInfo: info, Consecutive: sc.errStreak, Stage: events.StageExecute,
	}, r.line)
	return info
}

func (sc *sessionConv) system(r *record, i int) {
	switch r.subtype {
	case subCompact:
		sc.flush(true)
		sc.compaction(r, i)
		return
	case subTurnDur:
		sc.idle = true
	case subStopHook:
		sc.idle = true
	case subLocalCmd:
		// Claude Code runs local commands (/model, /mcp) only between
		// turns.
		sc.flush(true)
		sc.endTurn()
	case subAPIError:
		if r.apiError && r.uuid != "" && !r.time.IsZero() {
			// A failed attempt Claude Code retries: an error, not (yet)
			// the turn's outcome.
			sc.flush(true)
			sc.recordError(r)
			return
		}
	}
	sc.skip("system/" + r.subtype)
}

// compaction emits distillation.requested, .started and .completed for a
// compact_boundary record. A manual compaction, or one after the turn's
// stop hook ran, happens between turns: the turn in flight ends first and
// the distillation carries no turn. An automatic one inside a turn carries
// the turn's id.
func (sc *sessionConv) compaction(r *record, i int) {
	md := r.compact
	if md == nil {
		md = &compactMetadata{}
	}
	if sc.turn != "" && (md.Trigger == "manual" || sc.idle) {
		sc.endTurn()
	}
	before := int64(0)
	if md.PreTokens > 0 && md.PreTokens < 1e15 {
		before = int64(md.PreTokens)
	}
	sc.emit(r.time, r.uuid+"/distillation.requested", sc.turn, &events.DistillationRequested{Reason: md.Trigger}, r.line)
	sc.emit(r.time, r.uuid+"/distillation.started", sc.turn, &events.DistillationStarted{}, r.line)
	sc.emit(r.time, r.uuid+"/distillation.completed", sc.turn, &events.DistillationCompleted{
		Trigger: md.Trigger, TokensBefore: before, TokensAfter: sc.tokensAfter(i),
	}, r.line)
	sc.unanswered = sc.unanswered[:0]
}

// tokensAfter is the context size, in tokens, of the first model call after
// the compaction at index i (its input plus cache reads and writes), or 0.
func (sc *sessionConv) tokensAfter(i int) int64 {
	for _, r := range sc.recs[i+1:] {
		if r.typ == recSystem && r.subtype == subCompact {
			break
		}
		if r.typ == recAssistant && !r.apiError && r.usage != nil {
			return r.usage.contextTokens()
		}
	}
	return 0
}

// finish converts what the end of the records decides. The pending
// assistant message is emitted, as a piece when nothing after it says it
// is complete (Claude Code writes a response one block at a time, and may
// run its tools between two of them: a grown file continues it, see
// flush), with the tool results written between its blocks: the file
// never holds back a tool_use it has written. Then the last turn ends only when the
// transcript says how: after an interruption marker or an API error that
// ended the model call; otherwise it stays in flight while a tool_use of
// the latest response awaits its result (the tool is running, or the
// process died: a transcript does not say which, and a later import of
// the grown file may hold the result) or the model has not answered the
// latest user record. When the model's last response answered, the turn
// ends at the end of a history import, and in live mode only once a stop
// hook's summary or a turn_duration record says the turn is over (or the
// next prompt arrives).
func (sc *sessionConv) finish() {
	sc.flush(sc.settled)
	switch {
	case sc.turn == "" || sc.stopped:
	case sc.outcome == outcomeInterrupted || sc.outcome == outcomeAPIError:
		sc.endTurn()
	case len(sc.unanswered) > 0 || sc.awaiting:
	case !sc.live || sc.idle:
		sc.endTurn()
	}
}
