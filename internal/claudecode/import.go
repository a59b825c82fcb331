package claudecode

import (
	"context"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/importer"
)

// ImportChunk is how many events Import appends in one Store.Append call.
const ImportChunk = importer.ImportChunk

// Store is where Import appends events (importer.Store).
type Store = importer.Store

// Progress is called by Import as it goes (importer.Progress).
type Progress = importer.Progress

// Report is what an Import did (importer.Report).
type Report = importer.Report

// LogStore returns the Store of the event log l (importer.LogStore).
func LogStore(l events.SessionLog) Store { return importer.LogStore(l) }

// Import converts the Claude Code transcript files in order (see Expand,
// which lists parents before their subagents so the subagents are linked
// to their Task tool calls) and appends their events to store
// idempotently: importer.Import with Format.
func Import(ctx context.Context, store Store, files []string, opts Options, progress Progress) (*Report, error) {
	return importer.Import(ctx, store, Format, files, opts, progress)
}
