package claudecode

import (
	"path/filepath"
	"strings"

	"github.com/turnstone-dev/turnstone/internal/importer"
)

// FormatName is the name of the format, `engine import --format
// claude-code`.
const FormatName = "claude-code"

// Format is Claude Code's transcript format, for importer.Import and
// importer.NewFollower: Expand lists the transcripts; a followed directory
// follows every *.jsonl under it, and a followed session file also its
// <session>/subagents directory; subagent transcripts are converted after
// their parents.
var Format importer.Format = format{}

type format struct{}

func (format) Name() string                           { return FormatName }
func (format) Expand(args []string) ([]string, error) { return Expand(args) }
func (format) Transcript(p string) bool               { return strings.HasSuffix(p, ".jsonl") }
func (format) Sidechain(p string) bool                { return isSidechainPath(p) }

func (format) Companions(p string) []string {
	if !strings.HasSuffix(p, ".jsonl") || isSidechainPath(p) {
		return nil
	}
	return []string{filepath.Join(strings.TrimSuffix(p, ".jsonl"), "subagents")}
}

func (format) NewConverter(opts importer.Options) (importer.Converter, error) {
	c, err := NewConverter(opts)
	if err != nil {
		return nil, err
	}
	return c, nil
}
