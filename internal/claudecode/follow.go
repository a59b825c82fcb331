package claudecode

import "github.com/turnstone-dev/turnstone/internal/importer"

// Defaults of FollowConfig (importer's).
const (
	DefaultRecent = importer.DefaultRecent
	DefaultSettle = importer.DefaultSettle
	DefaultRetry  = importer.DefaultRetry
)

// FollowConfig sets how a Follower follows transcripts
// (importer.FollowConfig).
type FollowConfig = importer.FollowConfig

// FollowRead is what one read of one transcript did (importer.FollowRead).
type FollowRead = importer.FollowRead

// Follower records Claude Code transcripts as they are written
// (importer.Follower).
type Follower = importer.Follower

// NewFollower returns a Follower of Claude Code transcripts: Claude Code
// appends each record to ~/.claude/projects/<project>/<session>.jsonl as
// it happens (and a subagent's to <session>/subagents/agent-<id>.jsonl
// since 2.1, or agent-<id>.jsonl beside the session in 2.0); the Follower
// reads parents before their subagents. See importer.NewFollower.
func NewFollower(store Store, cfg FollowConfig) (*Follower, error) {
	return importer.NewFollower(store, Format, cfg)
}
