package otel

import "go.opentelemetry.io/otel/attribute"

// ConventionsVersion is the version of the OpenTelemetry GenAI semantic
// conventions the spans follow: the text of
// open-telemetry/semantic-conventions-genai, whose schema URL is
// SchemaURL (the conventions moved out of open-telemetry/semantic-
// conventions at v1.42; they are at "Development" status). docs/otel.md
// names it too.
const ConventionsVersion = "1.42.0"

// SchemaURL is the schema URL of ConventionsVersion, set on the
// instrumentation scope of every span.
const SchemaURL = "https://opentelemetry.io/schemas/gen-ai/1.42.0"

// ScopeName is the instrumentation scope of the spans.
const ScopeName = "github.com/turnstone-dev/turnstone/internal/otel"

// The attribute keys. They are written out here rather than taken from
// go.opentelemetry.io/otel/semconv: the semconv Go packages stopped
// carrying the gen_ai keys after semconv/v1.41.0 (the GenAI conventions
// moved to their own repository), and v1.41.0 predates keys this mapping
// sets (gen_ai.usage.cache_read.input_tokens,
// gen_ai.usage.cache_creation.input_tokens,
// gen_ai.usage.reasoning.output_tokens). Pinning an old semconv package
// would freeze the names at a version the backends no longer read first.
const (
	// GenAI conventions (docs/registry/attributes/gen-ai.md).
	KeyOperationName      = attribute.Key("gen_ai.operation.name")
	KeyProviderName       = attribute.Key("gen_ai.provider.name")
	KeyConversationID     = attribute.Key("gen_ai.conversation.id")
	KeyAgentName          = attribute.Key("gen_ai.agent.name")
	KeyAgentVersion       = attribute.Key("gen_ai.agent.version")
	KeyRequestModel       = attribute.Key("gen_ai.request.model")
	KeyResponseModel      = attribute.Key("gen_ai.response.model")
	KeyResponseID         = attribute.Key("gen_ai.response.id")
	KeyFinishReasons      = attribute.Key("gen_ai.response.finish_reasons")
	KeyInputTokens        = attribute.Key("gen_ai.usage.input_tokens")
	KeyOutputTokens       = attribute.Key("gen_ai.usage.output_tokens")
	KeyCacheReadTokens    = attribute.Key("gen_ai.usage.cache_read.input_tokens")
	KeyCacheCreateTokens  = attribute.Key("gen_ai.usage.cache_creation.input_tokens")
	KeyReasoningTokens    = attribute.Key("gen_ai.usage.reasoning.output_tokens")
	KeyToolName           = attribute.Key("gen_ai.tool.name")
	KeyToolCallID         = attribute.Key("gen_ai.tool.call.id")
	KeyToolType           = attribute.Key("gen_ai.tool.type")
	KeyToolCallArguments  = attribute.Key("gen_ai.tool.call.arguments")
	KeyToolCallResult     = attribute.Key("gen_ai.tool.call.result")
	KeyInputMessages      = attribute.Key("gen_ai.input.messages")
	KeyOutputMessages     = attribute.Key("gen_ai.output.messages")
	KeyErrorType          = attribute.Key("error.type")
	KeyExceptionType      = attribute.Key("exception.type")
	KeyExceptionMessage   = attribute.Key("exception.message")
	KeyHTTPResponseStatus = attribute.Key("http.response.status_code")

	// KeySessionID is the general conventions' session.id, which Langfuse
	// (before gen_ai.conversation.id) and Phoenix (OpenInference) group a
	// session's traces by.
	KeySessionID = attribute.Key("session.id")
	// KeyOpenInferenceKind is OpenInference's span kind (LLM, AGENT,
	// TOOL, CHAIN, GUARDRAIL), which Phoenix needs and Langfuse reads
	// before gen_ai.operation.name.
	KeyOpenInferenceKind = attribute.Key("openinference.span.kind")

	// Turnstone's own: where the span comes from in the log.
	KeyTenant         = attribute.Key("turnstone.tenant")
	KeySession        = attribute.Key("turnstone.session")
	KeySessionKind    = attribute.Key("turnstone.session.kind")
	KeyParentSession  = attribute.Key("turnstone.parent_session")
	KeyTurnID         = attribute.Key("turnstone.turn.id")
	KeyTurnIndex      = attribute.Key("turnstone.turn.index")
	KeyTurnTrigger    = attribute.Key("turnstone.turn.trigger")
	KeyTurnStatus     = attribute.Key("turnstone.turn.status")
	KeyTurnReason     = attribute.Key("turnstone.turn.reason")
	KeyTurnStage      = attribute.Key("turnstone.turn.stage")
	KeyToolStatus     = attribute.Key("turnstone.tool.status")
	KeyDurationMS     = attribute.Key("turnstone.duration_ms")
	KeySeq            = attribute.Key("turnstone.seq")
	KeyEventID        = attribute.Key("turnstone.event.id")
	KeyRule           = attribute.Key("turnstone.anomaly.rule")
	KeyDetail         = attribute.Key("turnstone.anomaly.detail")
	KeyAnomalyToolUse = attribute.Key("turnstone.anomaly.tool_use_id")
	KeyAnomalyTurn    = attribute.Key("turnstone.anomaly.turn")
	KeyCommandID      = attribute.Key("turnstone.recovery.command_id")
	KeyCommandKind    = attribute.Key("turnstone.recovery.kind")
	KeyOutcome        = attribute.Key("turnstone.recovery.outcome")
	KeyStrategy       = attribute.Key("turnstone.recovery.strategy")
	KeyAttempts       = attribute.Key("turnstone.recovery.attempts")
	KeyAttempt        = attribute.Key("turnstone.recovery.attempt")
	KeyResult         = attribute.Key("turnstone.recovery.result")
	KeyClass          = attribute.Key("turnstone.recovery.class")
	KeyRecoveryDetail = attribute.Key("turnstone.recovery.detail")
	KeyStage          = attribute.Key("turnstone.stage")
	KeyReason         = attribute.Key("turnstone.reason")
	KeyTokensBefore   = attribute.Key("turnstone.tokens_before")
	KeyTokensAfter    = attribute.Key("turnstone.tokens_after")
)

// The values of gen_ai.operation.name. OpChat, OpInvokeAgent and
// OpExecuteTool are the conventions' well-known values; OpRecovery and
// OpAnomaly are Turnstone's own (the conventions allow custom values).
const (
	OpChat        = "chat"
	OpInvokeAgent = "invoke_agent"
	OpExecuteTool = "execute_tool"
	OpRecovery    = "turnstone.recovery"
	OpAnomaly     = "turnstone.anomaly"
)

// The values of openinference.span.kind
// (https://github.com/Arize-ai/openinference, semantic_conventions.md).
const (
	KindLLM       = "LLM"
	KindAgent     = "AGENT"
	KindTool      = "TOOL"
	KindChain     = "CHAIN"
	KindGuardrail = "GUARDRAIL"
)

// The span event names.
const (
	// EventAnomaly is a violation of an invariant, at the moment its
	// event was folded (its attributes: turnstone.anomaly.*).
	EventAnomaly = "turnstone.anomaly"
	// EventResolved marks a violation a repair resolved.
	EventResolved = "turnstone.resolved"
	// EventException is the general conventions' exception event: an
	// error.recorded.
	EventException = "exception"
	// EventStage is a turn.stage_completed.
	EventStage = "turnstone.stage_completed"
	// EventAttempt is a recovery.attempted.
	EventAttempt = "turnstone.recovery.attempt"
	// EventSession is a change of the session while a turn is in flight:
	// paused, resumed, rewound, forked, a distillation.
	EventSession = "turnstone.session"
)

// The error.type values this mapping reports besides the providers' own
// error codes (the conventions ask instrumentations to document them).
const (
	// ErrTurnFailed: turn.failed with no provider code or HTTP status.
	ErrTurnFailed = "turn_failed"
	// ErrTurnAbandoned: the turn was abandoned (turn.abandoned).
	ErrTurnAbandoned = "turn_abandoned"
	// ErrToolError: the tool_result (or tool_call.completed) said is_error.
	ErrToolError = "tool_error"
	// ErrOrphan: the tool_use has no tool_result (an orphan; the rule
	// tool_use_without_result).
	ErrOrphan = "tool_use_without_result"
	// ErrModelCall: an error.recorded of a model call with no provider
	// code or HTTP status.
	ErrModelCall = "model_call_failed"
	// ErrRecoveryFailed and ErrRecoveryParked: a recovery command ended
	// with outcome failed, or was parked.
	ErrRecoveryFailed = "recovery_failed"
	ErrRecoveryParked = "recovery_parked"
)
