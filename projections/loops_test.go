package projections

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

func thinking(s string) events.ContentBlock {
	return events.ContentBlock{Type: events.BlockThinking, Thinking: s, Signature: "sig-" + s}
}

func useIn(id, name, input string) events.ContentBlock {
	return events.ContentBlock{Type: events.BlockToolUse, ID: id, Name: name, Input: json.RawMessage(input)}
}

func errResult(id string) events.ContentBlock {
	return events.ContentBlock{Type: events.BlockToolResult, ToolUseID: id, IsError: true, Content: json.RawMessage(`"FAIL: TestParse (0.01s)"`)}
}

// outputs checks the output streak's Count and Seqs.
func outputs(count int, seqs ...uint64) func(t *testing.T, s *Session) {
	return func(t *testing.T, s *Session) {
		t.Helper()
		if s.Outputs.Count != count || !slices.Equal(s.Outputs.Seqs, seqs) {
			t.Errorf("outputs = %+v, want count %d seqs %v", s.Outputs, count, seqs)
		}
	}
}

func loopCases() []foldCase {
	// The same output each turn in reply to the same prompt: fresh
	// tool_use ids, other thoughts, other white space, and in turn 3 one
	// record per block.
	loop := []step{
		in("t1", started("fix it")),
		in("t1", user(text("fix it"))),
		in("t1", asst(thinking("first idea"), text("Let me run the tests."), useIn("a1", "Bash", `{"command": "go test ./..."}`))),
		in("t1", user(result("a1"))),
		in("t1", completed()),
		in("t2", started("fix it")),
		in("t2", user(text("fix it"))),
		in("t2", asst(thinking("second idea"), text("Let me  run the tests.\n"), useIn("a2", "Bash", `{"command":"go test ./..."}`))),
		in("t2", user(result("a2"))),
		in("t2", completed()),
		in("t3", started("fix it")),
		in("t3", user(text("fix it"))),
		in("t3", asst(text(" Let me run\tthe tests."))),
		in("t3", asst(thinking("hmm"))),
		in("t3", asst(useIn("a3", "Bash", `{ "command" : "go test ./..." }`))),
		in("t3", user(result("a3"))),
	}
	return []foldCase{
		{
			name:  "the same output in a row spans turns; ids, thinking and white space do not count",
			steps: loop,
			check: func(t *testing.T, s *Session) {
				// t1's answer replies to the prompt alone; t2's and t3's to
				// the previous turn's result and the prompt, which are one
				// API message (consecutive user records merge): the same
				// input twice.
				outputs(2, 8, 13)(t, s)
				var as, us []*Message
				for i := range s.Messages {
					if m := &s.Messages[i]; m.Role == events.RoleAssistant {
						as = append(as, m)
					} else {
						us = append(us, m)
					}
				}
				if len(as) != 3 || as[0].Hash != s.Outputs.Hash || as[2].Hash != s.Outputs.Hash || len(s.Outputs.Hash) != 16 {
					t.Errorf("assistant hashes %+v, streak %q", as, s.Outputs.Hash)
				}
				if len(us) != 4 || us[1].Hash != us[2].Hash || us[1].Hash != s.Outputs.Input || us[0].Hash == us[1].Hash || len(us[0].Hash) != 16 {
					t.Errorf("user hashes %q %q %q, streak input %q", us[0].Hash, us[1].Hash, us[2].Hash, s.Outputs.Input)
				}
				if s.Outputs.LastSeq != 13 || s.Outputs.Message != 6 {
					t.Errorf("outputs = %+v", s.Outputs)
				}
			},
		},
		{
			name: "a different output restarts the streak",
			steps: append(slices.Clip(loop),
				in("t3", asst(text("Let me run the tests."), useIn("a4", "Bash", `{"command":"go test -run X ./..."}`))),
				in("t3", user(result("a4"))),
			),
			check: outputs(1, 17),
		},
		{
			name: "another tool name is another output",
			steps: []step{
				at(user(text("go"))),
				at(asst(useIn("a", "Bash", `{"x":1}`))),
				at(user(result("a"))),
				at(asst(useIn("b", "Sh", `{"x":1}`))),
				at(user(result("b"))),
			},
			check: outputs(1, 4),
		},
		{
			name: "the same output in reply to prompts that differ is no loop",
			steps: []step{
				in("t1", started("deploy")),
				in("t1", user(text("deploy"))),
				in("t1", asst(text("Done."))),
				in("t1", completed()),
				in("t2", started("and the docs")),
				in("t2", user(text("and the docs"))),
				in("t2", asst(text("Done."))),
				in("t2", completed()),
				in("t3", started("and the changelog")),
				in("t3", user(text("and the changelog"))),
				in("t3", asst(text("Done."))),
				in("t3", completed()),
			},
			check: outputs(1, 11),
		},
		{
			// A background job polled while it runs (Claude Code's
			// BashOutput, as in a real session): the same call each time,
			// each answered by a status with a new time stamp.
			name: "polling a job whose answer changes is no loop",
			steps: func() []step {
				st := []step{in("t1", started("build")), in("t1", user(text("build")))}
				for i := range 5 {
					id := fmt.Sprintf("p%d", i)
					st = append(st,
						in("t1", asst(useIn(id, "BashOutput", `{"bash_id":"7d95c5"}`))),
						in("t1", user(events.ContentBlock{Type: events.BlockToolResult, ToolUseID: id,
							Content: json.RawMessage(fmt.Sprintf(`"<status>running</status>\n<timestamp>2025-11-17T11:48:%02d.318Z</timestamp>"`, 29+3*i))})))
				}
				return st
			}(),
			check: outputs(1, 11),
		},
		{
			name: "the same call answered the same way each time is a loop",
			steps: func() []step {
				st := []step{in("t1", started("build")), in("t1", user(text("build")))}
				for i := range 4 {
					id := fmt.Sprintf("p%d", i)
					st = append(st, in("t1", asst(useIn(id, "Bash", `{"command":"make"}`))), in("t1", user(errResult(id))))
				}
				return st
			}(),
			// The first call answers the prompt, the next three the same
			// error.
			check: outputs(3, 5, 7, 9),
		},
		{
			name: "a distillation.completed resets the streak",
			steps: append(slices.Clip(loop[:10]),
				at(&events.DistillationCompleted{Trigger: "manual"}),
				at(user(text("summary"))),
				at(asst(text("Let me run the tests."), useIn("a9", "Bash", `{"command":"go test ./..."}`))),
				at(user(result("a9"))),
			),
			check: func(t *testing.T, s *Session) {
				outputs(1, 13)(t, s)
			},
		},
		{
			name: "a distillation.completed leaves an empty streak",
			steps: append(slices.Clip(loop[:10]),
				at(&events.DistillationStarted{}),
				at(&events.DistillationCompleted{}),
			),
			check: func(t *testing.T, s *Session) {
				if !reflectZero(s.Outputs) {
					t.Errorf("outputs = %+v, want zero", s.Outputs)
				}
			},
		},
		{
			name: "the turn's end completes its last message, which counts once",
			steps: []step{
				in("t1", started("hi")),
				in("t1", user(text("hi"))),
				in("t1", asst(text("Hello!"))),
				in("t1", completed()),
				at(asst(text("late record of the same message"))),
				in("t2", started("hi")),
				in("t2", user(text("hi"))),
				in("t2", asst(text("Hello!"))),
			},
			check: func(t *testing.T, s *Session) {
				outputs(1, 3)(t, s) // the t2 answer is not complete yet, and differs from the merged one
				if s.Outputs.Message != 2 {
					t.Errorf("outputs = %+v", s.Outputs)
				}
			},
		},
		{
			name: "another turn's end does not complete a message",
			steps: []step{
				in("t1", started("hi")),
				in("t1", user(text("hi"))),
				in("t1", asst(text("thinking aloud"))),
				in("t2", started("mid-turn")),
				in("t2", completed()),
			},
			check: outputs(0),
		},
		{
			name: "a distillation start completes the latest message",
			steps: []step{
				at(user(text("hi"))),
				at(asst(text("Hello!"))),
				at(&events.DistillationStarted{}),
			},
			check: outputs(1, 2),
		},
		{
			name: "the streak keeps the first KeepOutputSeqs sequences",
			steps: func() []step {
				var st []step
				for range KeepOutputSeqs + 2 {
					st = append(st, at(user(text("again"))), at(asst(text("Same."))))
				}
				return append(st, at(user(text("stop"))))
			}(),
			check: func(t *testing.T, s *Session) {
				want := []uint64{2, 4, 6, 8, 10, 12, 14, 16, 18, 20}
				if s.Outputs.Count != KeepOutputSeqs+2 || !slices.Equal(s.Outputs.Seqs, want) || s.Outputs.LastSeq != 24 {
					t.Errorf("outputs = %+v", s.Outputs)
				}
			},
		},
	}
}

func reflectZero(o OutputStreak) bool {
	return o.Hash == "" && o.Count == 0 && o.Seqs == nil && o.LastSeq == 0 && o.Message == 0
}

func TestFoldOutputStreak(t *testing.T) { runFoldCases(t, loopCases()) }

func TestOutputHash(t *testing.T) {
	base := []events.ContentBlock{text("Run the tests."), useIn("toolu_1", "Bash", `{"command": "go test"}`)}
	tests := []struct {
		name   string
		blocks []events.ContentBlock
		same   bool
	}{
		{"identical", base, true},
		{"other tool_use id", []events.ContentBlock{text("Run the tests."), useIn("toolu_2", "Bash", `{"command": "go test"}`)}, true},
		{"white space in text and input", []events.ContentBlock{text("  Run\nthe   tests. "), useIn("toolu_1", "Bash", `{ "command":"go test" }`)}, true},
		{"thinking blocks", []events.ContentBlock{thinking("a"), text("Run the tests."), {Type: "redacted_thinking", Data: "xx"}, useIn("toolu_1", "Bash", `{"command": "go test"}`)}, true},
		{"white space inside a JSON string", []events.ContentBlock{text("Run the tests."), useIn("toolu_1", "Bash", `{"command": "go  test"}`)}, false},
		{"other tool name", []events.ContentBlock{text("Run the tests."), useIn("toolu_1", "Sh", `{"command": "go test"}`)}, false},
		{"other text", []events.ContentBlock{text("Run the tests!"), useIn("toolu_1", "Bash", `{"command": "go test"}`)}, false},
		{"other order", []events.ContentBlock{useIn("toolu_1", "Bash", `{"command": "go test"}`), text("Run the tests.")}, false},
		{"text split in two blocks", []events.ContentBlock{text("Run the"), text("tests."), useIn("toolu_1", "Bash", `{"command": "go test"}`)}, false},
		{"a block less", base[:1], false},
	}
	want := OutputHash(base)
	if len(want) != 16 {
		t.Fatalf("OutputHash = %q, want 16 hex digits", want)
	}
	for _, tt := range tests {
		if got := OutputHash(tt.blocks) == want; got != tt.same {
			t.Errorf("%s: same hash = %v, want %v", tt.name, got, tt.same)
		}
	}
	if got := OutputHash(nil); got != emptyOutputHash || OutputHash([]events.ContentBlock{thinking("x")}) != got {
		t.Errorf("OutputHash of nothing = %q, want %q", got, emptyOutputHash)
	}
	if InputHash(json.RawMessage(`{"a": 1}`)) != InputHash(json.RawMessage(`{"a":1}`)) || InputHash(json.RawMessage(`{"a":1}`)) == InputHash(json.RawMessage(`{"a":2}`)) {
		t.Errorf("InputHash compares compact JSON")
	}
}

// attempts checks each turn's FailedAttempts, given as id:count pairs.
func attempts(want map[string]int) func(t *testing.T, s *Session) {
	return func(t *testing.T, s *Session) {
		t.Helper()
		for id, n := range want {
			if tu := s.Turn(id); tu == nil || tu.FailedAttempts != n {
				t.Errorf("turn %s: %+v, want %d failed attempts", id, tu, n)
			}
		}
	}
}

func budgetCases() []foldCase {
	// fail and pass are a Bash call on command cmd and its result.
	call := func(id, cmd, desc string) step {
		return in("t1", asst(useIn(id, "Bash", fmt.Sprintf(`{"command":%q,"description":%q}`, cmd, desc))))
	}
	fail := func(id string) step { return in("t1", user(errResult(id))) }
	pass := func(id string) step { return in("t1", user(result(id))) }
	edit := func(id string) []step {
		return []step{in("t1", asst(useIn(id, "Edit", `{"file_path":"/repo/a.go","old_string":"x","new_string":"y"}`))), pass(id)}
	}
	return []foldCase{
		{
			name: "failures of one step in a row count; edits between do not reset them",
			steps: slices.Concat(
				[]step{in("t1", started("fix")), in("t1", user(text("fix")))},
				[]step{call("a", "go test ./...", "run the tests"), fail("a")}, edit("e1"),
				[]step{call("b", "go  test ./...", "run them again"), fail("b")}, edit("e2"),
				[]step{call("c", "go test ./...", "once more"), fail("c")},
			),
			check: func(t *testing.T, s *Session) {
				attempts(map[string]int{"t1": 3})(t, s)
				if st := s.BudgetStep("t1"); st == nil || st.Failures != 3 || st.Name != "Bash" || st.FirstSeq != 4 || st.LastSeq != 12 {
					t.Errorf("budget step = %+v", st)
				}
			},
		},
		{
			name: "a test that fails before it passes spends nothing lasting",
			steps: slices.Concat(
				[]step{in("t1", started("fix")), in("t1", user(text("fix")))},
				[]step{call("a", "go test ./...", ""), fail("a")}, edit("e1"),
				[]step{call("b", "go test ./...", ""), fail("b")}, edit("e2"),
				[]step{call("c", "go test ./...", ""), pass("c")},
			),
			check: func(t *testing.T, s *Session) {
				attempts(map[string]int{"t1": 0})(t, s)
				if len(s.Steps) != 0 {
					t.Errorf("steps = %+v, want none", s.Steps)
				}
			},
		},
		{
			name: "failures at different steps do not add up",
			steps: slices.Concat(
				[]step{in("t1", started("look")), in("t1", user(text("look")))},
				[]step{call("a", "grep -r foo .", ""), fail("a")},
				[]step{call("b", "grep -r bar .", ""), fail("b")},
				[]step{call("c", "ls /nope", ""), fail("c")},
				[]step{in("t1", asst(useIn("d", "Read", `{"file_path":"/repo/missing.go"}`))), fail("d")},
			),
			check: func(t *testing.T, s *Session) {
				attempts(map[string]int{"t1": 1})(t, s)
				if len(s.Steps) != 4 {
					t.Errorf("steps = %+v, want 4 failing steps", s.Steps)
				}
			},
		},
		{
			name: "recorded errors are failures of their stage until the model answers",
			steps: []step{
				in("t1", started("fix")),
				in("t1", user(text("fix"))),
				in("t1", &events.ErrorRecorded{ErrorInfo: errInfo("overloaded"), Stage: events.StageExecute}),
				in("t1", &events.ErrorRecorded{ErrorInfo: errInfo("overloaded")}),
				in("t1", &events.ErrorRecorded{ErrorInfo: errInfo("overloaded"), Stage: events.StageExecute}),
			},
			check: func(t *testing.T, s *Session) {
				attempts(map[string]int{"t1": 3})(t, s)
				if st := s.BudgetStep("t1"); st == nil || st.Key != "stage:execute" || st.Name != "execute" {
					t.Errorf("budget step = %+v", st)
				}
			},
		},
		{
			name: "the model's answer is the execute stage's success; stage_completed another stage's",
			steps: []step{
				in("t1", started("fix")),
				in("t1", user(text("fix"))),
				in("t1", &events.ErrorRecorded{ErrorInfo: errInfo("overloaded"), Stage: events.StageExecute}),
				in("t1", &events.ErrorRecorded{ErrorInfo: errInfo("no context"), Stage: events.StageContext}),
				in("t1", &events.ErrorRecorded{ErrorInfo: errInfo("no context"), Stage: events.StageContext}),
				in("t1", asst(text("Hello."))),
				in("t1", &events.TurnStageCompleted{Stage: events.StageContext}),
			},
			check: func(t *testing.T, s *Session) {
				attempts(map[string]int{"t1": 0})(t, s)
				if len(s.Steps) != 0 {
					t.Errorf("steps = %+v, want none", s.Steps)
				}
			},
		},
		{
			name: "a turn keeps its count when it ends, and its steps go",
			steps: slices.Concat(
				[]step{in("t1", started("fix")), in("t1", user(text("fix")))},
				[]step{call("a", "make", ""), fail("a"), call("b", "make", ""), fail("b")},
				[]step{in("t1", failed("gave up"))},
				[]step{in("t2", started("again")), in("t2", user(text("again"))),
					in("t2", asst(useIn("c", "Bash", `{"command":"make"}`))), in("t2", user(errResult("c")))},
			),
			check: func(t *testing.T, s *Session) {
				attempts(map[string]int{"t1": 2, "t2": 1})(t, s)
				if len(s.Steps) != 1 || s.Steps[0].Turn != "t2" {
					t.Errorf("steps = %+v, want t2's only", s.Steps)
				}
			},
		},
		{
			name: "results that pair with no tool_use are no attempts",
			steps: []step{
				in("t1", started("fix")),
				in("t1", user(text("fix"))),
				in("t1", asst(use("a", "Bash"))),
				in("t1", user(errResult("a"))),
				in("t1", user(errResult("a"))),
				in("t1", user(errResult("zz"))),
			},
			want:  []string{"5:duplicate_tool_result", "6:tool_result_without_tool_use"},
			check: attempts(map[string]int{"t1": 1}),
		},
		{
			name: "a synthetic error result is a repair, not an attempt",
			steps: []step{
				in("t1", started("go")),
				in("t1", user(text("go"))),
				in("t1", asst(use("a", "Bash"), use("b", "Bash"))),
				in("t1", synthetic(errResult("b"))),
				in("t1", failed("worker killed")),
				at(synthetic(errResult("a"))),
			},
			want:  []string{"5:tool_use_without_result"},
			check: attempts(map[string]int{"t1": 0}),
		},
		{
			name: "an error recorded after the turn ended spends nothing",
			steps: []step{
				in("t1", started("go")),
				in("t1", completed()),
				in("t1", &events.ErrorRecorded{ErrorInfo: errInfo("late")}),
			},
			check: func(t *testing.T, s *Session) {
				attempts(map[string]int{"t1": 0})(t, s)
				if len(s.Steps) != 0 {
					t.Errorf("steps = %+v, want none", s.Steps)
				}
			},
		},
		{
			name: "past MaxSteps the step with the fewest failures is forgotten",
			steps: func() []step {
				st := []step{in("t1", started("go")), in("t1", user(text("go"))), call("x0", "make", ""), fail("x0"), call("x1", "make", ""), fail("x1")}
				for i := range MaxSteps {
					id := fmt.Sprintf("g%d", i)
					st = append(st, call(id, fmt.Sprintf("grep %d", i), ""), fail(id))
				}
				return st
			}(),
			check: func(t *testing.T, s *Session) {
				attempts(map[string]int{"t1": 2})(t, s)
				if len(s.Steps) != MaxSteps || s.Steps[0].Failures != 2 || s.Steps[1].Name != "Bash" {
					t.Errorf("steps = %+v", s.Steps)
				}
			},
		},
	}
}

func TestStepKey(t *testing.T) {
	tests := []struct {
		name       string
		tool, a, b string
		same       bool
	}{
		{"another description is the same step", "Bash", `{"command":"go test ./...","description":"run"}`, `{"command": "go test  ./...", "description":"again", "timeout":60}`, true},
		{"another command is another step", "Bash", `{"command":"go test ./a"}`, `{"command":"go test ./b"}`, false},
		{"an edit of the same file is the same step", "Edit", `{"file_path":"/a.go","old_string":"x"}`, `{"file_path":"/a.go","old_string":"y"}`, true},
		{"another tool is another step", "Bash", `{"command":"ls"}`, `{"command":"ls"}`, true},
		{"a nested first member is read whole", "Task", `{"todos":[{"a":1},{"b":2}],"x":1}`, `{"todos":[{"a":1},{"b":3}],"x":1}`, false},
		{"commas and braces in strings do not end the member", "Bash", `{"command":"echo \"a,}\" b"}`, `{"command":"echo \"a,}\" c"}`, false},
		{"no operand is one step", "Glob", `{}`, ``, true},
		{"not an object", "X", `[1,2]`, `[1, 2]`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := StepKey(tt.tool, json.RawMessage(tt.a)), StepKey(tt.tool, json.RawMessage(tt.b))
			if (a == b) != tt.same || len(a) != 16 {
				t.Errorf("StepKey(%s) = %s, StepKey(%s) = %s, want same %v", tt.a, a, tt.b, b, tt.same)
			}
		})
	}
	if StepKey("Bash", json.RawMessage(`{"command":"ls"}`)) == StepKey("Sh", json.RawMessage(`{"command":"ls"}`)) {
		t.Error("two tools share a step key")
	}
}

func TestFoldFailedAttempts(t *testing.T) { runFoldCases(t, budgetCases()) }

// flaky checks the flaky-suspected runs as "tool:fail->pass@turn".
func flaky(want ...Flaky) func(t *testing.T, s *Session) {
	return func(t *testing.T, s *Session) {
		t.Helper()
		got := s.Flaky
		if got == nil {
			got = []Flaky{}
		}
		if want == nil {
			want = []Flaky{}
		}
		if !slices.Equal(got, want) || s.Totals.Flaky != len(want) {
			t.Errorf("flaky = %+v (total %d), want %+v", s.Flaky, s.Totals.Flaky, want)
		}
	}
}

func flakyCases() []foldCase {
	const goTest = `{"command": "go test ./parser"}`
	h := InputHash(json.RawMessage(goTest))
	return []foldCase{
		{
			name: "a failed run whose immediate identical re-run passes is flaky",
			steps: []step{
				in("t1", started("fix")),
				in("t1", user(text("fix"))),
				in("t1", asst(useIn("a", "Bash", goTest))),
				in("t1", user(errResult("a"))),
				in("t1", asst(text("Flaky? Again."), useIn("b", "Bash", `{"command":"go test ./parser"}`))),
				in("t1", user(result("b"))),
				in("t1", completed()),
			},
			status: StatusIdle,
			check: func(t *testing.T, s *Session) {
				flaky(Flaky{Tool: "Bash", InputHash: h, FailSeq: 4, PassSeq: 6, Turn: "t1"})(t, s)
				if r := s.LastTool; r == nil || r.ToolUseID != "b" || r.RerunOf != 4 || r.ResultSeq != 6 || r.IsError {
					t.Errorf("last tool = %+v", r)
				}
			},
		},
		{
			name: "fail, fail, pass: the last failure is the flaky one; across turns",
			steps: []step{
				in("t1", started("fix")),
				in("t1", user(text("fix"))),
				in("t1", asst(useIn("a", "Bash", goTest))),
				in("t1", user(errResult("a"))),
				in("t1", asst(useIn("b", "Bash", goTest))),
				in("t1", user(errResult("b"))),
				in("t1", completed()),
				in("t2", started("try again")),
				in("t2", user(text("try again"))),
				in("t2", asst(useIn("c", "Bash", goTest))),
				in("t2", user(result("c"))),
			},
			check: flaky(Flaky{Tool: "Bash", InputHash: h, FailSeq: 6, PassSeq: 11, Turn: "t2"}),
		},
		{
			name: "another tool call between is no immediate re-run",
			steps: []step{
				at(user(text("fix"))),
				at(asst(useIn("a", "Bash", goTest))),
				at(user(errResult("a"))),
				at(asst(useIn("r", "Read", `{"file_path":"parser.go"}`))),
				at(user(result("r"))),
				at(asst(useIn("b", "Bash", goTest))),
				at(user(result("b"))),
			},
			check: flaky(),
		},
		{
			name: "another input or tool is no re-run",
			steps: []step{
				at(user(text("fix"))),
				at(asst(useIn("a", "Bash", goTest))),
				at(user(errResult("a"))),
				at(asst(useIn("b", "Bash", `{"command": "go test -count=1 ./parser"}`))),
				at(user(errResult("b"))),
				at(asst(useIn("c", "Sh", `{"command": "go test -count=1 ./parser"}`))),
				at(user(result("c"))),
			},
			check: flaky(),
		},
		{
			name: "identical calls in one message run in parallel, not as re-runs",
			steps: []step{
				at(user(text("fix"))),
				at(asst(useIn("a", "Bash", goTest), useIn("b", "Bash", goTest))),
				at(user(errResult("a"), result("b"))),
			},
			check: flaky(),
		},
		{
			name: "a re-run that fails again is not flaky",
			steps: []step{
				at(user(text("fix"))),
				at(asst(useIn("a", "Bash", goTest))),
				at(user(errResult("a"))),
				at(asst(useIn("b", "Bash", goTest))),
				at(user(errResult("b"))),
			},
			check: flaky(),
		},
		{
			name: "a synthetic error result is no run to re-run",
			steps: []step{
				in("t1", started("fix")),
				in("t1", user(text("fix"))),
				in("t1", asst(useIn("a", "Bash", goTest))),
				in("t1", failed("worker killed")),
				at(synthetic(errResult("a"))),
				in("t2", started("again")),
				in("t2", user(text("again"))),
				in("t2", asst(useIn("b", "Bash", goTest))),
				in("t2", user(result("b"))),
			},
			want:  []string{"4:tool_use_without_result"},
			check: flaky(),
		},
	}
}

func TestFoldFlaky(t *testing.T) { runFoldCases(t, flakyCases()) }

// pending checks PendingDistillation (by its RequestedSeq, 0 for nil) and
// DistillationDeferred.
func pending(requested uint64, deferred bool) func(t *testing.T, s *Session) {
	return func(t *testing.T, s *Session) {
		t.Helper()
		var got uint64
		if d := s.PendingDistillation(); d != nil {
			got = d.RequestedSeq
		}
		if got != requested || s.DistillationDeferred() != deferred {
			t.Errorf("pending request at seq %d deferred %v, want %d %v (%+v)", got, s.DistillationDeferred(), requested, deferred, s.Distillations)
		}
	}
}

func pendingCases() []foldCase {
	req := func(why string) step { return at(&events.DistillationRequested{Reason: why}) }
	skip := at(&events.DistillationSkipped{Reason: DirtyTurnInFlight})
	return []foldCase{
		{name: "no request", steps: []step{at(user(text("hi")))}, check: pending(0, false)},
		{name: "a request is pending", steps: []step{at(user(text("hi"))), req("auto")}, check: pending(2, false)},
		{name: "a repeated request is the same request", steps: []step{req("auto"), req("again")}, check: pending(1, false)},
		{name: "a skipped request is pending, deferred", steps: []step{req("auto"), skip}, check: pending(1, true)},
		{name: "a started request is no longer pending", steps: []step{req("auto"), skip, at(&events.DistillationStarted{})}, check: pending(0, false)},
		{
			name:  "a completed request is no longer pending",
			steps: []step{req("auto"), skip, at(&events.DistillationStarted{}), at(&events.DistillationCompleted{})},
			check: pending(0, false),
		},
		{name: "a distillation run without request answers a skipped one", steps: []step{req("auto"), skip, at(&events.DistillationCompleted{})}, check: pending(0, false)},
		{name: "a request after a skip is the pending one", steps: []step{req("auto"), skip, req("manual")}, check: pending(3, false)},
		{name: "a skip without request is no request", steps: []step{skip}, check: pending(0, false)},
		{name: "a request after a completed distillation", steps: []step{at(&events.DistillationCompleted{}), req("auto")}, check: pending(2, false)},
	}
}

func TestPendingDistillation(t *testing.T) { runFoldCases(t, pendingCases()) }

func TestAnomalous(t *testing.T) {
	clean := []step{
		at(&events.SessionStarted{Runtime: "claude-code"}),
		in("t1", started("hi")),
		in("t1", user(text("hi"))),
		in("t1", asst(text("Hello."))),
		in("t1", completed()),
	}
	same := func(turn, msg string) []step {
		return []step{in(turn, started(msg)), in(turn, user(text("try again"))), in(turn, asst(text("I cannot do that."))), in(turn, completed())}
	}
	tests := []struct {
		name      string
		steps     []step
		anomalous bool
		first     uint64 // FirstAnomaly's Seq, 0 for nil
	}{
		{"clean", clean, false, 0},
		{"unknown types are no anomaly", append(slices.Clip(clean), rawStep(rawEvent("agent.heartbeat", "", `{}`))), false, 0},
		{"a violation", append(slices.Clip(clean), in("t1", completed())), true, 6},
		{"an invalid event", append(slices.Clip(clean), rawStep(rawEvent(events.TypeTurnStarted, "", `{}`))), true, 6},
		{"the first of several violations", append(slices.Clip(clean), at(user(result("x"))), in("t9", completed())), true, 6},
		{
			"a resolved orphan",
			[]step{in("t1", started("go")), in("t1", user(text("go"))), in("t1", asst(use("a", "Bash"))), in("t1", completed()), at(synthetic(result("a")))},
			true, 4,
		},
		{"a failed turn", append(slices.Clip(clean), in("t2", started("x")), in("t2", failed("boom"))), true, 0},
		{"an abandoned turn", append(slices.Clip(clean), in("t2", started("x")), in("t2", &events.TurnAbandoned{Reason: "deadline"})), true, 0},
		{"a parked command", append(slices.Clip(clean), at(&events.RecoveryParked{CommandID: "c1", Kind: "retry_turn", Reason: "no runtime"})), true, 0},
		{"a failed recovery", append(slices.Clip(clean), at(&events.RecoveryCompleted{CommandID: "c1", Kind: "retry_turn", Outcome: events.OutcomeFailed})), true, 0},
		{"a recovered command is no anomaly", append(slices.Clip(clean), at(&events.RecoveryCompleted{CommandID: "c1", Kind: "retry_turn", Outcome: events.OutcomeRecovered})), false, 0},
		{
			"a flaky run",
			[]step{at(user(text("go"))), at(asst(use("a", "Bash"))), at(user(errResult("a"))), at(asst(use("b", "Bash"))), at(user(result("b")))},
			true, 0,
		},
		{"the same output twice is no loop", slices.Concat(same("t1", "a"), same("t2", "b")), false, 0},
		{"the same output three times is a loop", slices.Concat(same("t1", "a"), same("t2", "b"), same("t3", "c")), true, 0},
		{
			"the same error three times is a loop",
			[]step{
				at(&events.ErrorRecorded{ErrorInfo: errInfo("overloaded")}),
				at(&events.ErrorRecorded{ErrorInfo: errInfo("overloaded")}),
				at(&events.ErrorRecorded{ErrorInfo: errInfo("overloaded")}),
			},
			true, 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs := build(t, tt.steps)
			s := Fold(evs)
			if got := s.Anomalous(); got != tt.anomalous {
				t.Errorf("Anomalous() = %v, want %v (violations %v, outputs %+v)", got, tt.anomalous, rules(s.Violations), s.Outputs)
			}
			v := s.FirstAnomaly()
			switch {
			case tt.first == 0 && v != nil:
				t.Errorf("FirstAnomaly() = %+v, want nil", v)
			case tt.first != 0 && (v == nil || v.Seq != tt.first):
				t.Errorf("FirstAnomaly() = %+v, want seq %d", v, tt.first)
			case v != nil && !v.Time.Equal(evs[v.Seq-1].Time):
				t.Errorf("FirstAnomaly().Time = %v, want the event's time", v.Time)
			}
		})
	}
}

// TestViolationTime checks that a violation carries its event's time, in
// the state and through JSON.
func TestViolationTime(t *testing.T) {
	s := Fold(build(t, []step{at(asst(text("first"))), rawStep(events.Event{Type: events.TypeMessageAppended, Err: events.ErrMalformed})}))
	if len(s.Violations) != 2 {
		t.Fatalf("violations = %+v", s.Violations)
	}
	if want := epoch.Add(time.Second); !s.Violations[0].Time.Equal(want) {
		t.Errorf("time = %v, want %v", s.Violations[0].Time, want)
	}
	if !s.Violations[1].Time.IsZero() {
		t.Errorf("an event without time gave a violation time %v", s.Violations[1].Time)
	}
	var back Session
	if err := json.Unmarshal(mustJSON(t, s), &back); err != nil {
		t.Fatal(err)
	}
	if !back.Violations[0].Time.Equal(s.Violations[0].Time) || !back.Violations[1].Time.IsZero() {
		t.Errorf("time after a round trip = %v, %v", back.Violations[0].Time, back.Violations[1].Time)
	}
}
