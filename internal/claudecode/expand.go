package claudecode

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Expand turns command-line arguments (transcript files or directories)
// into the ordered list of transcript files to convert:
//
//   - a directory is walked recursively for *.jsonl files;
//   - a file is taken as it is, and a main transcript X.jsonl also brings
//     X/subagents/*.jsonl when that directory exists (where Claude Code
//     2.1 writes the session's subagent and compaction transcripts);
//   - a file named twice (or reached twice) is listed once;
//   - main transcripts come first and sidechain transcripts (agent-*.jsonl,
//     or any file in a subagents directory) after them, each group sorted
//     by path, so that a Converter has seen a parent before its subagents.
//
// It returns an error wrapping the fs error (fs.ErrNotExist, for example)
// for an argument that cannot be read. No argument, or directories with no
// transcript, give an empty list and no error.
func Expand(args []string) ([]string, error) {
	seen := map[string]bool{}
	var mains, sides []string
	add := func(p string) {
		p = filepath.Clean(p)
		key := p
		if abs, err := filepath.Abs(p); err == nil {
			key = abs
		}
		if seen[key] {
			return
		}
		seen[key] = true
		if isSidechainPath(p) {
			sides = append(sides, p)
		} else {
			mains = append(mains, p)
		}
	}
	for _, arg := range args {
		fi, err := os.Stat(arg)
		if err != nil {
			return nil, fmt.Errorf("expand transcripts: %w", err)
		}
		if fi.IsDir() {
			err := filepath.WalkDir(arg, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				if !d.IsDir() && strings.HasSuffix(d.Name(), ".jsonl") {
					add(p)
				}
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("expand transcripts: %w", err)
			}
			continue
		}
		add(arg)
		if strings.HasSuffix(arg, ".jsonl") && !isSidechainPath(arg) {
			dir := filepath.Join(strings.TrimSuffix(arg, ".jsonl"), "subagents")
			var ents []fs.DirEntry
			if di, err := os.Stat(dir); err == nil && di.IsDir() {
				if ents, err = os.ReadDir(dir); err != nil {
					return nil, fmt.Errorf("expand transcripts: %w", err)
				}
			}
			for _, e := range ents {
				if !e.IsDir() && strings.HasSuffix(e.Name(), ".jsonl") {
					add(filepath.Join(dir, e.Name()))
				}
			}
		}
	}
	sort.Strings(mains)
	sort.Strings(sides)
	return append(mains, sides...), nil
}

// isSidechainPath reports whether p names a subagent or compaction
// transcript: agent-*.jsonl, or a file in a directory named subagents.
func isSidechainPath(p string) bool {
	return strings.HasPrefix(filepath.Base(p), "agent-") || filepath.Base(filepath.Dir(p)) == "subagents"
}
