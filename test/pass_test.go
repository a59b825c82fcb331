package test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// This package's tests run in two passes in scripts/test, at once:
//
//   - the race pass (TURNSTONE_TEST_PASS=race, -race): the tests that
//     run Turnstone's concurrent parts in this test binary (an engine, a
//     projector, a worker, an ingest server, a web handler, an embedded
//     nats-server the test's own clients share), and those that read a
//     sample under the race detector (scripts/fullsize runs them at full
//     size). They call inProcess.
//   - the process pass (TURNSTONE_TEST_PASS=processes, no -race): the
//     tests whose subject runs in child processes (the binaries built in
//     TestMain, without the race detector either way) or in no process at
//     all, the binary only driving them and reading the log. The race
//     detector instruments only this binary, where such a test has nothing
//     concurrent of Turnstone's to check, at several times the CPU. They
//     call processesOnly.
//
// With TURNSTONE_TEST_PASS unset (go test ./test/, with or without
// -race), every test runs. TestEveryTestNamesItsPass checks that each test
// calls one of the two first.

// testPass is the pass this binary runs: "race", "processes" or "".
var testPass = os.Getenv("TURNSTONE_TEST_PASS")

// inProcess marks a test of the race pass: it is skipped in the process
// pass.
func inProcess(t *testing.T) {
	t.Helper()
	if testPass == "processes" {
		t.Skip("runs in the race pass (TURNSTONE_TEST_PASS=race)")
	}
}

// processesOnly marks a test of the process pass: it is skipped in the
// race pass.
func processesOnly(t *testing.T) {
	t.Helper()
	if testPass == "race" {
		t.Skip("runs in the process pass (TURNSTONE_TEST_PASS=processes)")
	}
}

// TestEveryTestNamesItsPass: every test of the package calls inProcess or
// processesOnly as its first statement, so
// that scripts/test's two passes together run each test exactly once; and
// a test that starts Turnstone's parts in this binary (enginetest, an
// embedded server, the engine's or worker's Open) is in the race pass.
func TestEveryTestNamesItsPass(t *testing.T) {
	processesOnly(t)
	t.Parallel()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, tf := range testFuncs(src) {
			if tf.name == "TestMain" {
				continue
			}
			n++
			pass := firstPassCall(tf.body)
			switch {
			case pass == "":
				t.Errorf("%s (%s) calls neither inProcess(t) nor processesOnly(t) first", tf.name, f)
			case pass == "processesOnly" && startsInProcess(tf.body):
				t.Errorf("%s (%s) starts Turnstone's parts in this binary but is marked processesOnly: the race pass must run it", tf.name, f)
			}
		}
	}
	if n < 60 {
		t.Fatalf("read %d tests: the scan is broken", n)
	}
}

// firstPassCall is "inProcess" or "processesOnly" when the first
// statement of a test's body calls it, else "".
func firstPassCall(body string) string {
	for _, line := range strings.Split(body, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "//") {
			continue
		}
		switch line {
		case "inProcess(t)":
			return "inProcess"
		case "processesOnly(t)":
			return "processesOnly"
		}
		return ""
	}
	return ""
}

// inProcessStarts are the calls by which a test starts Turnstone's parts,
// or a nats-server, in this binary.
var inProcessStarts = []string{"enginetest.", "embedded.", "embeddedtest.", "engine.Open(", "engine.Erase(",
	"engine.Setup(", "worker.New(", "projections.NewProjector(", "ingestserver.", "reconciler.New(",
	"newEnv(", "startAuthEnv", "startServerAt(", "newRecoveryEnv(", "startCluster("}

// startsInProcess reports whether a test's body calls one of
// inProcessStarts.
func startsInProcess(body string) bool {
	for _, s := range inProcessStarts {
		if strings.Contains(body, s) {
			return true
		}
	}
	return false
}
