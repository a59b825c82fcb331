package test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// schemaBase is the $id prefix of the schemas in docs/schema.
const schemaBase = "https://github.com/turnstone-dev/turnstone/docs/schema/"

// loadSchemas compiles every schema of docs/schema (each under its $id,
// so that their relative $refs resolve among them) and returns them by
// file name. Formats (date-time) are asserted.
func loadSchemas(t *testing.T) map[string]*jsonschema.Schema {
	t.Helper()
	files, err := filepath.Glob("../docs/schema/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no schema in docs/schema: %v", err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if id, _ := doc.(map[string]any)["$id"].(string); id != schemaBase+filepath.Base(f) {
			t.Fatalf("%s: $id %q, want %q", f, id, schemaBase+filepath.Base(f))
		}
		if err := c.AddResource(schemaBase+filepath.Base(f), doc); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	out := map[string]*jsonschema.Schema{}
	for _, f := range files {
		s, err := c.Compile(schemaBase + filepath.Base(f))
		if err != nil {
			t.Fatalf("compile %s: %v", f, err)
		}
		out[filepath.Base(f)] = s
	}
	return out
}

// validate checks one JSON document against a schema, naming the command
// that printed it.
func validate(t *testing.T, s *jsonschema.Schema, what string, doc []byte) {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		t.Errorf("%s printed JSON that does not parse: %v\n%s", what, err, doc)
		return
	}
	if err := s.Validate(v); err != nil {
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			t.Errorf("%s does not match its schema:\n%v\n%s", what, ve, cutText(string(doc), 3000))
			return
		}
		t.Errorf("%s: %v", what, err)
	}
}

func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// TestJSONOutputsMatchTheirSchemas produces every `--json` output of the
// engine CLI on a real engine with a worker, from sessions that hold what
// the outputs can show (imported history, a crash abandoned by hand and
// repaired, a 401, a logic error, turns abandoned by their deadline, a
// refused event, an erase, a runtime that answers, a saved context), and
// validates each against its schema in docs/schema (docs/cli.md links
// them). Every schema is used, and every command with --json has one.
func TestJSONOutputsMatchTheirSchemas(t *testing.T) {
	skipShort(t, "runs every --json command against an engine process")
	parallel(t)
	schemas := loadSchemas(t)
	// The schemas can fail: an unknown key, a missing one, Go's zero time.
	for schema, doc := range map[string]string{
		"sessions.json": `[{"tenant":"a","session":"s","partition":0,"status":"idle","events":1,"first_seq":1,"last_seq":1,"counts":{},"extra":1}]`,
		"runtimes.json": `[{"id":"x","version":"1","metadata":{},"tenant":"a","sessions":"*","verified":true,"answered_at":"0001-01-01T00:00:00Z"}]`,
		"replay.json":   `{"replayed":0,"view":{}}`,
	} {
		v, _ := jsonschema.UnmarshalJSON(strings.NewReader(doc))
		if schemas[schema].Validate(v) == nil {
			t.Errorf("docs/schema/%s accepts %s", schema, doc)
		}
	}
	eng := startEngine(t, t.TempDir(), "--sync", "1s")
	startWorker(t, eng.url, "schema-worker")
	config := t.TempDir()
	env := append(withoutNATSURL(), "TURNSTONE_NATS_URL="+eng.url, "XDG_CONFIG_HOME="+config, "HOME="+config)
	engine := func(args ...string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "engine"), args...)
		cmd.Env = env
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			t.Fatalf("engine %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errOut.String())
		}
		return out.Bytes()
	}
	refruntime := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(binDir, "refruntime"), args...)
		cmd.Env = env
		out, err := cmd.Output()
		var exit *exec.ExitError
		if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 3) {
			t.Fatalf("refruntime %s: %v", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out))
	}
	// until polls engine ARGS until ok accepts its output.
	until := func(what string, ok func([]byte) bool, args ...string) []byte {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			out := engine(args...)
			if ok(out) {
				return out
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not reached in 30s; engine %s printed:\n%s", what, strings.Join(args, " "), cutText(string(out), 3000))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// History, and the runtime's faults.
	engine("import", "--format", "claude-code", "--tenant", "hist", "--quiet", filepath.Join(transcriptsDir, "spotter", "short.jsonl"))
	crash := refruntime("--tenant", "demo", "--turns", "2", "--fault", "crash-mid-tool", "--exit-on-crash")
	refruntime("--tenant", "auth", "--fault", "provider:401")
	refruntime("--tenant", "logic", "--fault", "stage-throws:history")
	refruntime("--tenant", "hang", "--sessions", "2", "--fault", "hang", "--turn-deadline", "1s")
	live := startProc(t, eng.url, "refruntime", "--tenant", "live", "--turns", "1", "--serve")
	var st struct {
		InFlight []string `json:"in_flight"`
	}
	if err := json.Unmarshal(engine("inspect", "demo/"+crash, "--json"), &st); err != nil || len(st.InFlight) != 1 {
		t.Fatalf("the crash left %v in flight (%v)", st.InFlight, err)
	}
	engine("recovery", "issue", "demo/"+crash, "--kind", "abandon_turn", "--turn", st.InFlight[0], "--reason", "runtime crashed")
	until("the crash repaired", func(b []byte) bool { return bytes.Contains(b, []byte("repair_orphans recovered")) },
		"sessions", "--tenant", "demo")
	until("the hung turns abandoned by their deadline", func(b []byte) bool { return bytes.Count(b, []byte("by its deadline")) == 2 },
		"sessions", "--tenant", "hang")
	// A refused event, quarantined.
	nc, err := nats.Connect(eng.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if m, err := nc.Request("agent.evt.demo.bad", []byte(`{"specversion":"1.0","type":"turn.started"}`), 5*time.Second); err != nil || !bytes.Contains(m.Data, []byte("error")) {
		t.Fatalf("an invalid event was not refused: %v %s", err, m.Data)
	}
	// A session erased (its audit record), and a saved context.
	erased := refruntime("--tenant", "gone", "--turns", "1")
	until("the session to erase indexed", func(b []byte) bool { return bytes.Contains(b, []byte(erased)) }, "sessions", "--tenant", "gone")
	engine("context", "save", "local", "--nats-url", eng.url, "--description", "the test's engine")
	engine("context", "save", "secure", "--nats-url", "tls://127.0.0.1:4223", "--nkey", "credentials/operator.nk", "--tls-ca", "certs/ca.pem", "--select")

	// Every output, against its schema.
	used := map[string]int{}
	check := func(schema string, doc []byte, args ...string) {
		t.Helper()
		s := schemas[schema]
		if s == nil {
			t.Fatalf("no schema docs/schema/%s", schema)
		}
		used[schema]++
		validate(t, s, "engine "+strings.Join(args, " "), doc)
	}
	nonEmpty := func(schema string, args ...string) {
		t.Helper()
		doc := engine(args...)
		var arr []json.RawMessage
		if json.Unmarshal(doc, &arr) == nil && len(arr) == 0 {
			t.Errorf("engine %s printed an empty array: the test checks nothing", strings.Join(args, " "))
		}
		check(schema, doc, args...)
	}
	ctx := "--context=local"
	nonEmpty("sessions.json", "sessions", "--json", ctx)
	check("sessions.json", engine("sessions", "--broken", "--json", ctx), "sessions", "--broken", "--json")
	check("inspect.json", engine("inspect", "demo/"+crash, "--json", ctx), "inspect", "demo/"+crash, "--json")
	check("inspect.json", engine("inspect", "hist/55604662", "--json", ctx), "inspect", "hist/55604662", "--json")
	for _, session := range []string{"demo/" + crash, "auth/", "hist/55604662"} {
		if session == "auth/" {
			var sums []struct{ Session string }
			_ = json.Unmarshal(engine("sessions", "--tenant", "auth", "--json", ctx), &sums)
			session += sums[0].Session
		}
		lines := bytes.Split(bytes.TrimSpace(engine("replay", session, "--json", ctx)), []byte("\n"))
		if len(lines) < 2 || !bytes.Contains(lines[len(lines)-1], []byte(`"view"`)) {
			t.Errorf("replay %s --json: %d lines, the last without the view", session, len(lines))
		}
		for i, l := range lines {
			check("replay.json", l, "replay", session, "--json", fmt.Sprintf("(line %d)", i+1))
		}
	}
	list := engine("recovery", "list", "--json", ctx)
	check("recovery-list.json", list, "recovery", "list", "--json")
	var rows []struct {
		Command struct{ ID, Kind string } `json:"command"`
	}
	if err := json.Unmarshal(list, &rows); err != nil || len(rows) < 3 {
		t.Fatalf("recovery list --json: %d rows, %v", len(rows), err)
	}
	for _, r := range rows {
		check("recovery-show.json", engine("recovery", "show", r.Command.ID, "--json", ctx), "recovery", "show", r.Command.ID, "--json")
	}
	wi := engine("whatif", "demo/"+crash, "--json", ctx)
	check("whatif.json", wi, "whatif", "demo/"+crash, "--json")
	var replays []struct {
		Decisions []json.RawMessage `json:"decisions"`
	}
	if err := json.Unmarshal(wi, &replays); err != nil || len(replays) != 1 || len(replays[0].Decisions) == 0 {
		t.Errorf("whatif demo/%s --json: %d sessions, no decisions (%v): the crash's commands are missing", crash, len(replays), err)
	}
	nonEmpty("incidents.json", "incidents", "--json", ctx)
	nonEmpty("incidents.json", "incidents", "--since", "1d", "--json", ctx)
	nonEmpty("incidents-by-session.json", "incidents", "--by", "session", "--json", ctx)
	check("diff.json", engine("diff", "demo/"+crash, "--from", "1", "--json", ctx), "diff", "demo/"+crash, "--from", "1", "--json")
	check("diff.json", engine("diff", "hist/55604662", "--from", "0", "--to", "3", "--json", ctx), "diff", "hist/55604662", "--from", "0", "--to", "3", "--json")
	runtimes := until("the live runtime answers", func(b []byte) bool { return bytes.Contains(b, []byte(`"tenant": "live"`)) }, "runtimes", "--json", ctx)
	check("runtimes.json", runtimes, "runtimes", "--json")
	check("members.json", engine("members", "--json", ctx), "members", "--json")
	nonEmpty("rejects.json", "rejects", "--json", ctx)
	var sums []struct{ Session string }
	_ = json.Unmarshal(engine("sessions", "--tenant", "gone", "--json", ctx), &sums)
	check("erase.json", engine("erase", "gone/"+sums[0].Session, "--reason", "the schema test", "--json", ctx), "erase", "--json")
	nonEmpty("audit.json", "audit", "--json", ctx)
	contexts := engine("context", "ls", "--json")
	check("context-ls.json", contexts, "context", "ls", "--json")
	if !bytes.Contains(contexts, []byte(`"selected": true`)) || !bytes.Contains(contexts, []byte(filepath.Join(mustGetwd(t), "credentials", "operator.nk"))) {
		t.Errorf("context ls --json: the selected context or its absolute paths are missing:\n%s", contexts)
	}
	// The selected context (another server) is what a command without
	// --context uses, and says so when it cannot connect.
	cmd := exec.Command(filepath.Join(binDir, "engine"), "sessions")
	cmd.Env = slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, "TURNSTONE_NATS_URL=") })
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "(context secure)") {
		t.Errorf("engine sessions with the context secure selected: %v\n%s", err, out)
	}
	live.cmd.Process.Signal(os.Interrupt)

	// Every schema was used.
	for name := range schemas {
		if name != "defs.json" && used[name] == 0 {
			t.Errorf("docs/schema/%s is never checked: produce its output in this test", name)
		}
	}
}

func mustGetwd(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}
