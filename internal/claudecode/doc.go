// Package claudecode imports Claude Code session transcripts into the
// Turnstone event log.
//
// Claude Code writes each session as a JSONL file (one record a line) under
// ~/.claude/projects/<project>/: <sessionId>.jsonl, and since 2.1 its
// subagents' and its compaction agent's transcripts in
// <sessionId>/subagents/agent-<agentId>.jsonl. Convert and ConvertFile turn
// one transcript into events.Event values; Expand lists the transcripts
// named by command-line arguments, parents first; Import appends the events
// of many transcripts to a Store idempotently.
//
// # Sessions
//
// One transcript file is one session. Its token is the records' sessionId
// (which may differ from the file name). A sidechain transcript (a file
// agent-*.jsonl, or records with isSidechain and agentId) is a session of
// its own, "<sessionId>_agent-<agentId>", of kind "subagent", or
// "compaction" for agent-acompact-* files, whose session.started names the
// parent session and, when the parent was converted first by the same
// Converter, the Task tool_use that ran it (from the parent's agent_progress
// records, its Task results' toolUseResult.agentId, or the Task input's
// prompt). Claude Code 1.0 wrote subagent records inline in the parent's
// file (isSidechain, no agentId): each chain of them, from a record with no
// sidechain parent, becomes a session "<sessionId>_agent-<first uuid>"
// linked to the Task call whose prompt it received.
//
// # Events
//
// A session starts with session.started (runtime "claude-code <version>",
// the first model, provider "anthropic", labels cwd, git_branch, slug,
// agent_id, subagent_type; history true unless the file is followed live), read from the
// records up to and including the session's first model response, so that
// it says the same whatever follows. A subagent's subagent_type comes from
// its Task call, else from the agent-<id>.meta.json Claude Code 2.1 writes
// beside its transcript. Then, record by record:
//
//   - A prompt starts a turn: turn.started (turn = the record's uuid,
//     prompt = its first 200 characters, trigger "user", "subagent" or
//     "compaction" by session kind, "warmup" for Claude Code 2.0's warm-up
//     request to a subagent type, "Warmup", which no Task call ran), then
//     the prompt as message.appended. A
//     prompt is a user record of text or images a person typed; a slash
//     command that expands to a prompt (/init, custom commands; trigger
//     "command", prompt "/name args"); or a background task's
//     <task-notification> (trigger "task_notification"), which Claude Code
//     delivers as a new user message. Tool results, isMeta records,
//     compact summaries, interruption markers, local commands (/compact,
//     /mcp, /model: a <local-command-caveat> precedes them or their
//     <local-command-stdout> follows) and their output, and "!" shell
//     commands start no turn.
//   - Every user and assistant record that goes into the model's history is
//     a message.appended with its content blocks in the Anthropic shapes (a
//     string content is one text block). Claude Code writes one assistant
//     record per content block; the records of one API response (same
//     message.id) are merged into one message.appended at the first
//     record's time (stop_reason: the last one set), and the tool results
//     Claude Code wrote between them (it runs a tool as soon as its block is
//     streamed) follow the merged message, so the history is the one sent to
//     the API. isMeta records, compact summaries and command output are
//     meta; interruption markers stay as user text.
//   - Each tool_use block gets tool_call.started (at its record's time) and
//     its tool_result tool_call.completed (is_error; duration_ms from
//     toolUseResult's durationMs, totalDurationMs or durationSeconds, else
//     the time between the two records), placed before the result's
//     message.appended.
//   - An API error record (an assistant record with isApiErrorMessage or an
//     "error" field: the model call failed for good) is error.recorded
//     (message; HTTP status from apiErrorStatus, the error object or "API
//     Error: NNN"; code = the provider's error type or Claude Code's
//     category; kind transient for 408, 429, 5xx and overload, rate-limit
//     and connection errors, logic for other 4xx and request,
//     authentication, permission and billing errors, else unknown;
//     consecutive = how many API errors with the same status (or code) in a
//     row, reset by a model response; stage execute), not a message. A
//     system api_error record (Claude Code 2.x: an attempt it retries, with
//     retryAttempt) is error.recorded too, but does not decide the turn's
//     outcome.
//   - A compact_boundary record is distillation.requested (reason = the
//     trigger), distillation.started and distillation.completed (trigger,
//     tokens_before = preTokens, tokens_after = the next model call's input
//     plus cache tokens), followed by the isCompactSummary record as a meta
//     user message. An automatic compaction inside a turn carries the
//     turn's id; a manual one (/compact), or one after the turn's stop hook
//     ran, happens between turns: the turn ends first and the distillation
//     has no turn.
//
// A turn ends just before the next turn starts, before a local command (or
// a system local_command record) or a manual compaction: turn.failed
// (stage execute) with the error when its last user-visible record was an
// API error, otherwise turn.completed with reason "interrupted" after an
// interruption marker, else "end_turn", and duration_ms from the turn's
// prompt to its latest user or assistant record. Records before the first
// prompt (the isMeta context of a compaction agent's transcript) and local
// commands between turns are messages with no turn.
//
// A sidechain transcript that begins with the model's response has lost
// its prompt: Claude Code 2.0.42 to 2.0.55 did not write the "Warmup" it
// sends each subagent type when a session starts (2.0.28 to 2.0.37 and
// 2.0.64 write it). Its turn starts with the prompt written back, as a
// meta and synthetic user message: the Task call's prompt when a Task call
// ran it, else "Warmup" (trigger "warmup").
//
// # The end of a transcript
//
// A transcript file has no end marker: its last line may be the last of
// the session, or the latest of a file Claude Code is still writing. The
// end of the records ends the last turn only when the transcript says how
// it ended: after an interruption marker or an API error that ended the
// model call, or when the model's latest response answered and nothing
// awaits it (in a history import; in live mode only once a stop hook's
// summary or a turn_duration record, which Claude Code writes when a turn
// is over, follows it). A turn whose latest response has a tool_use
// without its result (the tool is running, or the process died: the file
// does not say which), or whose latest record is a user record the model
// has not answered, stays in flight: a later import of the grown file
// continues it, and only the reconciler's deadline (for a live session)
// or a person abandons it, which makes the pending tool_use an orphan.
//
// # Live transcripts and cut files
//
// A followed file (importer.Input.Live: `engine import --follow`, see
// NewFollower) may grow after it is read, and so may a copy of a file
// Claude Code was writing. The conversion never holds back a model
// response or a tool result: a response the file ends inside (Claude Code
// writes a response one content block a line, and runs tools between two
// of them) is recorded as far as it goes, with the results written between
// its blocks, as a piece (importer.PieceKey: keyed by its first and last
// records). A conversion told which events the log holds (Input.Stored)
// continues a response from the first record no stored piece holds, with
// the same message_id: the projection merges the pieces into one API
// message, and the results stay after it. In live mode it converts
// nothing of a session before its first model response (session.started
// describes it), and no slash command or compaction whose meaning the
// next record decides (a local command's output; the next model call's
// context size). Importing a cut file and then the whole file gives the
// projection the whole file gives, and flags nothing it does not. A
// history import of a cut copy may guess the end of its last turn (a
// response the person then interrupted), a compaction's size, or a
// sidechain's session.started before its first response otherwise than
// the grown file: the grown file's versions of those events are then
// dropped as already stored, and nothing breaks. Claude Code before 2.1
// writes no record when a turn is over: in live mode the last turn of
// such a session stays in flight until the next prompt.
//
// Before a turn's first model output (an assistant message or an API
// error) the conversion records turn.stage_completed for context and
// history: the turn is in execute while its tools run.
//
// Other records (progress, file-history-snapshot, queue-operation,
// summary, system stop_hook_summary, turn_duration and local_command)
// produce no event and are counted in Result.Skipped by type
// ("system/<subtype>" for system records); agent_progress records still
// serve for linking, stop_hook_summary and turn_duration to know a turn is
// over. Prompts queued while a turn runs reach the model without a user
// record (only a queue-operation holds their text), so they are not in the
// history.
//
// # Identity and order
//
// Every event time is its record's timestamp (a turn's end: its latest
// user or assistant record's). Event ids are
// events.DeterministicID(time, "<tenant>/<session>/<record uuid>/<kind>"),
// and a turn's end is events.DeterministicID(the turn's start,
// "<tenant>/<session>/<turn>/end") whatever the outcome, so converting a
// transcript twice gives the same events, Import skips those a store
// already holds, and no import ever ends a turn twice. Events are in the
// order above, which follows the file; Claude Code's timestamps are not
// always monotonic, and neither are the events' times. Conversion follows
// the file order, not the parentUuid tree: a transcript with rewound
// branches converts them in the order they were written.
//
// # Errors
//
// A malformed line (bad JSON, a field of the wrong type, a blank line, a
// user or assistant record without uuid, timestamp or content) or a line
// over Options.MaxLineBytes is a Diagnostic ("file:line: problem") and is
// skipped; the rest of the file is converted. Every event produced passes
// events.Validate; secrets are masked later, by the log on append. Nothing
// in this package panics on its input.
package claudecode
