package test

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestFullSizePassNamesEverySampledTest: scripts/fullsize runs, without
// the race detector, the tests that read a sample under it. go test -run
// with a name that matches nothing passes quietly, so every name it lists
// must be a test of the packages it runs; and every test whose body
// decides its size on the race detector or -short (raceEnabled, sampled(),
// corpusSample) must be listed, or its full size would run nowhere in CI.
func TestFullSizePassNamesEverySampledTest(t *testing.T) {
	parallel(t)
	script, err := os.ReadFile("../scripts/fullsize")
	if err != nil {
		t.Fatal(err)
	}
	list := regexp.MustCompile(`(?s)\ntests=\((.*?)\n\)`).FindSubmatch(script)
	pkgs := regexp.MustCompile(`\npkgs=\(([^)]*)\)`).FindSubmatch(script)
	if list == nil || pkgs == nil {
		t.Fatal("scripts/fullsize: no tests=( ... ) or pkgs=( ... ) list")
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(string(list[1]), "\n") {
		line, _, _ = strings.Cut(line, "#")
		for _, name := range strings.Fields(line) {
			listed[name] = true
		}
	}
	// Every test function of the packages the pass runs, and which of
	// them size themselves on the race detector or -short.
	defined := map[string]bool{}
	var sampling []string
	sizes := regexp.MustCompile(`\braceEnabled\b|\bsampled\(\)|\bcorpusSample\(`)
	for _, pkg := range strings.Fields(string(pkgs[1])) {
		files, err := filepath.Glob(filepath.Join("..", pkg, "*_test.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("scripts/fullsize runs %s: no test files (%v)", pkg, err)
		}
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range testFuncs(src) {
				defined[f.name] = true
				if sizes.MatchString(f.body) {
					sampling = append(sampling, f.name)
				}
			}
		}
	}
	for name := range listed {
		if !defined[name] {
			t.Errorf("scripts/fullsize lists %s, which no package it runs defines", name)
		}
	}
	sort.Strings(sampling)
	for _, name := range sampling {
		if !listed[name] {
			t.Errorf("%s sizes itself on the race detector or -short, but scripts/fullsize does not run it at full size", name)
		}
	}
	// A package with a sampling test must be one the pass runs.
	all, err := filepath.Glob("../*/*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob("../*/*/*_test.go")
	for _, f := range append(all, more...) {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pkg := "./" + filepath.ToSlash(strings.TrimPrefix(filepath.Dir(f), "../")) + "/"
		if strings.Contains(string(pkgs[1]), pkg) {
			continue
		}
		for _, tf := range testFuncs(src) {
			if sizes.MatchString(tf.body) {
				t.Errorf("%s (%s) sizes itself on the race detector or -short, but scripts/fullsize does not run its package", tf.name, pkg)
			}
		}
	}
}

// testFunc is a top-level test function of a gofmt'ed file: its name and
// its body's lines, up to the closing brace at the start of a line.
type testFunc struct{ name, body string }

// testFuncs lists the `func TestX(t *testing.T) {` functions of src (a
// regexp over the whole file took seconds under the race detector).
func testFuncs(src []byte) []testFunc {
	var out []testFunc
	rest := string(src)
	for {
		i := strings.Index(rest, "\nfunc Test")
		if i < 0 {
			return out
		}
		rest = rest[i+len("\nfunc "):]
		name, after, ok := strings.Cut(rest, "(t *testing.T) {\n")
		if !ok || strings.ContainsAny(name, " \n") {
			continue
		}
		if rest, ok = strings.CutPrefix(after, "}\n"); ok { // an empty body
			out = append(out, testFunc{name, ""})
			rest = "\n" + rest
			continue
		}
		body, next, _ := strings.Cut(after, "\n}\n")
		out = append(out, testFunc{name, body})
		rest = "\n" + next // the scan goes on after the body, not inside it
	}
}

// TestTestFuncsReadsEachFunctionOnce: testFuncs reads an empty body as
// empty (not running on into the next function), and never reads a
// function out of another's body (a raw string holding a func line).
func TestTestFuncsReadsEachFunctionOnce(t *testing.T) {
	parallel(t)
	src := "package x\n\nfunc TestA(t *testing.T) {\n}\n\nfunc TestB(t *testing.T) {\n\ts := `\nfunc TestC(t *testing.T) {\n`\n\t_ = s\n}\n\nfunc TestD(t *testing.T) {\n\tx()\n}\n"
	got := testFuncs([]byte(src))
	if len(got) != 3 || got[0] != (testFunc{"TestA", ""}) || got[1].name != "TestB" || got[2] != (testFunc{"TestD", "\tx()"}) {
		t.Fatalf("testFuncs = %+v, want TestA (empty), TestB, TestD", got)
	}
}
