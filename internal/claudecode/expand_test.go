package claudecode

import (
	"errors"
	"io/fs"
	"path/filepath"
	"reflect"
	"testing"
)

func TestExpand(t *testing.T) {
	dir := t.TempDir()
	p := func(rel string) string { return filepath.Join(dir, filepath.FromSlash(rel)) }
	for _, f := range []string{
		"proj/b.jsonl",
		"proj/a.jsonl",
		"proj/a/subagents/agent-x1.jsonl",
		"proj/a/subagents/agent-acompact-9.jsonl",
		"proj/a/subagents/notes.txt",
		"proj/agent-old.jsonl",
		"proj/readme.md",
		"other/c.jsonl",
	} {
		write(t, p(f), `{"type":"summary"}`)
	}

	got, err := Expand([]string{p("proj")})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		p("proj/a.jsonl"), p("proj/b.jsonl"),
		p("proj/a/subagents/agent-acompact-9.jsonl"), p("proj/a/subagents/agent-x1.jsonl"), p("proj/agent-old.jsonl"),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Expand(dir) =\n%v\nwant\n%v", got, want)
	}

	// A main file brings its subagents; duplicates are dropped; parents come
	// first whatever the argument order.
	got, err = Expand([]string{p("proj/a/subagents/agent-x1.jsonl"), p("proj/a.jsonl"), p("other/c.jsonl"), p("proj/./a.jsonl"), p("other")})
	if err != nil {
		t.Fatal(err)
	}
	want = []string{
		p("other/c.jsonl"), p("proj/a.jsonl"),
		p("proj/a/subagents/agent-acompact-9.jsonl"), p("proj/a/subagents/agent-x1.jsonl"),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Expand(files) =\n%v\nwant\n%v", got, want)
	}

	if _, err := Expand([]string{p("nope.jsonl")}); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	if got, err := Expand(nil); err != nil || len(got) != 0 {
		t.Errorf("Expand(nil) = %v, %v", got, err)
	}
}

func TestExpandCorpus(t *testing.T) {
	files, err := Expand([]string{corpusDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	// ccviewer: 3 sessions and 2 agent files; spotter: 8 sessions and 12
	// subagent files.
	if len(files) != 25 {
		t.Errorf("%d files, want 25: %v", len(files), files)
	}
	seenSide := false
	for _, f := range files {
		if isSidechainPath(f) {
			seenSide = true
		} else if seenSide {
			t.Errorf("main transcript %s after a sidechain", f)
		}
	}
}
