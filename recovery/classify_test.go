package recovery

import (
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		in   events.ErrorInfo
		want Class
	}{
		// Anthropic API (docs.claude.com/en/api/errors).
		{"anthropic 529 overloaded", events.ErrorInfo{Message: "Overloaded", HTTPStatus: 529, Code: "overloaded_error", Provider: "anthropic"}, ClassOverloaded},
		{"anthropic 429 rate limit", events.ErrorInfo{Message: "Number of request tokens has exceeded your per-minute rate limit", HTTPStatus: 429, Code: "rate_limit_error"}, ClassRateLimit},
		{"anthropic 400 invalid request", events.ErrorInfo{Message: "messages: roles must alternate between \"user\" and \"assistant\"", HTTPStatus: 400, Code: "invalid_request_error"}, ClassInvalidRequest},
		{"anthropic 400 orphaned tool_use", events.ErrorInfo{Message: "messages.3: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_01A", HTTPStatus: 400, Code: "invalid_request_error"}, ClassInvalidRequest},
		{"anthropic 400 prompt too long", events.ErrorInfo{Message: "prompt is too long: 215000 tokens > 200000 maximum", HTTPStatus: 400, Code: "invalid_request_error"}, ClassContextLength},
		{"anthropic 400 context limit with max_tokens", events.ErrorInfo{Message: "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease input length or `max_tokens` and try again", HTTPStatus: 400}, ClassContextLength},
		{"anthropic 401", events.ErrorInfo{Message: "invalid x-api-key", HTTPStatus: 401, Code: "authentication_error"}, ClassAuthentication},
		{"anthropic 403", events.ErrorInfo{Message: "Your API key does not have permission to use the specified resource.", HTTPStatus: 403, Code: "permission_error"}, ClassAuthentication},
		{"anthropic 404 model", events.ErrorInfo{Message: "model: claude-9", HTTPStatus: 404, Code: "not_found_error"}, ClassInvalidRequest},
		{"anthropic 413", events.ErrorInfo{Message: "Request exceeds the maximum allowed number of bytes.", HTTPStatus: 413, Code: "request_too_large"}, ClassContextLength},
		{"anthropic 500", events.ErrorInfo{Message: "Internal server error", HTTPStatus: 500, Code: "api_error"}, ClassServer},
		{"anthropic streaming overloaded (no status)", events.ErrorInfo{Message: "Overloaded", Code: "overloaded_error"}, ClassOverloaded},
		{"anthropic credit balance", events.ErrorInfo{Message: "Your credit balance is too low to access the Anthropic API.", HTTPStatus: 400, Code: "invalid_request_error"}, ClassAuthentication},
		{"claude code API Error text", events.ErrorInfo{Message: "API Error: 529 {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}"}, ClassOverloaded},
		{"sdk leading status with embedded type", events.ErrorInfo{Message: `429 {"type":"error","error":{"type":"rate_limit_error","message":"This request would exceed the rate limit for your organization"}}`}, ClassRateLimit},
		{"embedded type only", events.ErrorInfo{Message: `{"type":"error","error":{"type":"api_error","message":"Internal server error"}}`}, ClassServer},
		{"embedded prompt too long", events.ErrorInfo{Message: `API Error: 400 {"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 201234 tokens > 200000 maximum"}}`}, ClassContextLength},
		// OpenAI.
		{"openai context length", events.ErrorInfo{Message: "This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens. Please reduce the length of the messages.", HTTPStatus: 400, Code: "context_length_exceeded"}, ClassContextLength},
		{"openai insufficient quota on 429", events.ErrorInfo{Message: "You exceeded your current quota, please check your plan and billing details.", HTTPStatus: 429, Code: "insufficient_quota"}, ClassAuthentication},
		{"openai rate limit", events.ErrorInfo{Message: "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000. Please try again in 6s.", HTTPStatus: 429, Code: "rate_limit_exceeded"}, ClassRateLimit},
		{"openai invalid key", events.ErrorInfo{Message: "Incorrect API key provided: sk-proj-****. You can find your API key at https://platform.openai.com/account/api-keys.", HTTPStatus: 401, Code: "invalid_api_key"}, ClassAuthentication},
		{"openai 503", events.ErrorInfo{Message: "The server is overloaded or not ready yet.", HTTPStatus: 503}, ClassOverloaded},
		{"openai python sdk text", events.ErrorInfo{Message: "Error code: 502 - {'error': {'message': 'Bad gateway.', 'type': 'cf_bad_gateway'}}"}, ClassServer},
		{"openai connection error", events.ErrorInfo{Message: "APIConnectionError: Connection error."}, ClassNetwork},
		{"openai timeout", events.ErrorInfo{Message: "Request timed out."}, ClassTimeout},
		// Google.
		{"gemini resource exhausted", events.ErrorInfo{Message: "Quota exceeded for quota metric 'Generate Content API requests per minute'", Code: "RESOURCE_EXHAUSTED"}, ClassRateLimit},
		{"gemini unavailable", events.ErrorInfo{Message: "The model is overloaded. Please try again later.", Code: "UNAVAILABLE"}, ClassOverloaded},
		// HTTP status rules.
		{"408", events.ErrorInfo{Message: "Request Timeout", HTTPStatus: 408}, ClassTimeout},
		{"504", events.ErrorInfo{Message: "Gateway Timeout", HTTPStatus: 504}, ClassTimeout},
		{"502", events.ErrorInfo{Message: "Bad Gateway", HTTPStatus: 502}, ClassServer},
		{"422", events.ErrorInfo{Message: "Unprocessable Entity", HTTPStatus: 422}, ClassInvalidRequest},
		{"402 payment", events.ErrorInfo{Message: "Payment Required", HTTPStatus: 402}, ClassAuthentication},
		{"status beats text", events.ErrorInfo{Message: "read tcp 10.0.0.1:55000->1.2.3.4:443: read: connection reset by peer", HTTPStatus: 500}, ClassServer},
		{"status beats code", events.ErrorInfo{Message: "oops", HTTPStatus: 429, Code: "api_error"}, ClassRateLimit},
		{"401 before generic 4xx", events.ErrorInfo{Message: "Unauthorized", HTTPStatus: 401, Code: "invalid_request_error"}, ClassAuthentication},
		{"2xx status ignored", events.ErrorInfo{Message: "stream ended: overloaded_error", HTTPStatus: 200}, ClassOverloaded},
		// Go net and context errors.
		{"go connection refused", events.ErrorInfo{Message: "Post \"https://api.anthropic.com/v1/messages\": dial tcp 127.0.0.1:443: connect: connection refused"}, ClassNetwork},
		{"go connection reset", events.ErrorInfo{Message: "read tcp 10.0.0.2:51234->160.79.104.10:443: read: connection reset by peer"}, ClassNetwork},
		{"go EOF", events.ErrorInfo{Message: "Post \"https://api.openai.com/v1/chat/completions\": EOF"}, ClassNetwork},
		{"go unexpected EOF", events.ErrorInfo{Message: "unexpected EOF"}, ClassNetwork},
		{"go dns", events.ErrorInfo{Message: "dial tcp: lookup api.anthropic.com on 127.0.0.53:53: no such host"}, ClassNetwork},
		{"go no route", events.ErrorInfo{Message: "dial tcp 10.1.2.3:443: connect: no route to host"}, ClassNetwork},
		{"go deadline", events.ErrorInfo{Message: "context deadline exceeded"}, ClassTimeout},
		{"go client timeout", events.ErrorInfo{Message: "Post \"https://api.anthropic.com/v1/messages\": net/http: request canceled (Client.Timeout exceeded while awaiting headers)"}, ClassTimeout},
		{"go i/o timeout", events.ErrorInfo{Message: "dial tcp 1.2.3.4:443: i/o timeout"}, ClassTimeout},
		{"node econnreset code", events.ErrorInfo{Message: "socket hang up", Code: "ECONNRESET"}, ClassNetwork},
		// NATS.
		{"nats no responders", events.ErrorInfo{Message: "nats: no responders available for request"}, ClassRuntimeUnavailable},
		// Resources.
		{"node heap oom", events.ErrorInfo{Message: "FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory"}, ClassResource},
		{"oom killed", events.ErrorInfo{Message: "process exited: signal: killed (OOM)"}, ClassResource},
		{"disk full", events.ErrorInfo{Message: "write /var/lib/agent/session.jsonl: no space left on device"}, ClassResource},
		{"enospc code", events.ErrorInfo{Message: "write failed", Code: "ENOSPC"}, ClassResource},
		{"room is not oom", events.ErrorInfo{Message: "no room for the bathroom plan"}, ClassUnknown},
		// Tools and parsing.
		{"tool failed with its own network error", events.ErrorInfo{Message: "tool execution failed: WebFetch: dial tcp 93.184.216.34:443: connect: connection refused"}, ClassToolError},
		{"tool error code", events.ErrorInfo{Message: "exit status 1", Code: "tool_error"}, ClassToolError},
		{"go json syntax", events.ErrorInfo{Message: "invalid character '<' looking for beginning of value"}, ClassParseError},
		{"go json truncated", events.ErrorInfo{Message: "unexpected end of JSON input"}, ClassParseError},
		{"go json unmarshal", events.ErrorInfo{Message: "json: cannot unmarshal string into Go struct field Plan.steps of type []main.Step"}, ClassParseError},
		{"python json", events.ErrorInfo{Message: "JSONDecodeError: Expecting value: line 1 column 1 (char 0)"}, ClassParseError},
		// Kind fallback.
		{"logic kind", events.ErrorInfo{Message: "TypeError: cannot read properties of undefined (reading 'map')", Kind: events.KindLogic}, ClassInvalidRequest},
		{"transient kind", events.ErrorInfo{Message: "something odd", Kind: events.KindTransient}, ClassUnknown},
		{"empty", events.ErrorInfo{}, ClassUnknown},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(tt.in); got != tt.want {
				t.Errorf("Classify(%+v) = %s, want %s", tt.in, got, tt.want)
			}
		})
	}
}

func TestInfo(t *testing.T) {
	for _, c := range Classes {
		if !c.Valid() {
			t.Errorf("%s: not valid", c)
		}
		info := Info(c)
		if info.Severity == "" || info.Action == "" {
			t.Errorf("%s: incomplete info %+v", c, info)
		}
	}
	if len(Classes) != len(classInfo) {
		t.Errorf("Classes has %d classes, classInfo %d", len(Classes), len(classInfo))
	}
	for _, c := range []Class{ClassAuthentication, ClassInvalidRequest, ClassContextLength, ClassRuntimeUnavailable, ClassResource} {
		if Info(c).Retryable {
			t.Errorf("%s must not be retryable", c)
		}
	}
	if !Info(ClassRateLimit).HonoursRetryAfter {
		t.Error("rate_limit must honour retry-after")
	}
	if Info(ClassContextLength).Action != SuggestDistill {
		t.Errorf("context_length action = %s", Info(ClassContextLength).Action)
	}
	if Info(ClassToolError).ProviderFault {
		t.Error("a tool error must not count against the provider")
	}
	if Info("nonsense") != Info(ClassUnknown) {
		t.Error("an unknown class value must get ClassUnknown's info")
	}
}

func TestRetryAfter(t *testing.T) {
	tests := []struct {
		msg  string
		want time.Duration
		ok   bool
	}{
		{"rate limited; retry-after: 12", 12 * time.Second, true},
		{"Retry-After: 5", 5 * time.Second, true},
		{"please retry after 30s", 30 * time.Second, true},
		{"retry after 30 seconds", 30 * time.Second, true},
		{"retry after 2 minutes", 2 * time.Minute, true},
		{`{"error":{"retry_after": 7}}`, 7 * time.Second, true},
		{"retry-after-ms: 1500", 1500 * time.Millisecond, true},
		{"Please try again in 6m0s.", 6 * time.Minute, true},
		{"Please try again in 1.5s.", 1500 * time.Millisecond, true},
		{"Please try again in 120ms.", 120 * time.Millisecond, true},
		{`"retryDelay": "30s"`, 30 * time.Second, true},
		{"Retry-After: 0", 0, true},
		{"Retry-After: Wed, 21 Oct 2015 07:28:00 GMT", 0, false},
		{"rate limited", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		got, ok := RetryAfter(events.ErrorInfo{Message: tt.msg})
		if got != tt.want || ok != tt.ok {
			t.Errorf("RetryAfter(%q) = %s, %v; want %s, %v", tt.msg, got, ok, tt.want, tt.ok)
		}
	}
}
