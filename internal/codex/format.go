package codex

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/turnstone-dev/turnstone/internal/importer"
)

// FormatName is the name of the format, `engine import --format codex`.
const FormatName = "codex"

// Format is Codex's rollout format, for importer.Import and
// importer.NewFollower: a directory (~/.codex/sessions, with its
// YYYY/MM/DD folders) is searched for rollout-*.jsonl files, a file is
// taken as it is; a followed directory picks up new day folders as they
// appear.
var Format importer.Format = format{}

type format struct{}

func (format) Name() string                           { return FormatName }
func (format) Expand(args []string) ([]string, error) { return Expand(args) }
func (format) Transcript(p string) bool               { return isRollout(p) }
func (format) Companions(string) []string             { return nil }
func (format) Sidechain(string) bool                  { return false }

func (format) NewConverter(opts importer.Options) (importer.Converter, error) {
	c, err := NewConverter(opts)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// isRollout reports whether a file found in a directory is a rollout:
// rollout-*.jsonl, as Codex names them (~/.codex also holds history.jsonl,
// which is not one).
func isRollout(p string) bool {
	b := filepath.Base(p)
	return strings.HasPrefix(b, "rollout-") && strings.HasSuffix(b, ".jsonl")
}

// Expand turns command-line arguments (rollout files or directories) into
// the sorted list of rollouts to convert: a directory is walked
// recursively for rollout-*.jsonl files; a file is taken as it is,
// whatever its name; a file named twice is listed once. It returns an
// error wrapping the fs error for an argument that cannot be read.
func Expand(args []string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	add := func(p string) {
		p = filepath.Clean(p)
		key := p
		if abs, err := filepath.Abs(p); err == nil {
			key = abs
		}
		if !seen[key] {
			seen[key] = true
			out = append(out, p)
		}
	}
	for _, arg := range args {
		fi, err := os.Stat(arg)
		if err != nil {
			return nil, fmt.Errorf("expand rollouts: %w", err)
		}
		if !fi.IsDir() {
			add(arg)
			continue
		}
		err = filepath.WalkDir(arg, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && isRollout(p) {
				add(p)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("expand rollouts: %w", err)
		}
	}
	sort.Strings(out)
	return out, nil
}
