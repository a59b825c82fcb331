package test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/enginetest"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/refruntime"
)

// secretForms are the forms of docs/masking.md, each in a text a tool or
// an error could print, with the part that must never be stored or shown.
var secretForms = []struct{ text, secret string }{
	{"Authorization: Bearer abcdefgh12345678bearer", "abcdefgh12345678bearer"},
	{"Authorization: Basic dXNlcjpodW50ZXIy", "dXNlcjpodW50ZXIy"},
	{`"Authorization": "Basic dXNlcjpzM2NyM3Q="`, "dXNlcjpzM2NyM3Q"},
	{"sent basic YWxhZGRpbjpvcGVuc2VzYW1l to the proxy", "YWxhZGRpbjpvcGVuc2VzYW1l"},
	{"curl -u admin:hunter2curl https://api.example.com/x", "hunter2curl"},
	{"dial postgres://app:s3cr3turl@db:5432/x failed", "s3cr3turl"},
	{"redis://:hunter2redis@cache:6379/0", "hunter2redis"},
	{"password: hunter2colon", "hunter2colon"},
	{"GET /v1/x?api_key=abc123query&page=2", "abc123query"},
	{`{ "password" : "hunter2jsontext" , "user": "bob" }`, "hunter2jsontext"},
	{`{\"password\":\"hunter2nested\",\"user\":\"bob\"}`, "hunter2nested"},
	{`{'password': 'hunter2python', 'user': 'bob'}`, "hunter2python"},
	{`password := "hunter2golang"`, "hunter2golang"},
	{"**Password:** hunter2markdown", "hunter2markdown"},
	{"DB_PASSWORD=hunter2env", "hunter2env"},
	{`export OPENAI_API_KEY="sk-proj-aBcDeFgHiJkLmNoPqRsTuV0123"`, "aBcDeFgHiJkLmNoPqRsTuV0123"},
	{"GITHUB_TOKEN=ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789", "aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"},
	{"WEBHOOK_SECRET=whatever-it-is-hook", "whatever-it-is-hook"},
	{"AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"},
	{"      POSTGRES_PASSWORD: examplecompose", "examplecompose"},
	{`const apiKey = "abc123camel"`, "abc123camel"},
	{"X-Auth-Token: 0a1b2c3dauth", "0a1b2c3dauth"},
	{"x-api-key: 0123456789abcdefhdr", "0123456789abcdefhdr"},
	{"psql --password=hunter2flag -h db", "hunter2flag"},
	{"mytool --api-key abc123flagspace --verbose", "abc123flagspace"},
	{"Cookie: session=abc123cookie; theme=dark", "abc123cookie"},
	{"Set-Cookie: sid=31d4d96e407aad42; Path=/; Secure; HttpOnly", "31d4d96e407aad42"},
	{"-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA1c7+9zYx3Q0ZrW4mUv8gYk\nHnQwL2rDk5sT7uV9wXyZaBcDeFgHiJkLmNo==\n-----END RSA PRIVATE KEY-----", "MIIEpAIBAAKCAQEA1c7"},
	{"cat id_rsa\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"},
	{"got eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c back", "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"},
	{"key AKIAIOSFODNN7EXAMPLE in env", "AKIAIOSFODNN7EXAMPLE"},
	{"ASIAY34FZKBOKMUTVV7A", "ASIAY34FZKBOKMUTVV7A"},
	{"using sk-ant-api03-AbCdEf0123456789_xyz-QQ", "AbCdEf0123456789_xyz-QQ"},
	{"sk_live_51H8aBcDeFgHiJkLmNoPq", "51H8aBcDeFgHiJkLmNoPq"},
	{"key sk_test_4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"},
	{"whsec_aBcDeFgHiJkLmNoPqRsTwh", "aBcDeFgHiJkLmNoPqRsTwh"},
	{"gho_aBcDeFgHiJkLmNoPqRsTuVwXyZ0gho99", "aBcDeFgHiJkLmNoPqRsTuVwXyZ0gho99"},
	{"github_pat_11ABCDEFG0123456789_abcdefghij", "11ABCDEFG0123456789_abcdefghij"},
	{"glpat-aBcDeFgHiJkLmNoPglab", "aBcDeFgHiJkLmNoPglab"},
	{"xoxb-2048-1024-aBcDeFgHiJkLmNoPqRsT", "2048-1024-aBcDeFgHiJkLmNoPqRsT"},
	{"xapp-1-A0123-4567-aBcDeFgHiJkL", "A0123-4567-aBcDeFgHiJkL"},
	{"AIzaSyA1234567890abcdefghijklmnopqrstuv", "SyA1234567890abcdefghijklmnopqrstuv"},
	{"hf_aBcDeFgHiJkLmNoPqRsTuVwXyZ0hface", "aBcDeFgHiJkLmNoPqRsTuVwXyZ0hface"},
	{"npm_aBcDeFgHiJkLmNoPqRsTuVwXyZ01234npmx", "aBcDeFgHiJkLmNoPqRsTuVwXyZ01234npmx"},
	{"pypi-AgEIcHlwaS5vcmcCJDAwMDAwMDAwLTAwMDAtMDAwMC0wMDAwLTAwMDAwMDAwMDAwMAACKlsz", "AgEIcHlwaS5vcmcCJDAwMDAwMDAwLTAwMDAtMDAwMC0wMDAw"},
}

// sourceSecrets are in the envelope's source.
const leakySource = "https://agent:pwsrc9a8b@collector.example/x?token=srctok77x"

var sourceSecrets = []string{"pwsrc9a8b", "srctok77x"}

// allSecrets is every secret text joined, as one tool output would show it.
func allSecrets() string {
	var b strings.Builder
	for _, f := range secretForms {
		b.WriteString(f.text)
		b.WriteString("\n")
	}
	return b.String()
}

// findSecrets returns the secrets found in b, naming where.
func findSecrets(where string, b []byte) []string {
	var found []string
	check := func(secret string) {
		if bytes.Contains(b, []byte(secret)) {
			found = append(found, fmt.Sprintf("%s holds %q", where, secret))
		}
	}
	for _, f := range secretForms {
		check(f.secret)
	}
	for _, s := range sourceSecrets {
		check(s)
	}
	return found
}

// rawEvent is an event as a client in another language writes it: JSON
// text, no Go library.
func rawEvent(typ, tenant, session, turn, data string) (id string, body []byte) {
	id = ulid.Make().String()
	turnAttr := ""
	if turn != "" {
		turnAttr = fmt.Sprintf(`,"turn":%q`, turn)
	}
	src, _ := json.Marshal(leakySource)
	return id, fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"type":%q,"source":%s,"time":%q,"tenant":%q,"session":%q%s,"data":%s}`,
		id, typ, src, time.Now().UTC().Format(time.RFC3339Nano), tenant, session, turnAttr, data)
}

// quote is a JSON string literal.
func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestSecretsFromARawClientNeverReachTheLog: with an engine process and a
// worker running, a plain NATS client sends hand-written JSON holding
// every secret form of docs/masking.md in a tool_use input, a tool_result,
// an error's message and stack and the envelope's source, leaves a tool
// call orphaned (the reconciler abandons the turn and repairs it: commands
// exist), has an invalid event with the secrets quarantined, and a person
// issues a command whose --reason quotes them. No stored message of any
// stream (a raw get of every sequence; AGENT_EVENTS by direct get) holds
// one, and neither do inspect, replay, recovery list, rejects or sessions.
func TestSecretsFromARawClientNeverReachTheLog(t *testing.T) {
	skipShort(t, "runs engine processes")
	parallel(t)
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte("turn_deadline: 1s\ntool_deadline: 1s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	eng := startEngine(t, filepath.Join(dir, "data"), "--policy", policy, "--snapshot-every", "3")
	startProc(t, eng.url, "worker")
	nc, err := nats.Connect(eng.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const tenant, session = "raw", "leaky"
	subject := events.EventSubject(tenant, session)
	send := func(typ, turn, data string) {
		t.Helper()
		id, body := rawEvent(typ, tenant, session, turn, data)
		m := nats.NewMsg(subject)
		m.Header.Set("Nats-Msg-Id", id)
		m.Data = body
		resp, err := nc.RequestMsg(m, 10*time.Second)
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		var ack struct {
			Seq   uint64          `json:"seq"`
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal(resp.Data, &ack) != nil || ack.Seq == 0 {
			t.Fatalf("%s refused: %s", typ, resp.Data)
		}
	}
	all := quote(allSecrets())
	send("session.started", "", `{"runtime":"raw-client 0.1"}`)
	send("turn.started", "t1", `{"prompt":"deploy it"}`)
	send("message.appended", "t1", `{"role":"assistant","content":[{"type":"tool_use","id":"toolu_leak_1","name":"Bash","input":{"command":`+quote(secretForms[4].text)+`,"env":{"GITHUB_TOKEN":"ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789"}}}]}`)
	send("message.appended", "t1", `{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_leak_1","content":`+all+`}]}`)
	send("error.recorded", "t1", `{"message":`+all+`,"stack":`+all+`,"kind":"logic","consecutive":1}`)
	send("turn.completed", "t1", `{"reason":"end_turn"}`)
	// A turn that dies after its tool_use: the reconciler abandons it past
	// its 1 s deadline and has the orphan repaired.
	send("turn.started", "t2", `{"prompt":"now the migration"}`)
	send("message.appended", "t2", `{"role":"assistant","content":[{"type":"tool_use","id":"toolu_orphan_1","name":"Bash","input":{"command":`+all+`}}]}`)
	// An invalid event (a turn type without its turn) holding the secrets:
	// refused and quarantined.
	_, bad := rawEvent("turn.failed", tenant, session, "", `{"stage":"execute","error":{"message":`+all+`}}`)
	if resp, err := nc.Request(subject, bad, 10*time.Second); err != nil || !strings.Contains(string(resp.Data), "14000") {
		t.Fatalf("invalid event: %s %v", resp.Data, err)
	}
	// A person quotes the secrets in a command's reason.
	run(t, eng.url, "recovery", "issue", tenant+"/"+session, "--kind", "pause_session", "--reason", "saw these: "+allSecrets())

	// Wait for the repair and the pause to be done.
	deadline := time.Now().Add(60 * time.Second)
	for {
		out := run(t, eng.url, "recovery", "list", "--json")
		if strings.Contains(out, `"repair_orphans"`) && strings.Count(out, `"completed"`) >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no repair completed: %s", out)
		}
		time.Sleep(300 * time.Millisecond)
	}

	var leaks []string
	// Every stored message of every stream, by raw get; AGENT_EVENTS by
	// direct get, as a reader allowed direct gets would read it.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	names := js.StreamNames(ctx)
	var streams []string
	for n := range names.Name() {
		streams = append(streams, n)
	}
	stored := 0
	for _, name := range streams {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
			var data []byte
			if name == events.EventsStream {
				resp, err := nc.Request("$JS.API.DIRECT.GET."+name, fmt.Appendf(nil, `{"seq":%d}`, seq), 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if resp.Header.Get("Status") == "404" {
					continue
				}
				data = resp.Data
				for k, vs := range resp.Header {
					data = append(data, []byte(k+": "+strings.Join(vs, ","))...)
				}
			} else {
				msg, err := st.GetMsg(ctx, seq)
				if err != nil {
					continue // deleted or purged
				}
				data = append(msg.Data, []byte(msg.Subject)...)
				for k, vs := range msg.Header {
					data = append(data, []byte(k+": "+strings.Join(vs, ","))...)
				}
			}
			stored++
			leaks = append(leaks, findSecrets(fmt.Sprintf("%s seq %d", name, seq), data)...)
		}
	}
	if stored < 20 {
		t.Fatalf("only %d stored messages read back", stored)
	}
	for _, args := range [][]string{
		{"inspect", tenant + "/" + session, "--json"},
		{"inspect", tenant + "/" + session},
		{"replay", tenant + "/" + session, "--json"},
		{"replay", tenant + "/" + session},
		{"recovery", "list", "--json"},
		{"recovery", "list"},
		{"rejects", "--json"},
		{"rejects"},
		{"sessions", "--json"},
	} {
		out := run(t, eng.url, args...)
		if len(out) < 20 {
			t.Fatalf("engine %s printed almost nothing: %q", strings.Join(args, " "), out)
		}
		leaks = append(leaks, findSecrets("engine "+strings.Join(args, " "), []byte(out))...)
	}
	// The forms were there to be masked: the outputs show the masks.
	if out := run(t, eng.url, "replay", tenant+"/"+session, "--json"); !strings.Contains(out, "[REDACTED]") {
		t.Fatalf("replay shows no mask at all: %s", out)
	}
	if out := run(t, eng.url, "rejects", "--json"); !strings.Contains(out, "[REDACTED]") || !strings.Contains(out, `"subject": "agent.evt.raw.leaky"`) {
		t.Fatalf("rejects: %s", out)
	}
	var rejects []struct {
		Seq       uint64    `json:"seq"`
		At        time.Time `json:"at"`
		Subject   string    `json:"subject"`
		Tenant    string    `json:"tenant"`
		Session   string    `json:"session"`
		Publisher string    `json:"publisher"`
		Code      int       `json:"err_code"`
		Reason    string    `json:"reason"`
		Body      string    `json:"body"`
		BodyBytes int       `json:"body_bytes"`
		BodyCut   bool      `json:"body_cut"`
	}
	if err := json.Unmarshal([]byte(run(t, eng.url, "rejects", "--json", "--tenant", tenant, "--body-bytes", "100")), &rejects); err != nil {
		t.Fatal(err)
	}
	if len(rejects) != 1 || rejects[0].Seq == 0 || rejects[0].At.IsZero() || rejects[0].Tenant != tenant || rejects[0].Session != session ||
		rejects[0].Publisher == "" || rejects[0].Code != 14000 || !strings.Contains(rejects[0].Reason, "turn") ||
		len(rejects[0].Body) > 100 || !rejects[0].BodyCut || rejects[0].BodyBytes <= 100 {
		t.Fatalf("rejects --json --tenant %s: %+v", tenant, rejects)
	}
	if out := run(t, eng.url, "rejects", "--json", "--tenant", "nobody"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("rejects of a tenant with none: %s", out)
	}
	if len(leaks) > 0 {
		t.Fatalf("%d secrets reached stored bytes or output:\n%s", len(leaks), strings.Join(leaks, "\n"))
	}
}

// TestCrossTenantBodyLeavesTheOtherSessionAlone: a body naming tenant B's
// session, sent on tenant A's subject, is refused by the ingest; the same
// body written straight to A's stored subject (a buggy trusted writer) is
// filed by the projector under A's session as an invalid event. B's
// projection in the engine's memory and its latest snapshot stay
// byte-identical to a fresh fold of B's own log, and the index has no row
// the body names.
func TestCrossTenantBodyLeavesTheOtherSessionAlone(t *testing.T) {
	skipShort(t, "runs engine processes")
	parallel(t)
	ctx := context.Background()
	eng := enginetest.Start(t, enginetest.Options{SnapshotEvery: 3, RetentionEvery: -1})
	beta := eng.NewRuntime(t, refruntime.Config{Tenant: "beta"})
	for i := 0; i < 3; i++ {
		if _, err := beta.RunTurn(ctx, "victim", refruntime.TurnSpec{Prompt: "work", Tools: []refruntime.ToolSpec{{Name: "Read"}}}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := eng.Runtime.RunTurn(ctx, "attacker", refruntime.TurnSpec{Prompt: "hello"}); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(eng.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// A body that would, filed under B, start a turn that never ends and
	// move B's clock to 9999.
	forged := func() []byte {
		id := ulid.Make().String()
		return fmt.Appendf(nil, `{"specversion":"1.0","id":%q,"type":"turn.started","source":"urn:service:acme","time":"9999-12-31T23:59:59Z","tenant":"beta","session":"victim","turn":"forged","data":{"prompt":"x"}}`, id)
	}
	resp, err := nc.Request(events.EventSubject("acme", "attacker"), forged(), 5*time.Second)
	if err != nil || !strings.Contains(string(resp.Data), "14000") {
		t.Fatalf("the ingest did not refuse the body: %s %v", resp.Data, err)
	}
	p := events.Partition("acme", "attacker", eng.Log.Partitions())
	ack, err := eng.JS.Publish(ctx, events.StoredEventSubject(p, "acme", "attacker"), forged())
	if err != nil {
		t.Fatal(err)
	}
	// The projector filed it under A, as an invalid event.
	deadline := time.Now().Add(20 * time.Second)
	for {
		s, ok := eng.Projector.Session("acme", "attacker")
		if ok && s.LastSeq >= ack.Sequence {
			if s.Totals.InvalidEvents != 1 || len(s.InvalidEvents) != 1 || s.InvalidEvents[0].Seq != ack.Sequence {
				t.Fatalf("acme/attacker: invalid events %+v", s.InvalidEvents)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the projector did not fold the forged event")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// B: in memory and in its snapshot, exactly a fresh fold of its log.
	var log []events.Event
	if err := eng.Log.ReadSession(ctx, "beta", "victim", events.ReadOptions{}, func(ev events.Event) error {
		log = append(log, ev)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// B's partition folds on its own goroutine: wait until it has folded
	// what the log holds, then compare.
	var held *projections.Session
	for deadline := time.Now().Add(20 * time.Second); ; {
		s, ok := eng.Projector.Session("beta", "victim")
		if ok && s.LastSeq >= log[len(log)-1].Seq {
			held = s
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the engine does not hold beta/victim up to seq %d (holds %v)", log[len(log)-1].Seq, ok)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The log up to what the engine folded (it may have appended a
	// snapshot.taken since the read above).
	log = log[:0]
	if err := eng.Log.ReadSession(ctx, "beta", "victim", events.ReadOptions{UntilSeq: held.LastSeq}, func(ev events.Event) error {
		log = append(log, ev)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	fresh, _ := json.Marshal(projections.FoldLog(log))
	if got, _ := json.Marshal(held); !bytes.Equal(got, fresh) {
		t.Fatalf("beta/victim in memory differs from a fresh fold:\n%s", firstDiff(got, fresh))
	}
	store, _ := projections.NewSnapshotStore(eng.JS, projections.SnapshotConfig{})
	snap, err := store.Latest(ctx, "beta", "victim")
	if err != nil {
		t.Fatal(err)
	}
	var upTo []events.Event
	for _, ev := range log {
		if ev.Seq <= snap.CoversSeq {
			upTo = append(upTo, ev)
		}
	}
	want, _ := json.Marshal(projections.FoldLog(upTo))
	if got, _ := json.Marshal(snap.State); !bytes.Equal(got, want) {
		t.Fatalf("beta/victim's snapshot differs from a fresh fold up to seq %d:\n%s", snap.CoversSeq, firstDiff(got, want))
	}
	if held.Totals.InvalidEvents != 0 || len(held.InFlight) != 0 || held.LastTime.Year() == 9999 {
		t.Fatalf("beta/victim shows the forged event: %+v", held.Totals)
	}
	// The index: A's row names A; no row for anything else.
	time.Sleep(1500 * time.Millisecond)
	sums, err := projections.ReadIndex(ctx, eng.JS, projections.IndexFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range sums {
		if m.Session != "victim" && m.Session != "attacker" && !strings.HasPrefix(m.Session, "_") {
			t.Fatalf("index row for %s/%s", m.Tenant, m.Session)
		}
		if m.Session == "victim" && (m.Tenant != "beta" || m.Counts.TurnsInFlight != 0) {
			t.Fatalf("victim's index row: %+v", m)
		}
	}
}
