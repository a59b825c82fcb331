package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// maskCase is one row of the masking tables: in masks to want.
type maskCase struct {
	name, in, want string
}

// Fake secrets of the right shapes, none of them real.
const (
	testJWT    = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
	testGHP    = "ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"
	testSlack  = "xoxb-2048-1024-aBcDeFgHiJkLmNoPqRsT"
	testOpenAI = "sk-proj-aBcDeFgHiJkLmNoPqRsTuV0123"
	testRSA    = "MIIEpAIBAAKCAQEA1c7+9zYx3Q0ZrW4mUv8gYk\nHnQwL2rDk5sT7uV9wXyZaBcDeFgHiJkLmNo=="
	testSSH    = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\nQyNTUxOQAAACDx2y0Wl5rQ3n8x3fJ9pQ=="
)

// maskStringCases are the forms MaskString masks, one row each.
var maskStringCases = []maskCase{
	// Kept from the first masker.
	{"bearer header", "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", "Authorization: Bearer [REDACTED]"},
	{"bearer lower case", "curl -H 'authorization: bearer abcdefgh12345678'", "curl -H 'authorization: bearer [REDACTED]'"},
	{"api_key query", "GET /v1/x?api_key=abc123def456&page=2", "GET /v1/x?api_key=[REDACTED]&page=2"},
	{"apikey spaced", "apikey = QWERTY123456", "apikey = [REDACTED]"},
	{"x-api-key header", "x-api-key: 0123456789abcdef", "x-api-key: [REDACTED]"},
	{"x-goog-api-key header", "X-Goog-Api-Key: AbCdEf0123", "X-Goog-Api-Key: [REDACTED]"},
	{"aws access key id", "key AKIAIOSFODNN7EXAMPLE in env", "key [REDACTED] in env"},
	{"aws temporary key id", "ASIAY34FZKBOKMUTVV7A", "[REDACTED]"},
	{"password pair", "connect host=db password=hunter2 user=app", "connect host=db password=[REDACTED] user=app"},
	{"secret pair", "SECRET=abcd1234", "SECRET=[REDACTED]"},
	{"client_secret pair", "client_secret=xyz987", "client_secret=[REDACTED]"},
	{"url credentials", "dial postgres://app:s3cr3t@db:5432/x failed", "dial postgres://app:[REDACTED]@db:5432/x failed"},
	{"https credentials", "https://user:pass@example.com/path", "https://user:[REDACTED]@example.com/path"},
	{"anthropic key", "using sk-ant-api03-AbCdEf0123456789_xyz-QQ", "using [REDACTED]"},
	{"openai key", "OPENAI_API_KEY is " + testOpenAI, "OPENAI_API_KEY is [REDACTED]"},
	{"github token", "token " + testGHP, "token [REDACTED]"},
	{"github fine-grained", "github_pat_11ABCDEFG0123456789_abcdefghij", "[REDACTED]"},
	{"several in one", "Bearer abcdefgh12345678 and password=x1y2z3", "Bearer [REDACTED] and password=[REDACTED]"},

	// key: value and JSON key/value, any quoting and spacing.
	{"password colon", "password: hunter2", "password: [REDACTED]"},
	{"password colon capital", "Password:correct-horse", "Password:[REDACTED]"},
	{"password yaml quoted", "  password: \"s3cr3t value\"\n  user: app", "  password: \"[REDACTED]\"\n  user: app"},
	{"password markdown bold", "**Password:** hunter2", "**Password:** [REDACTED]"},
	{"json pair", `{"password":"hunter2"}`, `{"password":"[REDACTED]"}`},
	{"json pair spaced", `{ "password" : "hunter2" , "user": "bob" }`, `{ "password" : "[REDACTED]" , "user": "bob" }`},
	{"json pair escaped quote in value", `{"password":"hun\"ter2","user":"bob"}`, `{"password":"[REDACTED]","user":"bob"}`},
	{"json pair unquoted number", `{"password": 123456}`, `{"password": [REDACTED]}`},
	{"json inside a json string", `{\"password\":\"hunter2\",\"user\":\"bob\"}`, `{\"password\":\"[REDACTED]\",\"user\":\"bob\"}`},
	{"python dict", `{'password': 'hunter2', 'user': 'bob'}`, `{'password': '[REDACTED]', 'user': 'bob'}`},
	{"go literal", `password := "hunter2"`, `password := "[REDACTED]"`},
	{"ruby hash", `:password => 'hunter2'`, `:password => '[REDACTED]'`},
	{"keyword argument", `connect(host="db", passwd="hunter2")`, `connect(host="db", passwd="[REDACTED]")`},
	{"passphrase", "passphrase=open sesame", "passphrase=[REDACTED] sesame"},
	{"camel case api key", `const apiKey = "abc123"`, `const apiKey = "[REDACTED]"`},
	{"camel case client secret", `clientSecret: 'xyz987'`, `clientSecret: '[REDACTED]'`},
	{"auth token header", "X-Auth-Token: 0a1b2c3d", "X-Auth-Token: [REDACTED]"},
	{"access token query", "GET /cb?access_token=ya29.a0AfH6&state=1", "GET /cb?access_token=[REDACTED]&state=1"},
	{"docker auth", `"auth": "dXNlcjpwYXNz"`, `"auth": "[REDACTED]"`},
	{"password flag equals", "psql --password=hunter2 -h db", "psql --password=[REDACTED] -h db"},
	{"api key flag space", "mytool --api-key abc123 --verbose", "mytool --api-key [REDACTED] --verbose"},
	{"token flag quoted", `gh auth login --with-token "tok123"`, `gh auth login --with-token "[REDACTED]"`},

	// HTTP Basic auth.
	{"basic header", "Authorization: Basic dXNlcjpodW50ZXIy", "Authorization: Basic [REDACTED]"},
	{"basic header in json text", `"Authorization": "Basic dXNlcjpodW50ZXIy"`, `"Authorization": "Basic [REDACTED]"`},
	{"proxy authorization", "Proxy-Authorization: Basic YWxhZGRpbjpvcGVuc2VzYW1l", "Proxy-Authorization: Basic [REDACTED]"},
	{"authorization other scheme", "Authorization: token 0123456789abcdef", "Authorization: token [REDACTED]"},
	{"authorization no scheme", "authorization=0123456789abcdef", "authorization=[REDACTED]"},
	{"basic credentials alone", "sent basic YWxhZGRpbjpvcGVuc2VzYW1l to the proxy", "sent basic [REDACTED] to the proxy"},
	{"curl user", "curl -u admin:hunter2 https://api.example.com/x", "curl -u admin:[REDACTED] https://api.example.com/x"},
	{"curl user long flag", "curl -s --user 'admin:hunter2' https://h", "curl -s --user 'admin:[REDACTED]' https://h"},
	{"url empty user", "redis://:hunter2@cache:6379/0", "redis://:[REDACTED]@cache:6379/0"},
	{"url password with at", "https://bob:p@ss@host/x", "https://bob:[REDACTED]@host/x"},

	// Bare JWTs.
	{"jwt bare", "got " + testJWT + " back", "got [REDACTED] back"},
	{"jwt no signature", "eyJhbGciOiJub25lIn0.eyJzdWIiOiIxMjM0In0.", "[REDACTED]"},

	// PEM private keys.
	{"pem rsa", "-----BEGIN RSA PRIVATE KEY-----\n" + testRSA + "\n-----END RSA PRIVATE KEY-----",
		"-----BEGIN RSA PRIVATE KEY-----\n[REDACTED]\n-----END RSA PRIVATE KEY-----"},
	{"pem pkcs8 in prose", "key:\n-----BEGIN PRIVATE KEY-----\r\n" + testRSA + "\r\n-----END PRIVATE KEY-----\nkeep this",
		"key:\n-----BEGIN PRIVATE KEY-----\r\n[REDACTED]\r\n-----END PRIVATE KEY-----\nkeep this"},
	{"pem ec", "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkg4LVWM9nuwNSk3yByxZpYRTBnVJk5oqMBmYy0pD9YoAoGCCqGSM49\n-----END EC PRIVATE KEY-----",
		"-----BEGIN EC PRIVATE KEY-----\n[REDACTED]\n-----END EC PRIVATE KEY-----"},
	{"pem openssh", "-----BEGIN OPENSSH PRIVATE KEY-----\n" + testSSH + "\n-----END OPENSSH PRIVATE KEY-----\n",
		"-----BEGIN OPENSSH PRIVATE KEY-----\n[REDACTED]\n-----END OPENSSH PRIVATE KEY-----\n"},
	{"pem encrypted with headers", "-----BEGIN ENCRYPTED PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,3F17F5316E2BAC89\n\n" + testRSA + "\n-----END ENCRYPTED PRIVATE KEY-----",
		"-----BEGIN ENCRYPTED PRIVATE KEY-----\n[REDACTED]\n-----END ENCRYPTED PRIVATE KEY-----"},
	{"pem pgp", "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF0A" + testRSA + "\n-----END PGP PRIVATE KEY BLOCK-----",
		"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n[REDACTED]\n-----END PGP PRIVATE KEY BLOCK-----"},
	{"pem escaped newlines", `"-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA1c7\n-----END RSA PRIVATE KEY-----\n"`,
		`"-----BEGIN RSA PRIVATE KEY-----\n[REDACTED]\n-----END RSA PRIVATE KEY-----\n"`},
	{"pem cut off", "cat id_rsa\n-----BEGIN RSA PRIVATE KEY-----\n" + testRSA + "\n",
		"cat id_rsa\n-----BEGIN RSA PRIVATE KEY-----\n[REDACTED]\n"},

	// Env assignments.
	{"aws secret access key", "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "AWS_SECRET_ACCESS_KEY=[REDACTED]"},
	{"aws credentials file", "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws_secret_access_key = [REDACTED]"},
	{"db password env", "DB_PASSWORD=hunter2", "DB_PASSWORD=[REDACTED]"},
	{"compose password", "      POSTGRES_PASSWORD: example", "      POSTGRES_PASSWORD: [REDACTED]"},
	{"github token env", "GITHUB_TOKEN=" + testGHP, "GITHUB_TOKEN=[REDACTED]"},
	{"openai key env quoted", `export OPENAI_API_KEY="` + testOpenAI + `"`, `export OPENAI_API_KEY="[REDACTED]"`},
	{"token env single quoted", "export SLACK_BOT_TOKEN='" + testSlack + "'", "export SLACK_BOT_TOKEN='[REDACTED]'"},
	{"any token env", "export MY_SERVICE_TOKEN=abc.def.ghi", "export MY_SERVICE_TOKEN=[REDACTED]"},
	{"any secret env", "WEBHOOK_SECRET=whatever-it-is", "WEBHOOK_SECRET=[REDACTED]"},
	{"any api key env", "SENDGRID_API_KEY=SG.abc.def", "SENDGRID_API_KEY=[REDACTED]"},
	{"private key env", "JWT_PRIVATE_KEY=abc123", "JWT_PRIVATE_KEY=[REDACTED]"},
	{"env dump", "HOME=/root\nDB_PASSWORD=hunter2\nPATH=/usr/bin", "HOME=/root\nDB_PASSWORD=[REDACTED]\nPATH=/usr/bin"},
	{"odbc pwd", "Server=db;Uid=app;Pwd=hunter2;", "Server=db;Uid=app;Pwd=[REDACTED];"},

	// Keys by prefix.
	{"stripe live", "sk_live_51H8aBcDeFgHiJkLmNoPq", "[REDACTED]"},
	{"stripe test", "key sk_test_4eC39HqLyjWDarjtT1zdp7dc", "key [REDACTED]"},
	{"stripe restricted", "rk_live_51H8aBcDeFgHiJkLmNoPq", "[REDACTED]"},
	{"stripe webhook secret", "whsec_aBcDeFgHiJkLmNoPqRsTuV", "[REDACTED]"},
	{"gitlab pat", "glpat-aBcDeFgHiJkLmNoPqRsT", "[REDACTED]"},
	{"gitlab runner", "glrt-aBcDeFgHiJkLmNoPqRsT12", "[REDACTED]"},
	{"github oauth", "gho_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345", "[REDACTED]"},
	{"github app", "ghs_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345", "[REDACTED]"},
	{"slack bot", testSlack, "[REDACTED]"},
	{"slack user", "xoxp-2048-1024-4096-aBcDeFgHiJkLmNoP", "[REDACTED]"},
	{"slack app", "xapp-1-A0123-4567-aBcDeFgHiJkL", "[REDACTED]"},
	{"google api key", "AIzaSyA1234567890abcdefghijklmnopqrstuv", "[REDACTED]"},
	{"hugging face", "hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ012345", "[REDACTED]"},
	{"npm", "npm_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", "[REDACTED]"},

	// Cookies.
	{"cookie header", "Cookie: session=abc123; theme=dark", "Cookie: [REDACTED]"},
	{"cookie in json text", `{"cookie": "sid=abc123"}`, `{"cookie": "[REDACTED]"}`},
	{"set-cookie header", "Set-Cookie: sid=31d4d96e407aad42; Path=/; Secure; HttpOnly", "Set-Cookie: sid=[REDACTED]; Path=/; Secure; HttpOnly"},
	{"set-cookie lower case", "set-cookie: id=a3fWa; Max-Age=2592000", "set-cookie: id=[REDACTED]; Max-Age=2592000"},
}

// maskUntouchedCases are texts MaskString must leave as they are.
var maskUntouchedCases = []maskCase{
	{name: "plain prose", in: "The tests passed; the keyboard has 104 keys."},
	{name: "url without credentials", in: "see https://example.com/a?b=c"},
	{name: "word password alone", in: "enter your password below"},
	{name: "password question", in: "Forgot password? Reset it from the login page."},
	{name: "password in a sentence", in: "The password is stored hashed, and the token expires after an hour."},
	{name: "short bearer word", in: "the bearer of bad news"},
	{name: "sk- too short", in: "risk-free and sk-1"},
	{name: "sk- inside words", in: "a risk-assessment-framework-overview and the desk-reservation-system-handbook"},
	{name: "tool ids", in: "toolu_01JKbMKFCtndxnCL8yD5BV9v"},
	{name: "code with key variable", in: "for key, value := range m {"},
	{name: "empty", in: ""},
	{name: "already masked", in: "password=[REDACTED]"},
	{name: "already masked header", in: "Authorization: Basic [REDACTED]"},
	{name: "go comparison", in: `if password == "" {`},
	{name: "go not equal", in: `if token != "" {`},
	{name: "go getenv", in: `password := os.Getenv("DB_PASSWORD")`},
	{name: "python getpass", in: "password = getpass.getpass()"},
	{name: "python environ", in: `token = os.environ["GITHUB_TOKEN"]`},
	{name: "js process env", in: "const token = process.env.GITHUB_TOKEN;"},
	{name: "js await call", in: "const apiKey = await clack.password({"},
	{name: "function signature", in: "def login(user, password):"},
	{name: "typescript type", in: "function login(user: string, password: string): Promise<void>"},
	{name: "python none", in: "password=None"},
	{name: "json null", in: `{"password": null, "token": true}`},
	{name: "keyword argument passed on", in: "connect(password=password)"},
	{name: "variable named for the secret", in: "params: { _csrf_token: csrfToken, apiKey: openaiApiKey }"},
	{name: "shell variable", in: `curl -u "$USER:$PASS" -H "Authorization: Bearer $TOKEN"`},
	{name: "template variables", in: "password: ${DB_PASSWORD}\ntoken: {{ .Values.token }}"},
	{name: "placeholder", in: `api_key: "<your-api-key>"`},
	{name: "format verb", in: `fmt.Sprintf("password=%s", pw)`},
	{name: "tokenizer config", in: `{"eos_token": "</s>", "pad_token": "<pad>"}`},
	{name: "token count", in: "token_count=5"},
	{name: "max tokens", in: "max_tokens: 4096, input_tokens=1234"},
	{name: "token number", in: "token: 5"},
	{name: "password file flag", in: "docker login --password-stdin --password-file=/run/pw"},
	{name: "password hash key", in: "password_hash: stored"},
	{name: "secret name key", in: "secretName: db-creds"},
	{name: "token type", in: `"token_type": "bearer"`},
	{name: "git sha", in: "commit a94a8fe5ccb19ba61c4c0873d391e987982fbbd3 (HEAD -> main)"},
	{name: "uuid", in: "session 123e4567-e89b-12d3-a456-426614174000 started"},
	{name: "base64 image", in: "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="},
	{name: "jwt header alone", in: "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9 is a JOSE header"},
	{name: "public certificate", in: "-----BEGIN CERTIFICATE-----\nMIIDdzCCAl+gAwIBAgIEAgAAuTANBgkqhkiG9w0BAQUFADBaMQswCQYDVQQGEwJJ\n-----END CERTIFICATE-----"},
	{name: "public key", in: "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----"},
	{name: "file paths", in: "/home/user/.ssh/id_rsa ~/.aws/credentials ./config/secrets.yaml C:\\Users\\bob\\token.txt"},
	{name: "pwd directory", in: "PWD=/work/wt-mask\nOLDPWD=~/src"},
	{name: "ssh git url", in: "git clone git@github.com:org/repo.git && ssh://git@github.com:22/org/repo"},
	{name: "url with port", in: "postgres://localhost:5432/db and http://host:8080/path?next=/a"},
	{name: "basic in prose", in: "Basic usage: run make, then basic authentication is supported"},
	{name: "authorization in prose", in: "Authorization header is missing"},
	{name: "auth true", in: "auth: true"},
	{name: "session cookie prose", in: "The session cookie is HttpOnly."},
	{name: "cookie from code", in: "cookie: req.headers.cookie, cookie: true"},
	{name: "prefix alone", in: "tokens start with ghp_ or glpat- or xoxb-"},
	{name: "asia in prose", in: "Asia-Pacific and ASIA regions"},
}

func TestMaskString(t *testing.T) {
	t.Parallel()
	for _, tt := range maskStringCases {
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

func TestMaskStringLeavesTextAlone(t *testing.T) {
	t.Parallel()
	for _, tt := range maskUntouchedCases {
		t.Run(tt.name, func(t *testing.T) {
			if got := MaskString(tt.in); got != tt.in {
				t.Errorf("MaskString(%q)\n got %q\nwant it unchanged", tt.in, got)
			}
		})
	}
}

// TestMaskStringInJSONStrings checks that every form is masked the same
// inside a JSON string: MaskJSON masks the decoded string, and the result
// is the masked text, as JSON.
func TestMaskStringInJSONStrings(t *testing.T) {
	t.Parallel()
	for _, tt := range maskStringCases {
		in, _ := json.Marshal(map[string]string{"text": tt.in})
		want, _ := json.Marshal(map[string]string{"text": tt.want})
		if got := MaskJSON(in); string(got) != string(marshalNoEscape(t, want)) {
			t.Errorf("%s: MaskJSON(%s)\n got %s\nwant %s", tt.name, in, got, want)
		}
	}
	for _, tt := range maskUntouchedCases {
		in, _ := json.Marshal(map[string]string{"text": tt.in})
		if got := MaskJSON(in); string(got) != string(in) {
			t.Errorf("%s: MaskJSON(%s) = %s, want it unchanged", tt.name, in, got)
		}
	}
}

// marshalNoEscape re-encodes b as MaskJSON encodes (no HTML escaping).
func marshalNoEscape(t *testing.T, b []byte) []byte {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	out, err := marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestMaskJSON(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
	}{
		{"secret key value", `{"password":"hunter2","user":"bob"}`, `{"password":"[REDACTED]","user":"bob"}`},
		{"secret key value with spaces", `{"password":"correct horse battery staple"}`, `{"password":"[REDACTED]"}`},
		{"env of a tool input", `{"command":"deploy","env":{"GITHUB_TOKEN":"abc123","PATH":"/usr/bin","DB_PASSWORD":"x"}}`,
			`{"command":"deploy","env":{"DB_PASSWORD":"[REDACTED]","GITHUB_TOKEN":"[REDACTED]","PATH":"/usr/bin"}}`},
		{"headers", `{"headers":{"Authorization":"Basic dXNlcjpwYXNz","Cookie":"sid=1; theme=dark","Accept":"*/*","X-Api-Key":"k1"}}`,
			`{"headers":{"Accept":"*/*","Authorization":"Basic [REDACTED]","Cookie":"[REDACTED]","X-Api-Key":"[REDACTED]"}}`},
		{"authorization without scheme", `{"authorization":"abc123"}`, `{"authorization":"[REDACTED]"}`},
		{"values that are not secrets", `{"token":5,"password":null,"secret":true,"api_key":"","pwd":"/home/x","auth":"none","token_count":"7"}`, ``},
		{"secret in a string that holds json", `{"text":"config: {\"password\": \"hunter2\"}"}`, `{"text":"config: {\"password\": \"[REDACTED]\"}"}`},
		{"secret key", `{"sk-ant-api03-aaaaaaaaaaaaaaaa":1,"ok":2}`, `{"[REDACTED]":1,"ok":2}`},
		{"secret keys that would collide", `{"sk-ant-api03-bbbbbbbbbbbbbbbb":2,"sk-ant-api03-aaaaaaaaaaaaaaaa":1,"[REDACTED]":3}`,
			`{"[REDACTED]":3,"[REDACTED]#2":1,"[REDACTED]#3":2}`},
		{"secret key partly masked", `{"url https://u:p4ss@h":true}`, `{"url https://u:[REDACTED]@h":true}`},
		{"big number kept", `{"message":"401 for Bearer abcdefgh12345678","n":12345678901234567890}`,
			`{"message":"401 for Bearer [REDACTED]","n":12345678901234567890}`},
		{"nested arrays", `[{"password":"a"},["token=b",{"k":"Cookie: c=d"}]]`, `[{"password":"[REDACTED]"},["token=[REDACTED]",{"k":"Cookie: [REDACTED]"}]]`},
		{"url behind an escaped slash", `{"url":"https:\/\/u:p4ss@h"}`, `{"url":"https://u:[REDACTED]@h"}`},
		{"key behind a unicode escape", `{"k":"sk\u002dproj-aaaaaaaaaaaaaaaaaaaa"}`, `{"k":"[REDACTED]"}`},
		{"secret key behind a unicode escape", `{"pass\u0077ord":"hunter2"}`, `{"password":"[REDACTED]"}`},
		{"no secret", `{"role":"user","content":[{"type":"text","text":"hello <world> & friends"}]}`, ``},
		{"not json", `{"password":"hunter2"`, ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.want
			if want == "" {
				want = tt.in
			}
			got := MaskJSON([]byte(tt.in))
			if string(got) != want {
				t.Fatalf("MaskJSON(%s)\n got %s\nwant %s", tt.in, got, want)
			}
			if tt.want == "" {
				return
			}
			if !json.Valid(got) {
				t.Fatalf("masked JSON is not valid: %s", got)
			}
			if dup := duplicateKey(t, got); dup != "" {
				t.Fatalf("masked JSON has key %q twice: %s", dup, got)
			}
			if again := MaskJSON(got); string(again) != string(got) {
				t.Fatalf("not idempotent:\n  %s\n  %s", got, again)
			}
			if got, want := MaskJSON([]byte(tt.in)), fpMaskJSON([]byte(tt.in)); string(got) != string(want) {
				t.Fatalf("fast path %s, rules alone %s", got, want)
			}
		})
	}
}

// duplicateKey returns a key that some object of the JSON value b holds
// twice, or "".
func duplicateKey(t *testing.T, b []byte) string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	type frame struct {
		obj     bool
		keys    map[string]bool
		wantKey bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return ""
		}
		if err != nil {
			t.Fatal(err)
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.obj && top.wantKey {
			if k, ok := tok.(string); ok {
				if top.keys[k] {
					return k
				}
				top.keys[k] = true
				top.wantKey = false
				continue
			}
		}
		switch tok {
		case json.Delim('{'):
			if top != nil && top.obj {
				top.wantKey = true
			}
			stack = append(stack, &frame{obj: true, keys: map[string]bool{}, wantKey: true})
		case json.Delim('['):
			if top != nil && top.obj {
				top.wantKey = true
			}
			stack = append(stack, &frame{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		default:
			if top != nil && top.obj {
				top.wantKey = true
			}
		}
	}
}

// TestSecretKeyWordsPassThePrefilter checks that MaskJSON's prefilter
// lets through every object key whose value it masks.
func TestSecretKeyWordsPassThePrefilter(t *testing.T) {
	t.Parallel()
	keys := []string{"Authorization", "Proxy-Authorization", "cookie", "Set-Cookie"}
	for _, w := range secretWords {
		keys = append(keys, w, strings.ToUpper(w), "MY_"+w, strings.ReplaceAll(w, "_", ""), strings.ReplaceAll(w, "_", "-"))
	}
	for _, k := range keys {
		if _, ok := secretKeyWord(k); !ok {
			t.Errorf("secretKeyWord(%q): not a secret key", k)
		}
		if b := []byte(`{"` + k + `":"v"}`); !mayHoldSecret(b) {
			t.Errorf("the prefilter skips %s", b)
		}
	}
	for _, k := range []string{"token_count", "max_tokens", "password_file", "key", "sort_key", "session", "secretName", "cookies", "author"} {
		if _, ok := secretKeyWord(k); ok {
			t.Errorf("secretKeyWord(%q): a secret key", k)
		}
	}
}

func TestMaskJSONWithoutSecretsReturnsInputUnchanged(t *testing.T) {
	t.Parallel()
	in := []byte(`{"role":"user","content":[{"type":"text","text":"hello <world> & friends"}]}`)
	out := MaskJSON(in)
	if string(out) != string(in) {
		t.Fatalf("changed: %s", out)
	}
}

func TestMaskEventReportsChange(t *testing.T) {
	t.Parallel()
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

// TestMaskEventSource checks that the envelope's source, free text a
// publisher sets, is masked, that the event stays valid, and that the ids
// and tokens are not touched.
func TestMaskEventSource(t *testing.T) {
	t.Parallel()
	ev, err := NewAt(time.Date(2026, 2, 19, 10, 0, 0, 0, time.UTC), "01JB8XZ2Y4K3M5N6P7Q8R9S0T1", "acme", "chat-1", "t1",
		&TurnStarted{Prompt: "hi", Trigger: "user"})
	if err != nil {
		t.Fatal(err)
	}
	ev.Source = "https://bot:hunter2@agents.example.com/billing?api_key=abc123"
	data := string(ev.Data)
	if !Mask(&ev) {
		t.Fatal("Mask reported no change")
	}
	if want := "https://bot:[REDACTED]@agents.example.com/billing?api_key=[REDACTED]"; ev.Source != want {
		t.Fatalf("source %q, want %q", ev.Source, want)
	}
	if string(ev.Data) != data || ev.ID != "01JB8XZ2Y4K3M5N6P7Q8R9S0T1" || ev.Tenant != "acme" || ev.Session != "chat-1" || ev.Turn != "t1" {
		t.Fatalf("Mask changed more than the source: %+v", ev)
	}
	if err := Validate(&ev); err != nil {
		t.Fatalf("masked event no longer validates: %v", err)
	}
	if Mask(&ev) {
		t.Fatal("second Mask reported a change")
	}
}

// TestMaskKeepsEveryPayloadValid masks a secret into every string field
// of every payload shape and checks that the event still validates.
func TestMaskKeepsEveryPayloadValid(t *testing.T) {
	t.Parallel()
	secret := "password=hunter2 Bearer abcdefgh12345678 " + testJWT
	seededN := 0
	for _, c := range fpSeeds(t) {
		if !json.Valid(c.data) || bytes.Contains(c.data, []byte("parent_session")) {
			continue
		}
		ev := Event{SpecVersion: SpecVersion, ID: "01JB8XZ2Y4K3M5N6P7Q8R9S0T1", Type: c.typ, Source: DefaultSource,
			Time: time.Date(2026, 2, 19, 10, 0, 0, 0, time.UTC), Tenant: "acme", Session: "s-1", Turn: "t1", Data: c.data}
		if Validate(&ev) != nil {
			continue
		}
		// Put the secret in every free-text string (not in enums or tokens).
		for _, field := range []string{"prompt", "message", "stack", "text", "reason", "detail", "summary", "thinking"} {
			seeded := bytes.ReplaceAll(c.data, []byte(`"`+field+`":"`), []byte(`"`+field+`":"`+secret+` `))
			ev.Data = seeded
			if bytes.Equal(seeded, c.data) || Validate(&ev) != nil {
				continue
			}
			seededN++
			Mask(&ev)
			if err := Validate(&ev); err != nil {
				t.Errorf("%s: masking %s made it invalid: %v", c.typ, seeded, err)
			}
			if bytes.Contains(ev.Data, []byte("hunter2")) {
				t.Errorf("%s: secret survived: %s", c.typ, ev.Data)
			}
		}
	}
	if seededN < 10 {
		t.Fatalf("only %d payloads took a secret", seededN)
	}
}

// TestManySecretKeysMaskInLinearTime: an object of 32,000 keys that are
// each a secret (900 KB, one event) is masked in time linear in its
// size, every key kept under its own name ([REDACTED], [REDACTED]#2, ...
// in sorted order of the keys before masking) with its value. Each
// renamed key once searched its name from #2: 16,000 such keys took 27 s,
// 32,000 about two minutes, while the append (and the ingest request)
// waited. The 20 s bound is that gap, not a figure of speed.
func TestManySecretKeysMaskInLinearTime(t *testing.T) {
	t.Parallel()
	const n = 32000
	var b strings.Builder
	b.WriteString("{")
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"sk-ant-api03-%016d":%d`, i, i)
	}
	b.WriteString("}")
	done := make(chan []byte, 1)
	go func() { done <- MaskJSON([]byte(b.String())) }()
	var got []byte
	select {
	case got = <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%d secret keys (%d bytes) not masked in 20 s", n, b.Len())
	}
	var m map[string]int
	if err := json.Unmarshal(got, &m); err != nil {
		t.Fatal(err)
	}
	if len(m) != n || m["[REDACTED]"] != 0 || m["[REDACTED]#2"] != 1 || m[fmt.Sprintf("[REDACTED]#%d", n)] != n-1 {
		t.Errorf("%d keys; [REDACTED]=%d, #2=%d, #%d=%d", len(m), m["[REDACTED]"], m["[REDACTED]#2"], n, m[fmt.Sprintf("[REDACTED]#%d", n)])
	}
}

// TestMaskingRenamedKeysTwiceChangesNothing: keys renamed by masking
// ("Cookie: [REDACTED]", "#2", ... "#11", where the Cookie rule masks the
// count away) are kept as they are by a second masking, which changes
// nothing; a client's key of that form is kept too, and a new secret key
// takes the next free name.
func TestMaskingRenamedKeysTwiceChangesNothing(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("{")
	for i := range 11 {
		fmt.Fprintf(&b, `"Cookie: A%02d=x":%d,`, i, i)
	}
	b.WriteString(`"sk-ant-api03-aaaaaaaaaaaaaaaa":11}`)
	once := MaskJSON([]byte(b.String()))
	if twice := MaskJSON(once); !bytes.Equal(twice, once) {
		t.Fatalf("masked twice:\n%s\nonce:\n%s", twice, once)
	}
	var m map[string]int
	if err := json.Unmarshal(once, &m); err != nil {
		t.Fatal(err)
	}
	if len(m) != 12 || m["Cookie: [REDACTED]"] != 0 || m["Cookie: [REDACTED]#2"] != 1 || m["Cookie: [REDACTED]#11"] != 10 || m["[REDACTED]"] != 11 {
		t.Errorf("masked once: %s", once)
	}
	got := MaskJSON([]byte(`{"Cookie: [REDACTED]#2":1,"Cookie: B=y":2}`))
	if want := `{"Cookie: [REDACTED]":2,"Cookie: [REDACTED]#2":1}`; string(got) != want {
		t.Errorf("a client's renamed-looking key beside a new secret: %s, want %s", got, want)
	}
}
