package refruntime_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/refruntime"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg  refruntime.Config
		want []string // substrings of the error; none: valid
	}{
		"minimal":       {refruntime.Config{Tenant: "acme"}, nil},
		"full":          {refruntime.Config{Tenant: "acme", Provider: "bedrock", Providers: []string{"anthropic", "bedrock"}, StageDelay: time.Millisecond}, nil},
		"no tenant":     {refruntime.Config{}, []string{"tenant"}},
		"bad tenant":    {refruntime.Config{Tenant: "a.b"}, []string{"tenant"}},
		"provider":      {refruntime.Config{Tenant: "acme", Provider: "x", Providers: []string{"anthropic"}}, []string{"provider: \"x\""}},
		"dup providers": {refruntime.Config{Tenant: "acme", Providers: []string{"a", "a", " "}}, []string{"twice", "blank"}},
		"negatives": {refruntime.Config{Tenant: "acme", StageDelay: -1, TurnDeadline: -1, ConflictRetries: -1},
			[]string{"stage delay", "turn deadline", "conflict retries"}},
		"spaces": {refruntime.Config{Tenant: "acme", Name: "a b", QueueGroup: "q q"}, []string{"name", "queue group"}},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
	if _, err := refruntime.New(nil, nil, refruntime.Config{}, nil); err == nil ||
		!strings.Contains(err.Error(), "nats connection") || !strings.Contains(err.Error(), "event log") || !strings.Contains(err.Error(), "tenant") {
		t.Errorf("New with nothing: %v", err)
	}
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	e := setup(t, func(c *refruntime.Config) { c.Providers = []string{"vertex", "bedrock"} })
	cfg := e.rt.Config()
	if cfg.Provider != "vertex" || cfg.Name != refruntime.DefaultName || cfg.Model != refruntime.DefaultModel ||
		cfg.QueueGroup != "refruntime-acme" || cfg.ConflictRetries != refruntime.DefaultConflictRetries {
		t.Errorf("defaults %+v", cfg)
	}
}

func TestParseFault(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]refruntime.Fault{
		"":                      nil,
		"crash-mid-tool":        refruntime.FaultCrashMidTool{},
		"hang":                  refruntime.FaultHang{},
		"stage-throws:history":  refruntime.FaultStageThrows{Stage: events.StageHistory},
		"stage-throws:finalize": refruntime.FaultStageThrows{Stage: events.StageFinalize},
		"provider:529":          refruntime.FaultProvider{Status: 529},
		"provider:429:30s":      refruntime.FaultProvider{Status: 429, RetryAfter: 30 * time.Second},
		"provider:401":          refruntime.FaultProvider{Status: 401},
	} {
		got, err := refruntime.ParseFault(in)
		if err != nil || got != want {
			t.Errorf("ParseFault(%q) = %v, %v; want %v", in, got, err, want)
		}
		if want != nil && want.String() != in {
			t.Errorf("%#v.String() = %q, want %q", want, want.String(), in)
		}
	}
	for _, in := range []string{"boom", "stage-throws", "stage-throws:deploy", "provider", "provider:abc", "provider:200", "provider:529:soon", "hang:1", "crash-mid-tool:x"} {
		if f, err := refruntime.ParseFault(in); !errors.Is(err, refruntime.ErrInvalidFault) {
			t.Errorf("ParseFault(%q) = %v, %v; want ErrInvalidFault", in, f, err)
		}
	}
}

func TestProviderError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		code   string
		kind   events.ErrorKind
	}{
		{400, "invalid_request_error", events.KindLogic},
		{401, "authentication_error", events.KindLogic},
		{403, "permission_error", events.KindLogic},
		{404, "not_found_error", events.KindLogic},
		{408, "timeout_error", events.KindTransient},
		{413, "request_too_large", events.KindLogic},
		{422, "invalid_request_error", events.KindLogic},
		{429, "rate_limit_error", events.KindTransient},
		{500, "api_error", events.KindTransient},
		{503, "api_error", events.KindTransient},
		{529, "overloaded_error", events.KindTransient},
	} {
		e := refruntime.ProviderError("bedrock", tc.status, time.Second)
		if e.Code != tc.code || e.Kind != tc.kind || e.HTTPStatus != tc.status || e.Provider != "bedrock" ||
			!strings.Contains(e.Message, "retry-after 1s") || !strings.Contains(e.Message, tc.code) {
			t.Errorf("%d: %+v", tc.status, e)
		}
	}
}
