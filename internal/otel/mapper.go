package otel

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// MapConfig configures how sessions map to spans, for the live export
// and the backfill alike (the same log must give the same spans).
type MapConfig struct {
	// CaptureContent records the messages' text in gen_ai.input.messages
	// and gen_ai.output.messages (and tools' arguments and results):
	// the masked text the log stores, never more. Off by default, as the
	// conventions ask; OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT
	// turns it on (ConfigFromEnv).
	CaptureContent bool
	// MaxContentBytes bounds each captured text. Default
	// DefaultMaxContentBytes.
	MaxContentBytes int
}

func (c *MapConfig) setDefaults() {
	if c.MaxContentBytes <= 0 {
		c.MaxContentBytes = DefaultMaxContentBytes
	}
}

// Bounds of a session mapper's memory (a session that breaks them is
// mapped as far as they allow: a turn or a tool past them gets no span).
const (
	maxOpenTools   = 256
	maxOpenCmds    = 16
	keepClosedRefs = 256
)

// mapper holds what the sessions' mappers share: the tracer whose
// provider takes the spans (its IDGenerator is idGenerator), the
// configuration and the resolver of sidechain links.
type mapper struct {
	tracer trace.Tracer
	cfg    MapConfig
	res    *resolver
}

// spanData is a span being built: everything but its end.
type spanData struct {
	name   string
	kind   trace.SpanKind
	ref    spanRef
	parent trace.SpanID // invalid: a root span
	start  time.Time
	attrs  []attribute.KeyValue
	events []spanEvent
	err    bool
	desc   string
}

type spanEvent struct {
	name  string
	at    time.Time
	attrs []attribute.KeyValue
}

func (d *spanData) fail(errType, desc string) {
	d.err = true
	d.desc = desc
	d.attrs = append(d.attrs, KeyErrorType.String(errType))
}

// refs remembers the spans of ended turns and tools by key, the latest
// keepClosedRefs: an anomaly about one of them becomes a span under it.
type refs struct {
	m     map[string]spanRef
	order []string
}

func (r *refs) put(k string, ref spanRef) {
	if r.m == nil {
		r.m = map[string]spanRef{}
	}
	if _, ok := r.m[k]; !ok {
		r.order = append(r.order, k)
		if len(r.order) > keepClosedRefs {
			delete(r.m, r.order[0])
			r.order = r.order[1:]
		}
	}
	r.m[k] = ref
}

func (r *refs) get(k string) (spanRef, bool) {
	ref, ok := r.m[k]
	return ref, ok
}

type openTurn struct {
	d      spanData
	output []msgPart // capture: the turn's last response
}

type openTool struct {
	d           spanData
	turn        string
	useAt       time.Time
	completedAt time.Time
	callErr     bool
	args        []byte
}

type openChat struct {
	d         spanData
	messageID string
	turn      string
	end       time.Time
	model     string
	stop      string
	usage     *events.Usage
	output    []msgPart
	input     []chatMessage
}

type openCmd struct {
	d        spanData
	kind     string
	attempts int
}

// sessionMapper maps one session's steps to spans: it keeps the spans
// still open (turns in flight, tools running, the response being
// written, recovery commands under way) and ends each when the log says
// it ended. A session's mapper is fed its steps in order; it is not safe
// for concurrent use.
type sessionMapper struct {
	m               *mapper
	tenant, session string
	conv            string
	// silent: the steps rebuild the open spans of events exported
	// before (a restore), and no span is emitted.
	silent bool
	// pseudo: a session of Turnstone's own (a token starting with "_"):
	// no spans.
	pseudo bool

	kind          string
	parentSession string
	parentTool    string
	link          *link

	turns       map[string]*openTurn
	closedTurns refs
	tools       map[string]*openTool // by projections.IDKey(tool_use id)
	closedTools refs
	chat        *openChat
	input       []msgPart // capture: the user records since the last response
	lastTime    time.Time
	cmds        map[string]*openCmd
	repairs     []projections.Violation
}

func (m *mapper) newSession(tenant, session string) *sessionMapper {
	m.cfg.setDefaults()
	return &sessionMapper{m: m, tenant: tenant, session: session, conv: tenant + "/" + session,
		pseudo: strings.HasPrefix(session, "_"), turns: map[string]*openTurn{}, tools: map[string]*openTool{}, cmds: map[string]*openCmd{}}
}

// step maps one step of the session's replay. Errors: only the log's,
// when a sidechain's parent is read.
func (sm *sessionMapper) step(ctx context.Context, st projections.Step) error {
	if sm.pseudo {
		return nil
	}
	ev := st.Event
	s := st.State
	if ev.Err == nil {
		if err := sm.event(ctx, ev, s); err != nil {
			return err
		}
	}
	for _, v := range st.Anomalies {
		sm.anomaly(ctx, ev, s, v)
	}
	if ev.Err == nil {
		sm.ends(ctx, ev, s)
	}
	for _, v := range st.Resolved {
		if v.ToolUseID != "" {
			sm.repairs = append(sm.repairs, v)
		}
	}
	if len(sm.repairs) > maxOpenTools {
		sm.repairs = sm.repairs[len(sm.repairs)-maxOpenTools:]
	}
	if !ev.Time.IsZero() {
		sm.lastTime = ev.Time
	}
	return nil
}

// event handles what ev opens or continues; ends handles what it ends,
// after the anomalies it gave rise to were placed (a turn's end judges its
// pending tools: their spans end, with their anomaly, before the turn's).
func (sm *sessionMapper) event(ctx context.Context, ev events.Event, s *projections.Session) error {
	p, err := ev.Payload()
	if err != nil {
		return nil // an unknown type: nothing to map
	}
	if sm.chat != nil && !sm.continuesChat(ev, p) && closesChat(ev.Type) {
		sm.endChat(ctx, s)
	}
	switch p := p.(type) {
	case *events.SessionStarted:
		if p.Kind != "" {
			sm.kind = p.Kind
		}
		if p.ParentSession != "" && (p.ParentSession != sm.parentSession || p.ParentToolUseID != sm.parentTool) {
			sm.parentSession, sm.parentTool, sm.link = p.ParentSession, p.ParentToolUseID, nil
		}
	case *events.TurnStarted:
		return sm.startTurn(ctx, ev, p, s)
	case *events.TurnStageCompleted:
		sm.turnEvent(ev.Turn, spanEvent{name: EventStage, at: ev.Time, attrs: []attribute.KeyValue{
			KeyStage.String(string(p.Stage)), KeyDurationMS.Int64(p.DurationMS)}})
	case *events.MessageAppended:
		sm.message(ctx, ev, p, s)
	case *events.ToolCallStarted:
		if t := sm.tools[projections.IDKey(p.ToolUseID)]; t != nil && !ev.Time.Before(t.useAt) {
			t.d.start = ev.Time
		}
	case *events.ToolCallCompleted:
		if t := sm.tools[projections.IDKey(p.ToolUseID)]; t != nil {
			t.completedAt = ev.Time
			t.callErr = t.callErr || p.IsError
			if p.DurationMS > 0 {
				t.d.attrs = append(t.d.attrs, KeyDurationMS.Int64(p.DurationMS))
			}
		}
	case *events.ErrorRecorded:
		sm.errorRecorded(ctx, ev, p, s)
	case *events.RecoveryAttempted:
		c := sm.command(ctx, ev, p.CommandID, p.Kind, s, time.Duration(p.DurationMS)*time.Millisecond)
		if c == nil {
			break
		}
		c.attempts = max(c.attempts, p.Attempt)
		attrs := []attribute.KeyValue{KeyAttempt.Int(p.Attempt), KeyStrategy.String(p.Strategy), KeyResult.String(string(p.Result))}
		if p.Class != "" {
			attrs = append(attrs, KeyClass.String(p.Class))
		}
		if p.Error != nil {
			attrs = append(attrs, KeyExceptionMessage.String(p.Error.Message))
		}
		c.d.events = append(c.d.events, spanEvent{name: EventAttempt, at: ev.Time, attrs: attrs})
	case *events.SessionPaused:
		sm.sessionEvent(ev, KeyReason.String(p.Reason))
	case *events.SessionResumed:
		sm.sessionEvent(ev, KeyReason.String(p.Reason))
	case *events.SessionRewound:
		sm.sessionEvent(ev, KeyReason.String(p.Reason))
	case *events.SessionForked:
		sm.sessionEvent(ev, attribute.String("turnstone.fork_session", p.ForkSession))
	case *events.DistillationRequested:
		sm.sessionEvent(ev, KeyReason.String(p.Reason))
	case *events.DistillationStarted:
		sm.sessionEvent(ev)
	case *events.DistillationCompleted:
		sm.sessionEvent(ev, KeyTokensBefore.Int64(p.TokensBefore), KeyTokensAfter.Int64(p.TokensAfter))
	case *events.DistillationSkipped:
		sm.sessionEvent(ev, KeyReason.String(p.Reason))
	}
	return nil
}

// closesChat reports whether an event of type t ends the response being
// written when it does not continue it: a message, a turn's end, a
// change of the history. Other events (tool calls, stages, recovery)
// may fall between two records of one response.
func closesChat(t events.Type) bool {
	switch t {
	case events.TypeMessageAppended, events.TypeTurnCompleted, events.TypeTurnFailed, events.TypeTurnAbandoned,
		events.TypeTurnStarted, events.TypeDistillationStarted, events.TypeDistillationCompleted, events.TypeSessionRewound:
		return true
	}
	return false
}

// continuesChat reports whether ev is another record of the response
// being written: an assistant record with its message id (both empty
// counts: the projection merges consecutive records of one role).
func (sm *sessionMapper) continuesChat(ev events.Event, p events.Payload) bool {
	m, ok := p.(*events.MessageAppended)
	return ok && m.Role == events.RoleAssistant && m.MessageID == sm.chat.messageID
}

// ends handles what ev ends: the turns.
func (sm *sessionMapper) ends(ctx context.Context, ev events.Event, s *projections.Session) {
	switch ev.Type {
	case events.TypeTurnCompleted, events.TypeTurnFailed, events.TypeTurnAbandoned:
	case events.TypeRecoveryCompleted, events.TypeRecoveryParked:
		sm.endCommand(ctx, ev, s)
		return
	default:
		return
	}
	t := sm.turns[ev.Turn]
	if t == nil {
		return
	}
	// Tools of the turn the fold did not judge (past its bounds) end
	// with it, unanswered.
	for k, tool := range sm.tools {
		if tool.turn == ev.Turn {
			tool.d.attrs = append(tool.d.attrs, KeyToolStatus.String("unanswered"))
			sm.endTool(ctx, k, tool, ev.Time)
		}
	}
	p, err := ev.Payload()
	if err != nil {
		return
	}
	switch p := p.(type) {
	case *events.TurnCompleted:
		reason := p.Reason
		if reason == "" {
			reason = "end_turn"
		}
		t.d.attrs = append(t.d.attrs, KeyTurnStatus.String(string(projections.TurnCompleted)), KeyTurnReason.String(reason))
		if p.DurationMS > 0 {
			t.d.attrs = append(t.d.attrs, KeyDurationMS.Int64(p.DurationMS))
		}
	case *events.TurnFailed:
		t.d.attrs = append(t.d.attrs, KeyTurnStatus.String(string(projections.TurnFailed)), KeyTurnStage.String(string(p.Stage)))
		t.d.fail(errorType(&p.Error, ErrTurnFailed), p.Error.Message)
	case *events.TurnAbandoned:
		t.d.attrs = append(t.d.attrs, KeyTurnStatus.String(string(projections.TurnAbandoned)), KeyTurnReason.String(p.Reason))
		if st := p.InStage(); st != "" {
			t.d.attrs = append(t.d.attrs, KeyTurnStage.String(string(st)))
		}
		t.d.fail(ErrTurnAbandoned, p.Reason)
	}
	if sm.m.cfg.CaptureContent && len(t.output) > 0 {
		t.d.attrs = append(t.d.attrs, KeyOutputMessages.String(messagesJSON([]chatMessage{{Role: "assistant", Parts: t.output}})))
	}
	sm.emit(ctx, &t.d, ev.Time)
	sm.closedTurns.put(ev.Turn, t.d.ref)
	delete(sm.turns, ev.Turn)
}

// errorType is the error.type of an error: the provider's code, else its
// HTTP status, else fallback.
func errorType(e *events.ErrorInfo, fallback string) string {
	switch {
	case e.Code != "":
		return e.Code
	case e.HTTPStatus != 0:
		return strconv.Itoa(e.HTTPStatus)
	}
	return fallback
}

// base returns the attributes every span carries: the operation, the
// provider, the conversation (the session), the session the backends
// group by (the root of a sidechain chain) and the OpenInference kind.
func (sm *sessionMapper) base(op, oiKind string, s *projections.Session) []attribute.KeyValue {
	root := sm.conv
	if sm.link != nil && sm.link.root != "" {
		root = sm.tenant + "/" + sm.link.root
	} else if sm.parentSession != "" {
		root = sm.tenant + "/" + sm.parentSession
	}
	attrs := make([]attribute.KeyValue, 0, 16)
	attrs = append(attrs,
		KeyOperationName.String(op),
		KeyProviderName.String(ProviderName(s.Provider, s.Model)),
		KeyConversationID.String(sm.conv),
		KeySessionID.String(root),
		KeyOpenInferenceKind.String(oiKind),
		KeyTenant.String(sm.tenant),
		KeySession.String(sm.session),
	)
	return attrs
}

// resolveLink finds, once, where a sidechain's turns nest.
func (sm *sessionMapper) resolveLink(ctx context.Context) error {
	if sm.link != nil || sm.parentSession == "" || sm.m.res == nil {
		return nil
	}
	l, err := sm.m.res.resolve(ctx, sm.tenant, sm.parentSession, sm.parentTool, 0)
	if err != nil {
		return fmt.Errorf("sidechain %s of %s: %w", sm.conv, sm.parentSession, err)
	}
	sm.link = &l
	return nil
}

// agent returns the agent's name and version: the runtime's
// ("claude-code 2.1.39"), a subagent's type for a subagent.
func agent(s *projections.Session) (name, version string) {
	name, version, _ = strings.Cut(s.Runtime, " ")
	if t := s.Labels["subagent_type"]; t != "" && s.Kind == "subagent" {
		name = t
	}
	return name, version
}

func (sm *sessionMapper) startTurn(ctx context.Context, ev events.Event, p *events.TurnStarted, s *projections.Session) error {
	if _, open := sm.turns[ev.Turn]; open || ev.Turn == "" || len(sm.turns) >= projections.MaxInFlightTurns {
		return nil // the fold flags it (turn_duplicate_start, too_many_turns_in_flight)
	}
	if err := sm.resolveLink(ctx); err != nil {
		return err
	}
	ref := spanRef{Trace: turnTraceID(sm.tenant, sm.session, ev.ID), Span: turnSpanID(sm.tenant, sm.session, ev.ID)}
	var parent trace.SpanID
	if sm.link != nil && sm.link.tool.valid() {
		ref.Trace, parent = sm.link.tool.Trace, sm.link.tool.Span
	}
	name, version := agent(s)
	d := spanData{name: "invoke_agent", kind: trace.SpanKindInternal, ref: ref, parent: parent, start: ev.Time,
		attrs: sm.base(OpInvokeAgent, KindAgent, s)}
	if name != "" {
		d.name += " " + name
		d.attrs = append(d.attrs, KeyAgentName.String(name))
	}
	if version != "" {
		d.attrs = append(d.attrs, KeyAgentVersion.String(version))
	}
	if s.Model != "" {
		d.attrs = append(d.attrs, KeyRequestModel.String(s.Model))
	}
	d.attrs = append(d.attrs, KeyTurnID.String(ev.Turn), KeyEventID.String(ev.ID))
	if t := s.Turn(ev.Turn); t != nil {
		d.attrs = append(d.attrs, KeyTurnIndex.Int(t.Index))
	}
	if p.Trigger != "" {
		d.attrs = append(d.attrs, KeyTurnTrigger.String(p.Trigger))
	}
	if sm.kind != "" {
		d.attrs = append(d.attrs, KeySessionKind.String(sm.kind))
	}
	if sm.parentSession != "" {
		d.attrs = append(d.attrs, KeyParentSession.String(sm.parentSession))
	}
	if sm.m.cfg.CaptureContent && p.Prompt != "" {
		d.attrs = append(d.attrs, KeyInputMessages.String(messagesJSON([]chatMessage{{Role: "user",
			Parts: []msgPart{{Type: "text", Content: clipText(p.Prompt, sm.m.cfg.MaxContentBytes)}}}})))
	}
	sm.turns[ev.Turn] = &openTurn{d: d}
	return nil
}

// turnEvent adds e to the span of the turn in flight id, if any.
func (sm *sessionMapper) turnEvent(id string, e spanEvent) bool {
	if t := sm.turns[id]; t != nil {
		t.d.events = append(t.d.events, e)
		return true
	}
	return false
}

// sessionEvent records ev on the span of its turn, or of the latest turn
// in flight (a change of the session a turn lives through).
func (sm *sessionMapper) sessionEvent(ev events.Event, attrs ...attribute.KeyValue) {
	e := spanEvent{name: "turnstone." + string(ev.Type), at: ev.Time, attrs: attrs}
	if sm.turnEvent(ev.Turn, e) {
		return
	}
	if t := sm.latestOpen(); t != nil {
		t.d.events = append(t.d.events, e)
	}
}

// latestOpen is the span of the turn in flight that started last.
func (sm *sessionMapper) latestOpen() *openTurn {
	var latest *openTurn
	for _, t := range sm.turns {
		if latest == nil || t.d.start.After(latest.d.start) {
			latest = t
		}
	}
	return latest
}

// under returns where a span that starts at ev nests: under the span of
// ev's turn (in flight or ended), else at the root of a trace of its own.
func (sm *sessionMapper) under(ev events.Event) (tr trace.TraceID, parent trace.SpanID) {
	if t := sm.turns[ev.Turn]; t != nil && ev.Turn != "" {
		return t.d.ref.Trace, t.d.ref.Span
	}
	if ref, ok := sm.closedTurns.get(ev.Turn); ok && ev.Turn != "" {
		return ref.Trace, ref.Span
	}
	return ownTraceID(sm.tenant, sm.session, ev.ID), trace.SpanID{}
}

func (sm *sessionMapper) message(ctx context.Context, ev events.Event, p *events.MessageAppended, s *projections.Session) {
	capture := sm.m.cfg.CaptureContent
	max := sm.m.cfg.MaxContentBytes
	if p.Role == events.RoleUser {
		for i := range p.Content {
			b := &p.Content[i]
			if b.Type != events.BlockToolResult {
				continue
			}
			k := projections.IDKey(b.ToolUseID)
			t := sm.tools[k]
			if t == nil {
				continue // not pending: the fold says why (unmatched, late, a repair)
			}
			if b.IsError || t.callErr {
				t.d.fail(ErrToolError, "")
			}
			t.d.attrs = append(t.d.attrs, KeyToolStatus.String(string(projections.ToolAnswered)))
			if capture {
				if len(t.args) > 0 {
					t.d.attrs = append(t.d.attrs, KeyToolCallArguments.String(string(rawOrString(t.args, max))))
				}
				t.d.attrs = append(t.d.attrs, KeyToolCallResult.String(clipText(resultText(b.Content), max)))
			}
			end := ev.Time
			if !t.completedAt.IsZero() && t.completedAt.Before(end) {
				end = t.completedAt
			}
			sm.endTool(ctx, k, t, end)
		}
		if capture && len(sm.input) < maxParts {
			sm.input = append(sm.input, parts(p.Content, max)...)
			if len(sm.input) > maxParts {
				sm.input = sm.input[:maxParts]
			}
		}
		return
	}
	if p.Role != events.RoleAssistant {
		return
	}
	if sm.chat == nil {
		tr, parent := sm.under(ev)
		start := sm.callStart(ev)
		sm.chat = &openChat{messageID: p.MessageID, turn: ev.Turn, d: spanData{kind: trace.SpanKindClient,
			ref: spanRef{Trace: tr, Span: chatSpanID(sm.tenant, sm.session, ev.ID)}, parent: parent, start: start,
			attrs: append(sm.base(OpChat, KindLLM, s), KeyEventID.String(ev.ID))}}
		if capture && len(sm.input) > 0 {
			sm.chat.input = []chatMessage{{Role: "user", Parts: sm.input}}
		}
		sm.input = nil
	}
	c := sm.chat
	c.end = ev.Time
	if p.Usage != nil {
		c.usage = p.Usage // the last usage of the response counts (docs/events.md)
	}
	if p.Model != "" {
		c.model = p.Model
	}
	if p.StopReason != "" {
		c.stop = p.StopReason
	}
	if capture && len(c.output) < maxParts {
		c.output = append(c.output, parts(p.Content, max)...)
	}
	for i := range p.Content {
		b := &p.Content[i]
		if b.Type == events.BlockToolUse && b.ID != "" {
			sm.startTool(ev, b, s)
		}
	}
}

// callStart is when the model call that ev answers began: the time of
// the session's event before it (the call's input was complete), within
// ev's turn and not after ev.
func (sm *sessionMapper) callStart(ev events.Event) time.Time {
	start := sm.lastTime
	if start.IsZero() || start.After(ev.Time) {
		start = ev.Time
	}
	if t := sm.turns[ev.Turn]; t != nil && start.Before(t.d.start) {
		start = t.d.start
	}
	return start
}

func (sm *sessionMapper) startTool(ev events.Event, b *events.ContentBlock, s *projections.Session) {
	k := projections.IDKey(b.ID)
	if _, open := sm.tools[k]; open || len(sm.tools) >= maxOpenTools {
		return // a duplicate tool_use (the fold flags it), or past the bound
	}
	tr, parent := sm.under(ev)
	name := b.Name
	if name == "" {
		name = "unknown"
	}
	t := &openTool{turn: ev.Turn, useAt: ev.Time, d: spanData{name: "execute_tool " + name, kind: trace.SpanKindInternal,
		ref: spanRef{Trace: tr, Span: toolSpanID(sm.tenant, sm.session, ev.ID, b.ID)}, parent: parent, start: ev.Time,
		attrs: append(sm.base(OpExecuteTool, KindTool, s),
			KeyToolName.String(name), KeyToolCallID.String(b.ID), KeyToolType.String("function"), KeyEventID.String(ev.ID))}}
	if sm.m.cfg.CaptureContent {
		t.args = b.Input
	}
	sm.tools[k] = t
}

// endTool emits a tool's span, ending at end.
func (sm *sessionMapper) endTool(ctx context.Context, k string, t *openTool, end time.Time) {
	sm.emit(ctx, &t.d, end)
	sm.closedTools.put(k, t.d.ref)
	delete(sm.tools, k)
}

// endChat emits the response being written as a chat span, when it has
// usage (a model call the runtime accounted for).
func (sm *sessionMapper) endChat(ctx context.Context, s *projections.Session) {
	c := sm.chat
	sm.chat = nil
	if t := sm.turns[c.turn]; t != nil && sm.m.cfg.CaptureContent && len(c.output) > 0 {
		t.output = c.output
	}
	if c.usage == nil {
		return
	}
	model := c.model
	if model == "" {
		model = s.Model
	}
	c.d.name = "chat"
	if model != "" {
		c.d.name += " " + model
		c.d.attrs = append(c.d.attrs, KeyRequestModel.String(model), KeyResponseModel.String(model))
	}
	if c.messageID != "" {
		c.d.attrs = append(c.d.attrs, KeyResponseID.String(c.messageID))
	}
	if c.stop != "" {
		c.d.attrs = append(c.d.attrs, KeyFinishReasons.StringSlice([]string{c.stop}))
	}
	u := c.usage
	// gen_ai.usage.input_tokens counts every input token, cached ones
	// included; the cache attributes say how many of them were read from
	// and written to the cache.
	c.d.attrs = append(c.d.attrs,
		KeyInputTokens.Int64(u.InputTokens+u.CacheReadTokens+u.CacheWriteTokens),
		KeyOutputTokens.Int64(u.OutputTokens))
	if u.CacheReadTokens > 0 {
		c.d.attrs = append(c.d.attrs, KeyCacheReadTokens.Int64(u.CacheReadTokens))
	}
	if u.CacheWriteTokens > 0 {
		c.d.attrs = append(c.d.attrs, KeyCacheCreateTokens.Int64(u.CacheWriteTokens))
	}
	if u.ReasoningTokens > 0 {
		c.d.attrs = append(c.d.attrs, KeyReasoningTokens.Int64(u.ReasoningTokens))
	}
	if sm.m.cfg.CaptureContent {
		if in := messagesJSON(c.input); in != "" {
			c.d.attrs = append(c.d.attrs, KeyInputMessages.String(in))
		}
		if len(c.output) > 0 {
			c.d.attrs = append(c.d.attrs, KeyOutputMessages.String(messagesJSON([]chatMessage{{Role: "assistant", Parts: c.output, FinishReason: c.stop}})))
		}
	}
	sm.emit(ctx, &c.d, c.end)
}

// errorRecorded adds the error to the span of its turn and, for a model
// call that failed (an error a provider answered), emits a chat span with
// status Error.
func (sm *sessionMapper) errorRecorded(ctx context.Context, ev events.Event, p *events.ErrorRecorded, s *projections.Session) {
	exc := spanEvent{name: EventException, at: ev.Time, attrs: []attribute.KeyValue{
		KeyExceptionType.String(errorType(&p.ErrorInfo, string(p.Kind))), KeyExceptionMessage.String(p.Message)}}
	if p.Provider == "" && p.HTTPStatus == 0 {
		if !sm.turnEvent(ev.Turn, exc) {
			if t := sm.latestOpen(); t != nil {
				t.d.events = append(t.d.events, exc)
			}
		}
		return
	}
	tr, parent := sm.under(ev)
	start := sm.callStart(ev)
	d := spanData{name: "chat", kind: trace.SpanKindClient, ref: spanRef{Trace: tr, Span: chatSpanID(sm.tenant, sm.session, ev.ID)},
		parent: parent, start: start, attrs: append(sm.base(OpChat, KindLLM, s), KeyEventID.String(ev.ID)), events: []spanEvent{exc}}
	if s.Model != "" {
		d.name += " " + s.Model
		d.attrs = append(d.attrs, KeyRequestModel.String(s.Model))
	}
	if p.HTTPStatus != 0 {
		d.attrs = append(d.attrs, KeyHTTPResponseStatus.Int(p.HTTPStatus))
	}
	d.fail(errorType(&p.ErrorInfo, ErrModelCall), p.Message)
	sm.emit(ctx, &d, ev.Time)
}

// anomaly places a violation at the moment it arose: as an event on the
// span it concerns while that span is open (an orphan's tool span ends
// there, with status Error), else as a span of its own under the span it
// concerns.
func (sm *sessionMapper) anomaly(ctx context.Context, ev events.Event, s *projections.Session, v projections.Violation) {
	e := spanEvent{name: EventAnomaly, at: ev.Time, attrs: anomalyAttrs(v)}
	if v.ToolUseID != "" {
		if t := sm.tools[v.ToolUseID]; t != nil {
			t.d.events = append(t.d.events, e)
			if v.Rule == projections.RuleToolUseWithoutResult {
				t.d.attrs = append(t.d.attrs, KeyToolStatus.String(string(projections.ToolOrphaned)))
				t.d.fail(ErrOrphan, v.Detail)
				sm.endTool(ctx, v.ToolUseID, t, ev.Time)
			}
			return
		}
	}
	if v.Turn != "" && sm.turnEvent(v.Turn, e) {
		return
	}
	if v.ToolUseID == "" && v.Turn == "" && sm.turnEvent(ev.Turn, e) {
		return
	}
	// A span of its own, under the tool or the turn it concerns.
	var tr trace.TraceID
	var parent trace.SpanID
	if ref, ok := sm.closedTools.get(v.ToolUseID); ok && v.ToolUseID != "" {
		tr, parent = ref.Trace, ref.Span
	} else if ref, ok := sm.closedTurns.get(v.Turn); ok && v.Turn != "" {
		tr, parent = ref.Trace, ref.Span
	} else {
		tr, parent = sm.under(ev)
	}
	d := spanData{name: "turnstone.anomaly " + string(v.Rule), kind: trace.SpanKindInternal,
		ref:    spanRef{Trace: tr, Span: spanIDOf("anomaly", sm.tenant, sm.session, ev.ID, string(v.Rule), v.ToolUseID, v.Turn)},
		parent: parent, start: ev.Time, attrs: append(sm.base(OpAnomaly, KindGuardrail, s), KeyRule.String(string(v.Rule)), KeyEventID.String(ev.ID)),
		events: []spanEvent{e}}
	sm.emit(ctx, &d, ev.Time)
}

func anomalyAttrs(v projections.Violation) []attribute.KeyValue {
	attrs := []attribute.KeyValue{KeyRule.String(string(v.Rule)), KeyDetail.String(v.Detail), KeySeq.Int64(int64(v.Seq))}
	if v.ToolUseID != "" {
		attrs = append(attrs, KeyAnomalyToolUse.String(v.ToolUseID))
	}
	if v.Turn != "" {
		attrs = append(attrs, KeyAnomalyTurn.String(v.Turn))
	}
	return attrs
}

// command returns the span of a recovery command under way, opening it at
// its first recovery event: under the tool call it repaired (the repair's
// records come just before), else under the session's latest turn.
func (sm *sessionMapper) command(ctx context.Context, ev events.Event, id, kind string, s *projections.Session, took time.Duration) *openCmd {
	if c := sm.cmds[id]; c != nil {
		return c
	}
	if len(sm.cmds) >= maxOpenCmds || id == "" {
		return nil
	}
	var tr trace.TraceID
	var parent trace.SpanID
	var resolved []projections.Violation
	if kind == "repair_orphans" && len(sm.repairs) > 0 {
		resolved, sm.repairs = sm.repairs, nil
		if ref, ok := sm.closedTools.get(resolved[0].ToolUseID); ok {
			tr, parent = ref.Trace, ref.Span
		}
	}
	if !parent.IsValid() {
		switch t := sm.latestOpen(); {
		case t != nil:
			tr, parent = t.d.ref.Trace, t.d.ref.Span
		default:
			if ref, ok := sm.latestClosedTurn(s); ok {
				tr, parent = ref.Trace, ref.Span
			} else {
				tr = ownTraceID(sm.tenant, sm.session, ev.ID)
			}
		}
	}
	start := ev.Time.Add(-took)
	c := &openCmd{kind: kind, d: spanData{name: "recovery " + kind, kind: trace.SpanKindInternal,
		ref:    spanRef{Trace: tr, Span: spanIDOf("recovery", sm.tenant, sm.session, ev.ID, id)},
		parent: parent, start: start, attrs: append(sm.base(OpRecovery, KindChain, s), KeyCommandID.String(id), KeyCommandKind.String(kind))}}
	for _, v := range resolved {
		c.d.events = append(c.d.events, spanEvent{name: EventResolved, at: ev.Time, attrs: anomalyAttrs(v)})
	}
	sm.cmds[id] = c
	return c
}

// latestClosedTurn is the span of the session's latest turn that ended.
func (sm *sessionMapper) latestClosedTurn(s *projections.Session) (spanRef, bool) {
	for i := len(s.Turns) - 1; i >= 0; i-- {
		if ref, ok := sm.closedTurns.get(s.Turns[i].ID); ok {
			return ref, true
		}
	}
	return spanRef{}, false
}

// endCommand emits a recovery command's span with its outcome.
func (sm *sessionMapper) endCommand(ctx context.Context, ev events.Event, s *projections.Session) {
	p, err := ev.Payload()
	if err != nil {
		return
	}
	var id, kind string
	switch p := p.(type) {
	case *events.RecoveryCompleted:
		id, kind = p.CommandID, p.Kind
	case *events.RecoveryParked:
		id, kind = p.CommandID, p.Kind
	}
	c := sm.command(ctx, ev, id, kind, s, 0)
	if c == nil {
		return
	}
	switch p := p.(type) {
	case *events.RecoveryCompleted:
		c.d.attrs = append(c.d.attrs, KeyOutcome.String(string(p.Outcome)), KeyAttempts.Int(max(c.attempts, p.Attempts)))
		if p.Strategy != "" {
			c.d.attrs = append(c.d.attrs, KeyStrategy.String(p.Strategy))
		}
		if p.Detail != "" {
			c.d.attrs = append(c.d.attrs, KeyRecoveryDetail.String(p.Detail))
		}
		if p.Outcome == events.OutcomeFailed {
			c.d.fail(ErrRecoveryFailed, p.Detail)
		}
	case *events.RecoveryParked:
		c.d.attrs = append(c.d.attrs, KeyOutcome.String("parked"), KeyAttempts.Int(c.attempts), KeyReason.String(p.Reason))
		c.d.fail(ErrRecoveryParked, p.Reason)
	}
	sm.emit(ctx, &c.d, ev.Time)
	delete(sm.cmds, id)
}

// emit ends d at end and hands it to the tracer's provider (nothing while
// the mapper is silent).
func (sm *sessionMapper) emit(ctx context.Context, d *spanData, end time.Time) {
	if sm.silent || sm.m.tracer == nil {
		return
	}
	if end.Before(d.start) {
		end = d.start
	}
	ctx = withIDs(ctx, d.ref)
	opts := []trace.SpanStartOption{trace.WithTimestamp(d.start), trace.WithSpanKind(d.kind), trace.WithAttributes(d.attrs...)}
	if d.parent.IsValid() {
		ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: d.ref.Trace, SpanID: d.parent, TraceFlags: trace.FlagsSampled, Remote: true}))
	} else {
		opts = append(opts, trace.WithNewRoot())
	}
	_, sp := sm.m.tracer.Start(ctx, d.name, opts...)
	for _, e := range d.events {
		sp.AddEvent(e.name, trace.WithTimestamp(e.at), trace.WithAttributes(e.attrs...))
	}
	if d.err {
		sp.SetStatus(codes.Error, d.desc)
	}
	sp.End(trace.WithTimestamp(end))
}

// ProviderName returns the gen_ai.provider.name of a provider as a
// runtime names it: the conventions' well-known value where one fits
// (anthropic, openai, aws.bedrock, gcp.vertex_ai, gcp.gemini,
// azure.ai.openai, ...), else the name itself; with no name, the one the
// model's name implies (claude: anthropic; gpt, o1, o3, o4, codex:
// openai; gemini: gcp.gemini), else "unknown".
func ProviderName(provider, model string) string {
	p := strings.ToLower(strings.TrimSpace(provider))
	switch p {
	case "":
	case "bedrock", "aws", "aws-bedrock", "aws_bedrock":
		return "aws.bedrock"
	case "vertex", "vertex_ai", "vertexai", "google-vertex":
		return "gcp.vertex_ai"
	case "gemini", "google":
		return "gcp.gemini"
	case "azure", "azure-openai", "azure_openai":
		return "azure.ai.openai"
	case "mistral":
		return "mistral_ai"
	case "xai", "grok":
		return "x_ai"
	default:
		return p
	}
	m := strings.ToLower(model)
	switch {
	case strings.HasPrefix(m, "claude"):
		return "anthropic"
	case strings.HasPrefix(m, "gpt"), strings.HasPrefix(m, "o1"), strings.HasPrefix(m, "o3"), strings.HasPrefix(m, "o4"), strings.Contains(m, "codex"):
		return "openai"
	case strings.HasPrefix(m, "gemini"):
		return "gcp.gemini"
	}
	return "unknown"
}
