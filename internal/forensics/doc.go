// Package forensics holds what a person replaying the log after an
// incident reads, built from the log and the fleet index without holding
// either whole:
//
//   - diff.go: Diff, what changed in a session's projected state between
//     two stream sequences (`engine diff`, the web view's diff page);
//   - timeline.go: Timeline, one session's events folded up to a sequence,
//     as the web view's session page draws it (turns as bands with their
//     stages and tool calls, anomalies at the event where they arose, the
//     history as the model sees it, every recovery command and attempt);
//   - mirror.go: IndexMirror, an in-memory copy of the fleet index (KV bucket
//     projections.IndexBucket) kept fresh with a watch, filtered and
//     paged without restoring any session;
//   - incidents.go: the fleet's correlated incidents (package correlate),
//     from the index and the states of the anomalous sessions only.
//
// Compare and the timeline's fold are pure; DiffLog, BuildTimeline, IndexMirror
// and Incidents read JetStream.
package forensics
