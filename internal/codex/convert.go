package codex

import (
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	json "github.com/go-json-experiment/json/v1"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/importer"
)

// SourcePrefix starts the envelope source of converted events when
// Options.Source is empty: "urn:codex:<session token>".
const SourcePrefix = "urn:codex:"

// promptPreviewRunes is how much of a prompt turn.started carries.
const promptPreviewRunes = 200

// Converter converts Codex rollouts to Turnstone events
// (importer.Converter). It keeps nothing between files: a rollout holds
// its whole session.
type Converter struct {
	opts importer.Options
}

var _ importer.Converter = (*Converter)(nil)

// NewConverter returns a Converter for opts. It returns an error wrapping
// importer.ErrInvalidOptions when opts.Validate fails.
func NewConverter(opts importer.Options) (*Converter, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.SetDefaults()
	return &Converter{opts: opts}, nil
}

// Convert converts one rollout read from r (see the package
// documentation). path names the file: diagnostics carry it, and a file
// whose lines name no session (no session_meta) takes its session from
// its name, rollout-<time>-<id>.jsonl. It returns an error only when
// reading r or in.Stored fails; a malformed or too long line is a
// Diagnostic and is skipped. It never panics on its input.
func (c *Converter) Convert(r io.Reader, path string, in importer.Input) (*importer.Result, error) {
	res := importer.NewResult()
	var lines []*line
	prev := time.Unix(0, 0).UTC()
	lr := importer.NewLineReader(r, c.opts.MaxLineBytes)
	for n := 1; ; n++ {
		b, tooLong, ok, err := lr.Next()
		if err != nil {
			return nil, fmt.Errorf("convert rollout %s: read line %d: %w", path, n, err)
		}
		if !ok {
			break
		}
		if tooLong {
			res.Diagnostics = append(res.Diagnostics, importer.Diagnostic{File: path, Line: n,
				Err: fmt.Errorf("%w: more than %d bytes", importer.ErrLineTooLong, c.opts.MaxLineBytes)})
			continue
		}
		l, err := parseLine(b, n, prev)
		if err != nil {
			res.Diagnostics = append(res.Diagnostics, importer.Diagnostic{File: path, Line: n, Err: err})
			continue
		}
		prev = l.time
		res.Records++
		lines = append(lines, l)
	}
	cv := newConv(c, res, path, lines, in)
	if cv == nil {
		for _, l := range lines {
			res.Unknown[l.typ]++
		}
		return res, nil
	}
	cv.run()
	if err := cv.em.Err(); err != nil {
		return nil, fmt.Errorf("convert rollout %s: %w", path, err)
	}
	if len(cv.s.Events) > 0 {
		res.Sessions = append(res.Sessions, *cv.s)
	}
	return res, nil
}

// rolloutName is a rollout file's name: rollout-<time>-<uuid>.jsonl.
var rolloutName = regexp.MustCompile(`^rollout-.*?([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})\.jsonl$`)

// conv converts one rollout's lines: see the package documentation for
// the rules.
type conv struct {
	c     *Converter
	res   *importer.Result
	s     *importer.Session
	em    *importer.Emitter
	live  bool
	lines []*line

	meta     sessionMeta
	metaLine *line
	started  bool
	model    string

	turn     *turn
	turnIDs  map[string]bool // every turn id given so far: each turn's events take their ids from it
	taskMode bool            // the rollout has task_started events (0.104 on): a user message opens no turn

	held          []*heldItem
	promptPending bool   // a user_message came before its response_item
	promptText    string // its text

	resp    *response
	calls   map[string]*call // tool_use blocks recorded, by call_id
	pending []*call          // those without an output yet, in order
	server  map[string]bool  // call ids of calls the provider runs itself
	ends    map[string]bool  // call id -> failed, from the *_end events
	endSeen map[string]bool

	lastTotal  int64       // the total of the latest token_count that grew
	lastCall   *tokenUsage // the latest model call's usage
	compaction *compaction

	errStreak int
	errKey    string
}

// turn is a turn of the session.
type turn struct {
	id        string
	taskID    string // the turn_id of its task_started, as a token (id, unless an ended turn had it)
	start     time.Time
	startLine int
	last      time.Time // the latest user or assistant record of the turn
	implicit  bool      // opened by a user message (no task_started: 0.77)

	announced  bool   // turn.started recorded
	prompt     string // the prompt's preview
	promptDone bool

	responded bool // the model answered in it
	awaiting  bool // a user message came after the model's latest answer
	lastErr   *events.ErrorInfo
	ending    *turnEnd // its end, waiting for the outputs of its pending calls
	ended     bool
}

// turnEnd is how a turn ends.
type turnEnd struct {
	payload events.Payload
	at      time.Time
	line    int
}

// heldItem is a user-side message item (user, developer, an agent's
// message) waiting for what decides it: whether it is a turn's prompt,
// and where it goes in the history.
type heldItem struct {
	l        *line
	role     string
	blocks   []events.ContentBlock
	paired   bool // a user_message named it: a person typed it
	pairText string
}

// response is one model response being read: the assistant items of one
// model call, with the outputs written while it streamed held back.
type response struct {
	first    *line
	turn     string
	recs     []piece
	calls    []*call
	deferred []*line
	usage    *events.Usage
}

// piece is one line of a response.
type piece struct {
	l      *line
	blocks []events.ContentBlock
}

// call is a tool_use recorded.
type call struct {
	id, name string
	time     time.Time
	line     int
	turn     *turn
}

// compaction is a compaction waiting to be recorded.
type compaction struct {
	l        *line
	summary  string
	replaced int
	before   int64
	total    int64 // the token total when it happened
	turn     *turn
	event    bool // its context_compacted event was seen
	compact  bool // its compacted line was seen
}

func newConv(c *Converter, res *importer.Result, path string, lines []*line, in importer.Input) *conv {
	cv := &conv{c: c, res: res, live: in.Live, lines: lines,
		calls: map[string]*call{}, server: map[string]bool{}, ends: map[string]bool{}, endSeen: map[string]bool{},
		turnIDs: map[string]bool{}}
	token := ""
	for _, l := range lines {
		if l.typ == typeSessionMeta {
			cv.meta = decode[sessionMeta](l.payload)
			cv.metaLine = l
			token = cv.meta.ID
			break
		}
	}
	if token == "" {
		known := false
		for _, l := range lines {
			if l.typ == typeResponse || l.typ == typeEvent || l.typ == typeTurnContext {
				known = true
				break
			}
		}
		if !known {
			return nil
		}
		base := filepath.Base(path)
		if m := rolloutName.FindStringSubmatch(base); m != nil {
			token = m[1]
		} else {
			token = strings.TrimSuffix(base, filepath.Ext(base))
		}
	}
	cv.s = &importer.Session{Tenant: c.opts.Tenant, Session: importer.Token(token), File: path, Kind: importer.KindMain}
	if src, parent := cv.meta.source(); src == "subagent" {
		cv.s.Kind = importer.KindSubagent
		if parent != "" {
			cv.s.Parent = importer.Token(parent)
		}
	}
	source := c.opts.Source
	if source == "" {
		source = SourcePrefix + cv.s.Session
	}
	cv.em = importer.NewEmitter(cv.s, res, source, in.Stored)
	cv.model = cv.meta.Model
	return cv
}

func (cv *conv) skip(what string) { cv.res.Skipped[what]++ }

// run converts the lines in order, then what the end of the file decides.
func (cv *conv) run() {
	for _, l := range cv.lines {
		switch l.typ {
		case typeSessionMeta:
			if l != cv.metaLine {
				cv.skip("session_meta (not the first)")
			}
		case typeTurnContext:
			tc := decode[turnContext](l.payload)
			if tc.Model != "" {
				cv.model = tc.Model
			}
			cv.closeResponse(true) // the next model request begins
			cv.skip("turn_context")
		case typeResponse:
			cv.responseItem(l)
		case typeEvent:
			cv.event(l)
		case typeCompacted:
			p := decode[compacted](l.payload)
			cv.compacted(l, p.Message, len(p.ReplacementHistory), false)
		default:
			cv.res.Unknown[l.typ]++
		}
	}
	cv.finish()
}

// start records session.started once, before the session's first other
// event: from the first session_meta alone, so that it says the same
// however much of the file was read.
func (cv *conv) start() {
	if cv.started {
		return
	}
	cv.started = true
	m := &cv.meta
	p := &events.SessionStarted{Runtime: "codex", Provider: m.ModelProvider, Model: m.Model, Kind: cv.s.Kind,
		ParentSession: cv.s.Parent, History: !cv.live}
	if m.CLIVersion != "" {
		p.Runtime = "codex " + m.CLIVersion
	}
	labels := map[string]string{}
	set := func(k, v string) {
		if v = strings.TrimSpace(v); v != "" {
			labels[k] = strings.ToValidUTF8(importer.Clip(v, 200), "\uFFFD")
		}
	}
	src, _ := m.source()
	set("cwd", m.CWD)
	set("originator", m.Originator)
	set("source", src)
	set("git_branch", m.Git.Branch)
	set("git_commit", m.Git.CommitHash)
	set("forked_from", m.ForkedFromID)
	if len(labels) > 0 {
		p.Labels = labels
	}
	at, line := cv.lines[0].time, cv.lines[0].n
	if cv.metaLine != nil {
		at, line = cv.metaLine.time, cv.metaLine.n
	}
	// A live session.started is another event than a history one (see
	// internal/claudecode): the latest decides whether the session is live.
	key := "session.started"
	if cv.live {
		key += "/live"
	}
	cv.em.Emit(at, key, "", p, line)
}

// turnID is the current turn's id for an event's envelope, or "" when no
// turn is open.
func (cv *conv) turnID() string {
	if t := cv.turn; t != nil && !t.ended {
		return t.id
	}
	return ""
}

// announce records the open turn's turn.started, once.
func (cv *conv) announce() {
	t := cv.turn
	if t == nil || t.ended || t.announced {
		return
	}
	cv.start()
	t.announced = true
	trigger := "user"
	if cv.s.Kind == importer.KindSubagent {
		trigger = "subagent"
	}
	cv.em.EmitID(t.start, t.start, t.id+"/turn.started", t.id, &events.TurnStarted{
		Prompt: importer.Clip(strings.TrimSpace(t.prompt), promptPreviewRunes), Trigger: trigger,
	}, t.startLine)
}

// message records one message.appended of a user-side item.
func (cv *conv) message(h *heldItem, meta bool, turn string) {
	if len(h.blocks) == 0 {
		cv.skip("response_item/message (no content)")
		return
	}
	cv.em.Emit(h.l.time, h.l.key()+"/message", turn, &events.MessageAppended{
		Role: events.RoleUser, Content: h.blocks, Meta: meta,
	}, h.l.n)
}

// release records the first n held items in order: those written before
// the open turn started belong to no turn (the context Codex injects when
// a session starts or resumes), the others to the turn; prompt, when set,
// is the one a person typed (not meta).
func (cv *conv) release(n int, prompt *heldItem) {
	cv.start()
	n = max(0, min(n, len(cv.held)))
	if n > 0 {
		cv.emitCompaction(false)
	}
	items := cv.held[:n]
	cv.held = append([]*heldItem(nil), cv.held[n:]...)
	for _, h := range items {
		t := cv.turn
		if t != nil && !t.ended && (h.l.n >= t.startLine || h == prompt) {
			cv.announce()
			cv.message(h, h != prompt, t.id)
			if h == prompt {
				t.awaiting = true
			}
			if h.l.time.After(t.last) {
				t.last = h.l.time
			}
			continue
		}
		cv.message(h, h != prompt, "")
	}
}

// releaseAll records every held item.
func (cv *conv) releaseAll() { cv.release(len(cv.held), nil) }

func (cv *conv) responseItem(l *line) {
	it := decode[responseItem](l.payload)
	switch it.Type {
	case "message":
		blocks := contentBlocks(it.Content)
		switch it.Role {
		case "assistant":
			cv.assistant(l, blocks, nil)
		case "user", "developer", "system":
			cv.userItem(l, it.Role, blocks)
		default:
			cv.res.Unknown["response_item/message/"+it.Role]++
		}
	case "agent_message":
		// Another agent's message to this one (collab, 0.146): input the
		// model reads, which no person typed.
		cv.userItem(l, "agent", contentBlocks(it.Content))
	case "reasoning":
		if b, ok := reasoningBlock(&it); ok {
			cv.assistant(l, []events.ContentBlock{b}, nil)
		} else {
			cv.skip("response_item/reasoning (encrypted only)")
		}
	case "function_call", "custom_tool_call", "local_shell_call":
		var in json.RawMessage
		switch it.Type {
		case "function_call":
			in = toolInput(it.Arguments, "arguments")
		case "custom_tool_call":
			in = toolInput(it.Input, "input")
		default:
			in = toolInput(it.Action, "action")
		}
		name := it.Name
		if name == "" {
			name = it.Type
		}
		id := it.callID()
		if id == "" {
			cv.res.Diagnostics = append(cv.res.Diagnostics, importer.Diagnostic{File: cv.s.File, Line: l.n,
				Err: fmt.Errorf("%w: %s without call_id", importer.ErrMalformedRecord, it.Type)})
			return
		}
		c := &call{id: id, name: name, time: l.time, line: l.n}
		cv.assistant(l, []events.ContentBlock{{Type: events.BlockToolUse, ID: id, Name: name, Input: []byte(in)}}, c)
	case "web_search_call", "image_generation_call", "tool_search_call":
		if id := it.callID(); id != "" {
			cv.server[id] = true
		}
		cv.assistant(l, []events.ContentBlock{serverToolBlock(&it)}, nil)
	case "tool_search_output":
		// The provider's search ran with the response: its result is part
		// of the assistant message, as the Messages API's server tool
		// results are.
		if cv.resp == nil {
			cv.skip("response_item/tool_search_output (no response open)")
			return
		}
		cv.assistant(l, []events.ContentBlock{{Type: "tool_search_tool_result", ToolUseID: it.callID(), Content: []byte(it.Tools)}}, nil)
	case "function_call_output", "custom_tool_call_output", "local_shell_call_output", "mcp_tool_call_output":
		if it.CallID == "" {
			cv.res.Diagnostics = append(cv.res.Diagnostics, importer.Diagnostic{File: cv.s.File, Line: l.n,
				Err: fmt.Errorf("%w: %s without call_id", importer.ErrMalformedRecord, it.Type)})
			return
		}
		if cv.resp != nil {
			cv.resp.deferred = append(cv.resp.deferred, l)
			return
		}
		cv.output(l, &it)
	case "ghost_snapshot", "compaction", "compaction_summary", "context_compaction", "additional_tools":
		cv.skip("response_item/" + it.Type)
	default:
		cv.res.Unknown["response_item/"+it.Type]++
	}
}

// userItem holds a user-side message item until what decides it comes.
func (cv *conv) userItem(l *line, role string, blocks []events.ContentBlock) {
	h := &heldItem{l: l, role: role, blocks: blocks}
	cv.held = append(cv.held, h)
	if cv.promptPending && role == "user" {
		cv.promptPending = false
		cv.pair(h, cv.promptText)
	}
}

// userMessage is a user_message event: what a person typed. It names the
// latest user item held (0.77, 0.104 write the item first), or the next
// one (0.146 writes the event first).
func (cv *conv) userMessage(l *line, text string) {
	for i := len(cv.held) - 1; i >= 0; i-- {
		if h := cv.held[i]; h.role == "user" && !h.paired {
			cv.pair(h, text)
			return
		}
	}
	cv.promptPending, cv.promptText = true, text
}

// pair makes h the user message a person typed: the prompt of the task
// waiting for it, a message into the running turn, or (no task events:
// 0.77) the prompt of a new implicit turn.
func (cv *conv) pair(h *heldItem, text string) {
	h.paired, h.pairText = true, text
	if strings.TrimSpace(text) == "" {
		h.pairText = textOf(h.blocks)
	}
	t := cv.turn
	switch {
	case t != nil && !t.ended && t.ending == nil && !t.promptDone:
		t.prompt, t.promptDone = h.pairText, true
		cv.release(cv.heldIndex(h)+1, h)
	case t != nil && !t.ended && t.ending == nil && !t.implicit:
		cv.release(cv.heldIndex(h)+1, h) // a message into the running task
	case cv.taskMode:
		// The task it starts is not open yet: task_started opens it.
	default:
		if t != nil && !t.ended {
			// The items before the prompt end the old turn with it; the
			// prompt and what came after it wait for the new one.
			i := cv.heldIndex(h)
			rest := append([]*heldItem(nil), cv.held[i:]...)
			cv.held = cv.held[:i]
			cv.endImplicit(h.l)
			cv.held = append(cv.held, rest...)
		}
		cv.turn = &turn{id: importer.Token(fmt.Sprintf("implicit-L%d", h.l.n)), start: h.l.time, startLine: h.l.n, last: h.l.time,
			implicit: true, prompt: h.pairText, promptDone: true}
		cv.release(cv.heldIndex(h)+1, h)
	}
}

// heldIndex is h's index in the held items (-1 when it is not held).
func (cv *conv) heldIndex(h *heldItem) int {
	for i, x := range cv.held {
		if x == h {
			return i
		}
	}
	return -1
}

// assistant adds model output (a reasoning, message or call item) to the
// open response, or opens one: a new model response. Before its turn's
// first answer, the turn's context and history stages are recorded as
// completed.
func (cv *conv) assistant(l *line, blocks []events.ContentBlock, c *call) {
	cv.start()
	if cv.resp == nil {
		cv.emitCompaction(true)
		if t := cv.turn; t != nil && !t.ended {
			cv.announce()
		}
		cv.releaseAll()
		r := &response{first: l, turn: cv.turnID()}
		cv.resp = r
		if t := cv.turn; t != nil && !t.ended {
			cv.em.Stages(l.time, t.id, l.n)
			t.responded, t.awaiting, t.lastErr = true, false, nil
		}
		cv.errStreak, cv.errKey = 0, ""
	}
	r := cv.resp
	r.recs = append(r.recs, piece{l: l, blocks: blocks})
	switch {
	case c == nil:
	case cv.calls[c.id] != nil || slices.ContainsFunc(r.calls, func(o *call) bool { return o.id == c.id }):
		// A call_id names one call (started, or in this response): an
		// item repeating one stays in the message the rollout holds but
		// starts no second call.
		cv.skip("tool call (call_id repeated)")
	default:
		if cv.turn != nil && !cv.turn.ended {
			c.turn = cv.turn
		}
		r.calls = append(r.calls, c)
	}
	if t := cv.turn; t != nil && !t.ended && l.time.After(t.last) {
		t.last = l.time
	}
}

// closeResponse records the open response: as a whole when closed (a
// later line ended it), else as a piece (the file ends inside it), in
// either case from the first line the log does not hold as a piece yet
// (importer.Emitter.Pieces); then a tool_call.started for each call and
// the outputs written while it streamed, in file order.
func (cv *conv) closeResponse(closed bool) {
	r := cv.resp
	if r == nil {
		return
	}
	cv.resp = nil
	n := len(r.recs)
	id := func(i, j int, whole bool) string {
		return cv.em.ID(r.recs[i].l.time, importer.PieceKey(r.recs[i].l.key(), r.recs[j].l.key(), whole))
	}
	pieces := cv.em.Pieces(n, closed, id)
	for k, pc := range pieces {
		var blocks []events.ContentBlock
		for _, rec := range r.recs[pc.From : pc.To+1] {
			blocks = append(blocks, rec.blocks...)
		}
		if len(blocks) == 0 {
			continue
		}
		p := &events.MessageAppended{Role: events.RoleAssistant, Content: blocks,
			MessageID: fmt.Sprintf("rollout-L%d", r.first.n), Model: cv.model}
		if closed && k == len(pieces)-1 {
			p.Usage = r.usage
		}
		from := r.recs[pc.From].l
		cv.em.EmitID(r.first.time, from.time, importer.PieceKey(from.key(), r.recs[pc.To].l.key(), pc.Whole), r.turn, p, from.n)
	}
	calls := r.calls
	for _, d := range r.deferred {
		for len(calls) > 0 && calls[0].line < d.n {
			cv.callStarted(calls[0])
			calls = calls[1:]
		}
		it := decode[responseItem](d.payload)
		cv.output(d, &it)
	}
	for _, c := range calls {
		cv.callStarted(c)
	}
}

// callStarted records tool_call.started for a tool_use, which is then
// pending until its output.
func (cv *conv) callStarted(c *call) {
	turn := ""
	if c.turn != nil {
		turn = c.turn.id
	}
	cv.em.Emit(c.time, fmt.Sprintf("L%d/tool_call.started/%s", c.line, c.id), turn, &events.ToolCallStarted{ToolUseID: c.id, Name: c.name}, c.line)
	cv.calls[c.id] = c
	cv.pending = append(cv.pending, c)
}

// output records a tool output: tool_call.completed for its call, then
// the result as a user message of the call's turn (an output may come
// after its turn was aborted). Its error flag comes from the call's *_end
// event, else from the output itself. When it answers its turn's last
// pending call, what waited for it follows: the items Codex injected
// while the call ran, and the turn's end.
func (cv *conv) output(l *line, it *responseItem) {
	cv.start()
	cv.emitCompaction(false)
	o := parseOutput(it.Output)
	isError := o.isError
	if cv.endSeen[it.CallID] {
		isError = cv.ends[it.CallID]
	}
	c := cv.calls[it.CallID]
	turn := cv.turnID()
	if c != nil && c.turn != nil {
		turn = c.turn.id
	}
	if c != nil {
		for i, p := range cv.pending {
			if p == c {
				cv.pending = append(cv.pending[:i:i], cv.pending[i+1:]...)
				dur := l.time.Sub(c.time).Milliseconds()
				cv.em.Emit(l.time, fmt.Sprintf("%s/tool_call.completed/%s", l.key(), c.id), turn, &events.ToolCallCompleted{
					ToolUseID: c.id, Name: c.name, DurationMS: max(0, dur), IsError: isError,
				}, l.n)
				break
			}
		}
	}
	cv.em.Emit(l.time, l.key()+"/message", turn, &events.MessageAppended{
		Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockToolResult, ToolUseID: it.CallID, IsError: isError, Content: []byte(o.content)}},
	}, l.n)
	if c != nil && c.turn != nil {
		c.turn.awaiting = true // the model has not answered the output yet
		if l.time.After(c.turn.last) {
			c.turn.last = l.time
		}
	}
	cv.emitCompaction(false)
	if c != nil && c.turn != nil && !cv.pendingIn(c.turn) {
		if c.turn == cv.turn && !c.turn.ended {
			cv.releaseAll()
		}
		if e := c.turn.ending; e != nil && !c.turn.ended {
			cv.emitEnd(c.turn, e)
		}
	}
}

// pendingIn reports whether turn t has a tool call without its output.
func (cv *conv) pendingIn(t *turn) bool {
	for _, c := range cv.pending {
		if c.turn == t {
			return true
		}
	}
	return false
}

func (cv *conv) event(l *line) {
	ev := decode[eventMsg](l.payload)
	switch ev.Type {
	case "task_started", "turn_started":
		cv.taskStarted(l, ev.TurnID)
	case "task_complete", "turn_complete":
		cv.taskComplete(l, &ev)
	case "turn_aborted":
		cv.turnAborted(l, &ev)
	case "user_message":
		cv.userMessage(l, ev.Message)
	case "token_count":
		cv.tokenCount(l, &ev)
	case "context_compacted":
		cv.compacted(l, "", 0, true)
	case "error":
		cv.errorEvent(l, &ev)
	case "exec_command_end", "patch_apply_end", "mcp_tool_call_end", "web_search_end", "image_generation_end",
		"view_image_tool_call", "dynamic_tool_call_response", "collab_agent_spawn_end", "collab_agent_interaction_end",
		"collab_waiting_end", "collab_close_end", "collab_resume_end":
		if ev.CallID != "" {
			if failed, known := endFailed(&ev); known {
				cv.ends[ev.CallID], cv.endSeen[ev.CallID] = failed, true
			}
		}
		cv.skip("event_msg/" + ev.Type)
	case "agent_message", "agent_reasoning", "agent_reasoning_raw_content", "agent_message_delta", "agent_reasoning_delta":
		cv.skip("event_msg/" + ev.Type + " (a copy)")
	case "thread_rolled_back":
		// Not mapped (see the package documentation): the rewind of the
		// event model is Turnstone's own and names a log sequence.
		cv.skip("event_msg/" + ev.Type)
	case "thread_goal_updated", "entered_review_mode", "exited_review_mode", "sub_agent_activity",
		"item_completed", "guardian_assessment", "dynamic_tool_call_request", "warning", "thread_settings_applied",
		"thread_name_updated", "undo_completed", "undo_started", "plan_update", "turn_diff", "stream_error",
		"session_configured", "background_event", "mcp_tool_call_begin", "exec_command_begin", "patch_apply_begin",
		"web_search_begin", "image_generation_begin", "model_reroute", "deprecation_notice", "shutdown_complete":
		cv.skip("event_msg/" + ev.Type)
	default:
		cv.res.Unknown["event_msg/"+ev.Type]++
	}
}

// taskStarted opens a turn (turn = the task's turn_id). A turn still open
// ends first: with its recorded end if it only waited for outputs (its
// pending calls become orphans), failed if a model error ended it, else
// abandoned: a person started new work over it.
//
// A task_started naming the open turn again starts nothing (skipped). A
// turn_id that an ended turn already had is made the new turn's own with
// its line (turn id "<turn_id>-L<line>"): the events of a turn take their
// ids from its turn id, and two turns of one id would give two events one
// id (found by FuzzConvert).
func (cv *conv) taskStarted(l *line, id string) {
	if id == "" {
		id = l.key()
	}
	tid := importer.Token(id)
	if t := cv.turn; t != nil && !t.ended && t.taskID == tid {
		cv.skip("event_msg/task_started (its turn is already open)")
		return
	}
	if cv.turnIDs[tid] {
		tid = importer.Token(id + "." + l.key())
	}
	cv.start()
	cv.closeResponse(true)
	if t := cv.turn; t != nil && !t.ended {
		switch {
		case t.ending != nil:
			cv.emitEnd(t, t.ending)
		case t.lastErr != nil:
			cv.emitEnd(t, &turnEnd{payload: &events.TurnFailed{Stage: events.StageExecute, Error: *t.lastErr}, at: l.time, line: l.n})
		default:
			cv.emitEnd(t, &turnEnd{payload: cv.abandoned(t, "a new task started before this turn ended"), at: l.time, line: l.n})
		}
	}
	cv.emitCompaction(true)
	// The held items: context Codex injected before the task (its prompt,
	// when a user_message named it already, opens it).
	var prompt *heldItem
	for i, h := range cv.held {
		if h.paired {
			prompt = h
			cv.held = append(cv.held[:i:i], cv.held[i+1:]...)
			break
		}
	}
	cv.releaseAll()
	cv.turnIDs[tid] = true
	cv.turn = &turn{id: tid, taskID: importer.Token(id), start: l.time, startLine: l.n, last: l.time}
	cv.taskMode = true
	if prompt != nil {
		cv.turn.prompt, cv.turn.promptDone = prompt.pairText, true
		cv.held = append([]*heldItem{prompt}, cv.held...)
		cv.release(1, prompt)
	}
}

// abandoned is turn.abandoned for t, in the stage it was in.
func (cv *conv) abandoned(t *turn, reason string) *events.TurnAbandoned {
	p := &events.TurnAbandoned{Reason: reason, Stage: events.StageContext}
	if t.responded {
		p.LastStageCompleted, p.Stage = events.StageHistory, events.StageExecute
	}
	return p
}

// endOpen returns the open turn an end event of turn_id ends, or nil
// (another turn's, or one already ended: counted as skipped).
func (cv *conv) endOpen(l *line, turnID, what string) *turn {
	t := cv.turn
	if t == nil || t.ended || t.ending != nil || turnID != "" && importer.Token(turnID) != t.taskID {
		cv.skip(what + " (no open turn)")
		return nil
	}
	return t
}

// taskComplete completes the open turn, or fails it when it carries an
// error (0.146) or a model error was its last word.
func (cv *conv) taskComplete(l *line, ev *eventMsg) {
	t := cv.endOpen(l, ev.TurnID, "event_msg/"+ev.Type)
	if t == nil {
		return
	}
	cv.closeResponse(true)
	var errInfo *events.ErrorInfo
	var e struct {
		Message        string          `json:"message"`
		CodexErrorInfo json.RawMessage `json:"codex_error_info"`
	}
	if len(ev.Error) > 0 && json.Unmarshal(ev.Error, &e) == nil && (e.Message != "" || len(e.CodexErrorInfo) > 0) {
		info := codexError(e.Message, e.CodexErrorInfo, cv.meta.ModelProvider)
		errInfo = &info
	} else if t.lastErr != nil {
		errInfo = t.lastErr
	}
	if errInfo != nil {
		cv.endTurn(t, &turnEnd{payload: &events.TurnFailed{Stage: events.StageExecute, Error: *errInfo}, at: l.time, line: l.n})
		return
	}
	cv.endTurn(t, &turnEnd{payload: &events.TurnCompleted{Reason: "end_turn", DurationMS: durationOf(ev)}, at: l.time, line: l.n})
}

// turnAborted ends the open turn with the abort's reason (interrupted,
// replaced, review_ended, budget_limited).
func (cv *conv) turnAborted(l *line, ev *eventMsg) {
	t := cv.endOpen(l, ev.TurnID, "event_msg/turn_aborted")
	if t == nil {
		return
	}
	cv.closeResponse(true)
	reason := ev.Reason
	if reason == "" {
		reason = "interrupted"
	}
	cv.endTurn(t, &turnEnd{payload: &events.TurnCompleted{Reason: importer.Clip(reason, 100), DurationMS: durationOf(ev)}, at: l.time, line: l.n})
}

// durationOf is an end event's duration_ms when it gives one (0.146).
func durationOf(ev *eventMsg) int64 {
	if ev.DurationMS != nil && *ev.DurationMS > 0 {
		return *ev.DurationMS
	}
	return 0
}

// endTurn ends t, or, while a tool call of t has no output, keeps the end
// until it has: Codex writes an output after its turn was aborted, and
// the output answers the call.
func (cv *conv) endTurn(t *turn, e *turnEnd) {
	cv.announce()
	if cv.pendingIn(t) {
		t.ending = e
		return
	}
	cv.emitEnd(t, e)
}

// emitEnd records t's end: the held items and a waiting compaction first.
// Its id is the turn's own ("<turn>/end" at the turn's start), so the end
// is one event whenever it is converted.
func (cv *conv) emitEnd(t *turn, e *turnEnd) {
	if t == cv.turn {
		cv.emitCompaction(true)
		cv.releaseAll()
	}
	cv.announce()
	at := e.at
	if t.last.After(at) {
		at = t.last
	}
	if c, ok := e.payload.(*events.TurnCompleted); ok && c.DurationMS == 0 {
		c.DurationMS = max(0, at.Sub(t.start).Milliseconds())
	}
	cv.em.EmitID(at, t.start, t.id+"/end", t.id, e.payload, e.line)
	t.ended, t.ending = true, nil
}

// endImplicit ends an implicit turn (0.77) when the next prompt comes:
// completed, or abandoned when a tool call of it has no output.
func (cv *conv) endImplicit(l *line) {
	t := cv.turn
	cv.closeResponse(true)
	if t.ending != nil {
		cv.emitEnd(t, t.ending)
		return
	}
	if cv.pendingIn(t) {
		cv.emitEnd(t, &turnEnd{payload: cv.abandoned(t, "a new prompt came before its tool calls were answered"), at: l.time, line: l.n})
		return
	}
	if t.lastErr != nil {
		cv.emitEnd(t, &turnEnd{payload: &events.TurnFailed{Stage: events.StageExecute, Error: *t.lastErr}, at: t.last, line: l.n})
		return
	}
	cv.emitEnd(t, &turnEnd{payload: &events.TurnCompleted{Reason: "end_turn"}, at: t.last, line: l.n})
}

// tokenCount reads a token_count: one model call ended when the total
// grew (Codex repeats the latest count); its last_token_usage is the
// usage of the response it ends, with OpenAI's input (which includes the
// cached tokens) split into input and cache read.
func (cv *conv) tokenCount(l *line, ev *eventMsg) {
	if ev.Info == nil {
		cv.skip("event_msg/token_count (no usage)")
		return
	}
	if ev.Info.Total.TotalTokens <= cv.lastTotal {
		cv.skip("event_msg/token_count (repeated)")
		return
	}
	cv.lastTotal = ev.Info.Total.TotalTokens
	u := ev.Info.Last
	cv.lastCall = &u
	cv.skip("event_msg/token_count")
	if cv.resp == nil {
		return
	}
	nonNeg := func(n int64) int64 { return max(0, n) }
	usage := &events.Usage{
		InputTokens:     nonNeg(u.InputTokens - u.CachedInputTokens),
		OutputTokens:    nonNeg(u.OutputTokens),
		CacheReadTokens: nonNeg(min(u.CachedInputTokens, u.InputTokens)),
		ReasoningTokens: nonNeg(u.ReasoningOutputTokens),
	}
	if *usage != (events.Usage{}) {
		cv.resp.usage = usage
	}
	cv.closeResponse(true)
}

// errorEvent records an error event (a model call that failed for good,
// or another failure Codex reports) as error.recorded; unless a response
// follows, it is the turn's outcome.
func (cv *conv) errorEvent(l *line, ev *eventMsg) {
	cv.start()
	cv.closeResponse(true)
	cv.emitCompaction(false)
	info := codexError(ev.Message, ev.CodexErrorInfo, cv.meta.ModelProvider)
	key := fmt.Sprint(info.HTTPStatus)
	if info.HTTPStatus == 0 {
		key = "code:" + info.Code
	}
	if cv.errStreak > 0 && key == cv.errKey {
		cv.errStreak++
	} else {
		cv.errStreak, cv.errKey = 1, key
	}
	turn := ""
	if t := cv.turn; t != nil && !t.ended {
		cv.announce()
		cv.em.Stages(l.time, t.id, l.n)
		turn = t.id
		if info.Code != "thread_rollback_failed" {
			t.lastErr = &info
		}
	}
	cv.em.Emit(l.time, l.key()+"/error.recorded", turn, &events.ErrorRecorded{
		ErrorInfo: info, Consecutive: cv.errStreak, Stage: events.StageExecute,
	}, l.n)
}

// compacted notes a compaction: a compacted line and the
// context_compacted event after it are one.
func (cv *conv) compacted(l *line, summary string, replaced int, isEvent bool) {
	cv.start()
	cv.closeResponse(true)
	if p := cv.compaction; p != nil && (isEvent && !p.event || !isEvent && !p.compact) {
		if isEvent {
			p.event = true
		} else {
			p.compact, p.summary, p.replaced = true, summary, replaced
		}
		cv.skip("compaction (its other record)")
		return
	}
	cv.emitCompaction(true)
	p := &compaction{l: l, summary: summary, replaced: replaced, total: cv.lastTotal, event: isEvent, compact: !isEvent}
	if cv.lastCall != nil {
		p.before = cv.lastCall.TotalTokens
	}
	if t := cv.turn; t != nil && !t.ended {
		p.turn = t
	}
	cv.compaction = p
}

// emitCompaction records the waiting compaction as a distillation of the
// turn it happened in (distillation.requested, .started and .completed,
// then what replaced the history as a meta user message) before the next
// event of the history, once no tool call is pending (Codex writes the
// outputs of calls that ran through a compaction after it), or when force
// (the next model response, or the turn's end, judge those calls anyway). tokens_before is the context of the model call before it (its
// total tokens); tokens_after the input of the first model call after it,
// when the file holds it.
func (cv *conv) emitCompaction(force bool) {
	p := cv.compaction
	if p == nil || !force && len(cv.pending) > 0 {
		return
	}
	cv.compaction = nil
	turn := ""
	if p.turn != nil && !p.turn.ended {
		turn = p.turn.id
	}
	after := int64(0)
	seen := false
	for _, l := range cv.lines {
		if l.n <= p.l.n {
			continue
		}
		if l.typ == typeCompacted && seen {
			break
		}
		seen = true
		if l.typ == typeEvent && l.kind == "token_count" {
			ev := decode[eventMsg](l.payload)
			if ev.Info != nil && ev.Info.Total.TotalTokens > p.total {
				after = ev.Info.Last.InputTokens
				break
			}
		}
	}
	k := p.l.key()
	cv.em.Emit(p.l.time, k+"/distillation.requested", turn, &events.DistillationRequested{Reason: "context_compacted"}, p.l.n)
	cv.em.Emit(p.l.time, k+"/distillation.started", turn, &events.DistillationStarted{}, p.l.n)
	cv.em.Emit(p.l.time, k+"/distillation.completed", turn, &events.DistillationCompleted{
		TokensBefore: max(0, p.before), TokensAfter: max(0, after), Summary: importer.Clip(p.summary, 2000),
	}, p.l.n)
	text, synthetic := p.summary, false
	if strings.TrimSpace(text) == "" {
		synthetic = true
		text = "Codex compacted the conversation"
		if p.replaced > 0 {
			text += fmt.Sprintf(": %d items replaced the history", p.replaced)
		}
		text += "."
	}
	cv.em.Emit(p.l.time, k+"/summary", turn, &events.MessageAppended{
		Role: events.RoleUser, Content: []events.ContentBlock{{Type: events.BlockText, Text: text}}, Meta: true, Synthetic: synthetic,
	}, p.l.n)
}

// finish converts what the end of the lines decides. A response still
// open is recorded as far as it goes (a piece: the grown file continues
// it), with the outputs written while it streamed: the file never holds
// back a call it has written. What the next lines decide waits: items not
// yet known to be a prompt or context, a turn whose prompt is not written
// yet. A history import also records a compaction the file ends with
// (unless a call that ran through it has no output yet), and ends an
// implicit turn (0.77) whose model answered last, as it ends a turn that a
// model error ended. A turn of a task without its end stays in flight.
func (cv *conv) finish() {
	cv.closeResponse(false)
	cv.start()
	if cv.live {
		return
	}
	cv.emitCompaction(false)
	t := cv.turn
	if t == nil || t.ended || t.ending != nil || cv.pendingIn(t) {
		return
	}
	switch {
	case t.lastErr != nil:
		cv.emitEnd(t, &turnEnd{payload: &events.TurnFailed{Stage: events.StageExecute, Error: *t.lastErr}, at: t.last})
	case t.implicit && t.responded && !t.awaiting:
		cv.emitEnd(t, &turnEnd{payload: &events.TurnCompleted{Reason: "end_turn"}, at: t.last})
	}
}
