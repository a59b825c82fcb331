package recovery

import (
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// Class is the class of an error as Classify sees it: what went wrong, in
// terms that decide what to do next (Info and DefaultChains). Classes are
// lower-case strings and travel as recovery.attempted's class and
// Params.ErrorClass.
type Class string

// The error classes.
const (
	// ClassNetwork: the connection failed (refused, reset, EOF, no route,
	// DNS). Retried with backoff.
	ClassNetwork Class = "network"
	// ClassTimeout: the call ran out of time (deadline exceeded, timed out,
	// HTTP 408 or 504). Retried with backoff.
	ClassTimeout Class = "timeout"
	// ClassRateLimit: the account hit a rate limit (HTTP 429,
	// rate_limit_error). Retried, honouring the provider's retry-after.
	ClassRateLimit Class = "rate_limit"
	// ClassOverloaded: the provider is overloaded for everyone (HTTP 529 or
	// 503, overloaded_error). Retried briefly, then another provider.
	ClassOverloaded Class = "overloaded"
	// ClassServer: the provider failed internally (other 5xx, api_error).
	// Retried with backoff.
	ClassServer Class = "server"
	// ClassAuthentication: the credentials or the account are refused (HTTP
	// 401, 402 or 403, authentication_error, permission_error,
	// billing_error, an exhausted quota or spend limit). Needs a person;
	// never retried.
	ClassAuthentication Class = "authentication"
	// ClassInvalidRequest: the request itself is wrong (HTTP 400 and other
	// 4xx, invalid_request_error, validation errors). Never retried: it
	// fails again until the request changes.
	ClassInvalidRequest Class = "invalid_request"
	// ClassContextLength: the prompt does not fit the model's context
	// window or the request size limit (prompt is too long, context length
	// exceeded, HTTP 413 request_too_large). Its action is to distill.
	ClassContextLength Class = "context_length"
	// ClassToolError: a tool the agent called failed. The model provider
	// is not at fault.
	ClassToolError Class = "tool_error"
	// ClassParseError: structured output could not be parsed (JSON syntax,
	// unmarshalling, schema). The model's output is stochastic, so a retry
	// may succeed.
	ClassParseError Class = "parse_error"
	// ClassResource: the host ran out of a resource (out of memory, OOM
	// kill, disk full, ENOSPC). Needs the process restarted or a person.
	ClassResource Class = "resource"
	// ClassRuntimeUnavailable: nobody answers on the session's control
	// subject (NATS "no responders"): the agent runtime is down. Not
	// retried blindly: the session waits for the runtime.
	ClassRuntimeUnavailable Class = "runtime_unavailable"
	// ClassUnknown: nothing above matched.
	ClassUnknown Class = "unknown"
)

// Classes lists every class, in the order Classify tries the text rules
// (ClassUnknown last).
var Classes = []Class{
	ClassRuntimeUnavailable, ClassResource, ClassToolError, ClassAuthentication, ClassContextLength,
	ClassRateLimit, ClassOverloaded, ClassTimeout, ClassNetwork, ClassParseError, ClassInvalidRequest,
	ClassServer, ClassUnknown,
}

// Valid reports whether c is one of Classes.
func (c Class) Valid() bool {
	_, ok := classInfo[c]
	return ok
}

// Severity ranks how badly an error class hurts a session: low (a step
// failed, the session carries on), medium (the turn is held up), high (the
// session is stuck until recovery works), critical (nothing runs until a
// person acts).
type Severity string

// The severities.
const (
	SeverityLow      Severity = "low"
	SeverityMedium   Severity = "medium"
	SeverityHigh     Severity = "high"
	SeverityCritical Severity = "critical"
)

// Suggested actions of ClassInfo.Action: what a person or a policy should
// do first about an error of the class. They name intents, not control
// actions; DefaultChains turns them into strategies.
const (
	SuggestRetryWithBackoff = "retry_with_backoff"
	SuggestSwitchProvider   = "switch_provider"
	SuggestDistill          = "distill"
	SuggestFixCredentials   = "fix_credentials"
	SuggestFixRequest       = "fix_request"
	SuggestDegrade          = "degrade"
	SuggestResume           = "resume"
	SuggestPause            = "pause"
)

// ClassInfo is what Turnstone knows about an error class: its Severity;
// whether the same call may succeed if it is made again (Retryable);
// the suggested first Action (one of the Suggest constants);
// whether a retry waits for the retry-after hint the provider sent
// (HonoursRetryAfter: RFC 9110 §10.2.3 defines Retry-After for 503, RFC
// 6585 §4 for 429, and the Anthropic API sends it with 429
// rate_limit_error); and whether the error counts against the provider's
// circuit breaker (ProviderFault).
type ClassInfo struct {
	Severity          Severity
	Retryable         bool
	Action            string
	HonoursRetryAfter bool
	ProviderFault     bool
}

var classInfo = map[Class]ClassInfo{
	ClassNetwork:            {Severity: SeverityMedium, Retryable: true, Action: SuggestRetryWithBackoff, ProviderFault: true},
	ClassTimeout:            {Severity: SeverityMedium, Retryable: true, Action: SuggestRetryWithBackoff, ProviderFault: true},
	ClassRateLimit:          {Severity: SeverityMedium, Retryable: true, Action: SuggestRetryWithBackoff, HonoursRetryAfter: true, ProviderFault: true},
	ClassOverloaded:         {Severity: SeverityHigh, Retryable: true, Action: SuggestSwitchProvider, HonoursRetryAfter: true, ProviderFault: true},
	ClassServer:             {Severity: SeverityHigh, Retryable: true, Action: SuggestRetryWithBackoff, ProviderFault: true},
	ClassAuthentication:     {Severity: SeverityCritical, Action: SuggestFixCredentials},
	ClassInvalidRequest:     {Severity: SeverityHigh, Action: SuggestFixRequest},
	ClassContextLength:      {Severity: SeverityHigh, Action: SuggestDistill},
	ClassToolError:          {Severity: SeverityLow, Retryable: true, Action: SuggestRetryWithBackoff},
	ClassParseError:         {Severity: SeverityLow, Retryable: true, Action: SuggestRetryWithBackoff},
	ClassResource:           {Severity: SeverityCritical, Action: SuggestResume},
	ClassRuntimeUnavailable: {Severity: SeverityHigh, Action: SuggestPause},
	ClassUnknown:            {Severity: SeverityMedium, Retryable: true, Action: SuggestRetryWithBackoff},
}

// Info returns what is known about class c; a value that is not one of
// Classes gets the information of ClassUnknown.
func Info(c Class) ClassInfo {
	if info, ok := classInfo[c]; ok {
		return info
	}
	return classInfo[ClassUnknown]
}

// Classify returns the class of e. The rules run in this order, the first
// match winning:
//
//  1. Refinements that narrow a status to a more precise class: a
//     provider code or a message saying the prompt does not fit the
//     context window (with HTTP 400, 413, 422 or no status) is
//     ClassContextLength; an exhausted quota, spend limit or credit
//     balance (with any status) is ClassAuthentication, because waiting
//     does not lift it.
//  2. The HTTP status (e.HTTPStatus, or one the message states, as in
//     "API Error: 529 ..." or "429 {...}"): 401/402/403/407
//     authentication, 408 and 504 timeout, 413 context length, 429 rate
//     limit, 503 and 529 overloaded, other 5xx server, other 4xx invalid
//     request. A status beats the message text.
//  3. The provider's error type (e.Code, or the "type" of an
//     error object the message embeds), case-insensitive: the Anthropic
//     API types, OpenAI codes, Google RPC status names and Node.js/POSIX
//     error codes (ECONNREFUSED, ENOSPC, ...).
//  4. The message text, class by class in the order of Classes.
//  5. e.Kind: logic is ClassInvalidRequest (it fails again until
//     something changes); anything else is ClassUnknown.
//
// Sources: Anthropic API errors (docs.claude.com/en/api/errors): 400
// invalid_request_error, 401 authentication_error, 403 permission_error,
// 404 not_found_error, 413 request_too_large, 429 rate_limit_error, 500
// api_error, 529 overloaded_error; OpenAI error codes (429
// insufficient_quota is billing, not rate); Google RPC codes
// (RESOURCE_EXHAUSTED, UNAVAILABLE, DEADLINE_EXCEEDED); HTTP semantics
// (RFC 9110); Go's net and context error texts; the NATS client's
// "nats: no responders available for request".
func Classify(e events.ErrorInfo) Class {
	msg := strings.ToLower(e.Message)
	code := strings.ToLower(strings.TrimSpace(e.Code))
	if code == "" {
		code = embeddedType(e.Message)
	}
	status := e.HTTPStatus
	if status < 400 {
		status = statedStatus(e.Message)
	}

	// 1. Refinements.
	if codeIn(code, contextLengthCodes) || (contextLengthText(msg) && (status == 0 || status == 400 || status == 413 || status == 422)) {
		return ClassContextLength
	}
	if codeIn(code, billingCodes) || containsAny(msg, billingTexts) {
		return ClassAuthentication
	}
	// 2. Status.
	if c, ok := classOfStatus(status); ok {
		return c
	}
	// 3. Provider or system error code.
	if c, ok := codeClass[code]; ok {
		return c
	}
	// 4. Text.
	for _, r := range textRules {
		if r.match(msg) {
			return r.class
		}
	}
	// 5. Kind.
	if e.Kind == events.KindLogic {
		return ClassInvalidRequest
	}
	return ClassUnknown
}

// classOfStatus maps an HTTP status of 400 or more to its class.
func classOfStatus(status int) (Class, bool) {
	switch {
	case status < 400 || status > 599:
		return "", false
	case status == 401 || status == 402 || status == 403 || status == 407:
		return ClassAuthentication, true
	case status == 408 || status == 504:
		return ClassTimeout, true
	case status == 413:
		return ClassContextLength, true
	case status == 429:
		return ClassRateLimit, true
	case status == 503 || status == 529:
		return ClassOverloaded, true
	case status >= 500:
		return ClassServer, true
	}
	return ClassInvalidRequest, true
}

var (
	// contextLengthCodes: OpenAI context_length_exceeded and
	// string_above_max_length; Anthropic request_too_large (413: the
	// request is over the size limit, which distilling the history fixes).
	contextLengthCodes = []string{"context_length_exceeded", "string_above_max_length", "request_too_large", "model_context_window_exceeded"}
	// billingCodes: Anthropic billing_error (402); OpenAI
	// insufficient_quota (429) and billing_hard_limit_reached.
	billingCodes = []string{"billing_error", "insufficient_quota", "billing_hard_limit_reached", "enforced_spend_limit_reached"}
	billingTexts = []string{
		"insufficient_quota", "exceeded your current quota", "credit balance is too low",
		"spend limit", "billing_error", "billing hard limit", "enforced_spend_limit_reached",
	}
)

// contextLengthText reports whether a lower-cased message says the prompt
// does not fit: Anthropic "prompt is too long: N tokens > M maximum" and
// "input length and `max_tokens` exceed context limit"; OpenAI "This
// model's maximum context length is N tokens"; generic variants.
func contextLengthText(msg string) bool {
	if containsAny(msg, []string{
		"prompt is too long", "context length", "context_length", "context window", "context_window",
		"exceed context limit", "exceeds the context", "too many tokens", "token limit exceeded",
		"reduce the length of the messages", "request_too_large", "request too large", "maximum allowed number of bytes",
	}) {
		return true
	}
	return strings.Contains(msg, "context") && (strings.Contains(msg, "max_tokens") || strings.Contains(msg, "max tokens"))
}

// codeClass maps a lower-cased provider or system error code to its class.
var codeClass = map[string]Class{
	// Anthropic API error types (docs.claude.com/en/api/errors).
	"invalid_request_error": ClassInvalidRequest,
	"authentication_error":  ClassAuthentication,
	"permission_error":      ClassAuthentication,
	"not_found_error":       ClassInvalidRequest,
	"rate_limit_error":      ClassRateLimit,
	"api_error":             ClassServer,
	"overloaded_error":      ClassOverloaded,
	// OpenAI error codes and types.
	"rate_limit_exceeded": ClassRateLimit,
	"invalid_api_key":     ClassAuthentication,
	"server_error":        ClassServer,
	"model_not_found":     ClassInvalidRequest,
	"timeout":             ClassTimeout,
	// Google RPC status names (google.rpc.Code), as Gemini returns them.
	"resource_exhausted":  ClassRateLimit,
	"unavailable":         ClassOverloaded,
	"deadline_exceeded":   ClassTimeout,
	"invalid_argument":    ClassInvalidRequest,
	"failed_precondition": ClassInvalidRequest,
	"not_found":           ClassInvalidRequest,
	"unauthenticated":     ClassAuthentication,
	"permission_denied":   ClassAuthentication,
	"internal":            ClassServer,
	// Node.js and POSIX error codes.
	"econnrefused": ClassNetwork,
	"econnreset":   ClassNetwork,
	"econnaborted": ClassNetwork,
	"epipe":        ClassNetwork,
	"ehostunreach": ClassNetwork,
	"enetunreach":  ClassNetwork,
	"enotfound":    ClassNetwork,
	"eai_again":    ClassNetwork,
	"etimedout":    ClassTimeout,
	"enomem":       ClassResource,
	"enospc":       ClassResource,
	"edquot":       ClassResource,
	"oomkilled":    ClassResource,
	// Runtime and Turnstone codes.
	"tool_error":           ClassToolError,
	"tool_execution_error": ClassToolError,
	"tool_use_failed":      ClassToolError,
	"parse_error":          ClassParseError,
	"json_parse_error":     ClassParseError,
	"output_parse_error":   ClassParseError,
	"no_responders":        ClassRuntimeUnavailable,
	"runtime_unavailable":  ClassRuntimeUnavailable,
}

type textRule struct {
	class Class
	match func(msg string) bool
}

var (
	reOOM = regexp.MustCompile(`\boom\b|oom[-_ ]?kill`)
	reEOF = regexp.MustCompile(`\beof\b`)
)

// textRules are tried in order on the lower-cased message. Tool failures
// come before the network and timeout texts so that a tool's own network
// error does not count against the model provider.
var textRules = []textRule{
	{ClassRuntimeUnavailable, anyOf("no responders available", "nats: no responders")},
	{ClassResource, func(m string) bool {
		return containsAny(m, []string{
			"out of memory", "cannot allocate memory", "no space left on device", "disk full",
			"disk quota exceeded", "enospc", "enomem",
		}) || reOOM.MatchString(m)
	}},
	{ClassToolError, anyOf(
		"tool execution failed", "tool call failed", "tool error", "tool_error", "error executing tool",
		"tool failed", "tool_use_failed", "tool returned an error",
	)},
	{ClassAuthentication, anyOf(
		"invalid x-api-key", "invalid api key", "incorrect api key", "invalid_api_key", "api key not valid",
		"authentication_error", "permission_error", "unauthorized", "unauthenticated", "invalid bearer token",
		"oauth token has expired", "token has been revoked",
	)},
	{ClassContextLength, contextLengthText},
	{ClassRateLimit, anyOf("rate_limit", "rate limit", "ratelimit", "too many requests", "resource_exhausted", "resource exhausted")},
	{ClassOverloaded, anyOf("overloaded", "service unavailable", "temporarily unavailable", "at capacity", "server is busy")},
	{ClassTimeout, anyOf("deadline exceeded", "timed out", "timeout", "etimedout", "time out")},
	{ClassNetwork, func(m string) bool {
		return containsAny(m, []string{
			"connection refused", "connection reset", "econnrefused", "econnreset", "broken pipe", "epipe",
			"no route to host", "network is unreachable", "ehostunreach", "enetunreach", "no such host",
			"enotfound", "eai_again", "getaddrinfo", "server misbehaving", "socket hang up", "connection closed",
			"connection aborted", "econnaborted", "use of closed network connection", "tls handshake",
			"apiconnectionerror", "connection error",
		}) || reEOF.MatchString(m)
	}},
	{ClassParseError, anyOf(
		"invalid character", "unexpected end of json input", "cannot unmarshal", "json parse", "jsondecodeerror",
		"syntaxerror: unexpected token", "failed to parse", "parse error", "malformed json", "invalid json",
		"structured output", "output_parse",
	)},
	{ClassInvalidRequest, anyOf(
		"invalid_request_error", "invalid request", "bad request", "validation error", "validationerror",
		"unprocessable", "not_found_error", "model not found", "tool_use` ids were found without", "tool_use ids were found without",
	)},
	{ClassServer, anyOf("api_error", "internal server error", "internal error", "bad gateway", "server error")},
}

var (
	// reStatedStatus finds an HTTP status a message states: "API Error:
	// 529 Overloaded", "status code 503", "HTTP 502", "status: 429".
	reStatedStatus = regexp.MustCompile(`(?i)\b(?:api error|status(?: code)?|http(?: status)?|error code)[\s:=]*([45]\d\d)\b`)
	// reLeadingStatus finds a status that starts the message, as the
	// Anthropic SDKs print it: `429 {"type":"error",...}`.
	reLeadingStatus = regexp.MustCompile(`^\s*([45]\d\d)\b\s*[{:(-]`)
	// reEmbeddedType finds the error type of an error object the message
	// embeds: {"type":"error","error":{"type":"overloaded_error",...}}.
	reEmbeddedType = regexp.MustCompile(`"type"\s*:\s*"([a-z_]+_error|request_too_large)"`)
)

func statedStatus(msg string) int {
	for _, re := range []*regexp.Regexp{reStatedStatus, reLeadingStatus} {
		if m := re.FindStringSubmatch(msg); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n
		}
	}
	return 0
}

func embeddedType(msg string) string {
	if m := reEmbeddedType.FindStringSubmatch(msg); m != nil {
		return m[1]
	}
	return ""
}

func codeIn(code string, list []string) bool {
	if code == "" {
		return false
	}
	for _, c := range list {
		if code == c {
			return true
		}
	}
	return false
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

func anyOf(subs ...string) func(string) bool {
	return func(m string) bool { return containsAny(m, subs) }
}

var (
	// reRetryAfterMS: "retry-after-ms: 1500" (the header the Anthropic
	// and OpenAI SDKs read first).
	reRetryAfterMS = regexp.MustCompile(`(?i)retry[-_ ]?after[-_]ms["']?\s*[:=]?\s*["']?(\d+(?:\.\d+)?)`)
	// reRetryAfterGo: a Go-style duration after a retry phrase: "try
	// again in 1m30s", "retryDelay": "30s", "retry after 7.5s".
	reRetryAfterGo = regexp.MustCompile(`(?i)(?:retry[-_ ]?after|try again in|retry in|retry[-_ ]?delay)["']?\s*[:=]?\s*["']?((?:\d+(?:\.\d+)?(?:ms|h|m|s))+)\b`)
	// reRetryAfter: a number with an optional unit word: "Retry-After:
	// 5", "retry after 30 seconds", "retry_after": 12.
	reRetryAfter = regexp.MustCompile(`(?i)(?:retry[-_ ]?after|try again in|retry in|retry[-_ ]?delay)["']?\s*[:=]?\s*["']?(\d+(?:\.\d+)?)\s*(milliseconds?|seconds?|secs?|minutes?|mins?|hours?)?\b`)
)

// RetryAfter returns the wait a retry-after hint in e's message asks for,
// and whether there is one. It reads "retry-after-ms: 1500"
// (milliseconds), "Retry-After: 5" and "retry_after": 12 (a bare number
// is seconds, as in RFC 9110 §10.2.3), "retry after 30s", "retry after 30
// seconds", "try again in 1m30s" (OpenAI's wording) and "retryDelay":
// "30s" (Google's RetryInfo). An HTTP-date Retry-After is not read (it
// needs the time the response was sent). The runtime is expected to copy
// the provider's retry-after header into the error message it records.
func RetryAfter(e events.ErrorInfo) (time.Duration, bool) {
	msg := e.Message
	if m := reRetryAfterMS.FindStringSubmatch(msg); m != nil {
		if f, err := strconv.ParseFloat(m[1], 64); err == nil {
			return time.Duration(f * float64(time.Millisecond)), true
		}
	}
	if m := reRetryAfterGo.FindStringSubmatch(msg); m != nil {
		if d, err := time.ParseDuration(strings.ToLower(m[1])); err == nil {
			return d, true
		}
	}
	if m := reRetryAfter.FindStringSubmatch(msg); m != nil {
		f, err := strconv.ParseFloat(m[1], 64)
		if err != nil {
			return 0, false
		}
		unit := time.Second
		switch u := strings.ToLower(m[2]); {
		case strings.HasPrefix(u, "milli"):
			unit = time.Millisecond
		case strings.HasPrefix(u, "min"):
			unit = time.Minute
		case strings.HasPrefix(u, "hour"):
			unit = time.Hour
		}
		return time.Duration(f * float64(unit)), true
	}
	return 0, false
}
