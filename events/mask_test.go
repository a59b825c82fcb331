package events

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestMaskString(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"bearer header", "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", "Authorization: Bearer [REDACTED]"},
		{"bearer lower case", "curl -H 'authorization: bearer abcdefgh12345678'", "curl -H 'authorization: bearer [REDACTED]'"},
		{"api_key query", "GET /v1/x?api_key=abc123def456&page=2", "GET /v1/x?api_key=[REDACTED]&page=2"},
		{"apikey spaced", "apikey = QWERTY123456", "apikey = [REDACTED]"},
		{"x-api-key header", "x-api-key: 0123456789abcdef", "x-api-key: [REDACTED]"},
		{"aws access key id", "key AKIAIOSFODNN7EXAMPLE in env", "key [REDACTED] in env"},
		{"aws temporary key id", "ASIAY34FZKBOKMUTVV7A", "[REDACTED]"},
		{"password pair", "connect host=db password=hunter2 user=app", "connect host=db password=[REDACTED] user=app"},
		{"secret pair", "SECRET=abcd1234", "SECRET=[REDACTED]"},
		{"client_secret pair", "client_secret=xyz987", "client_secret=[REDACTED]"},
		{"url credentials", "dial postgres://app:s3cr3t@db:5432/x failed", "dial postgres://app:[REDACTED]@db:5432/x failed"},
		{"https credentials", "https://user:pass@example.com/path", "https://user:[REDACTED]@example.com/path"},
		{"anthropic key", "using sk-ant-api03-AbCdEf0123456789_xyz-QQ", "using [REDACTED]"},
		{"openai key", "OPENAI_API_KEY is sk-proj-abcdefghijklmnop1234", "OPENAI_API_KEY is [REDACTED]"},
		{"github token", "token ghp_abcdefghijklmnopqrstuvwxyz0123456789", "token [REDACTED]"},
		{"github fine-grained", "github_pat_11ABCDEFG0123456789_abcdefghij", "[REDACTED]"},
		{"several in one", "Bearer abcdefgh12345678 and password=x1y2z3", "Bearer [REDACTED] and password=[REDACTED]"},

		{"plain prose untouched", "The tests passed; the keyboard has 104 keys.", "The tests passed; the keyboard has 104 keys."},
		{"url without credentials", "see https://example.com/a?b=c", "see https://example.com/a?b=c"},
		{"word password alone", "enter your password below", "enter your password below"},
		{"short bearer word", "the bearer of bad news", "the bearer of bad news"},
		{"sk- too short", "risk-free and sk-1", "risk-free and sk-1"},
		{"tool ids", "toolu_01JKbMKFCtndxnCL8yD5BV9v", "toolu_01JKbMKFCtndxnCL8yD5BV9v"},
		{"code with key variable", "for key, value := range m {", "for key, value := range m {"},
		{"empty", "", ""},
		{"already masked", "password=[REDACTED]", "password=[REDACTED]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := MaskString(tt.in)
			if got != tt.want {
				t.Errorf("MaskString(%q)\n got %q\nwant %q", tt.in, got, tt.want)
			}
			if again := MaskString(got); again != got {
				t.Errorf("not idempotent: %q -> %q", got, again)
			}
		})
	}
}

func TestMaskJSONMasksEveryStringValueAndKeepsShape(t *testing.T) {
	in := []byte(`{"message":"401 for Bearer abcdefgh12345678","nested":{"list":["ok","password=p4ss"]},"n":12345678901234567890,"key":"plain"}`)
	out := MaskJSON(in)
	var v map[string]any
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("masked data is not JSON: %v\n%s", err, out)
	}
	s := string(out)
	for _, secret := range []string{"abcdefgh12345678", "p4ss"} {
		if strings.Contains(s, secret) {
			t.Errorf("secret %q survived: %s", secret, s)
		}
	}
	if !strings.Contains(s, "12345678901234567890") {
		t.Errorf("big number changed: %s", s)
	}
	if !strings.Contains(s, `"key":"plain"`) {
		t.Errorf("untouched value changed: %s", s)
	}
}

func TestMaskJSONWithoutSecretsReturnsInputUnchanged(t *testing.T) {
	in := []byte(`{"role":"user","content":[{"type":"text","text":"hello <world> & friends"}]}`)
	out := MaskJSON(in)
	if string(out) != string(in) {
		t.Fatalf("changed: %s", out)
	}
}

func TestMaskEventReportsChange(t *testing.T) {
	ev := Event{Data: []byte(`{"message":"dial https://u:p4ssw0rd@h failed"}`)}
	if !Mask(&ev) {
		t.Fatal("Mask reported no change")
	}
	if strings.Contains(string(ev.Data), "p4ssw0rd") {
		t.Fatalf("not masked: %s", ev.Data)
	}
	if Mask(&ev) {
		t.Fatal("second Mask reported a change")
	}
}
