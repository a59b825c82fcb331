// Package codex imports OpenAI Codex rollouts into the Turnstone event
// log, on the importers' shared interface (internal/importer: Format,
// Converter, Import, the Follower).
//
// Codex (CLI, TUI, `codex exec`, the desktop and IDE front-ends) writes
// each session as a rollout, ~/.codex/sessions/YYYY/MM/DD/
// rollout-<time>-<uuid>.jsonl: one JSON object a line, {timestamp, type,
// payload} (and ordinal since 0.146), appended as the session goes. The
// line types are session_meta, turn_context, response_item (an item of
// the model's history, ResponseItem in codex-rs/protocol), event_msg
// (events Codex persists: EventMsg, filtered by
// codex-rs/rollout/src/policy.rs) and compacted; newer versions add more
// (world_state, inter_agent_communication_metadata), which are counted in
// Result.Unknown and never fatal. docs/importers.md describes the format
// and its versions; the rules below are the mapping.
//
// # Sessions
//
// One rollout is one session; its token is the first session_meta's id
// (a rollout without one takes the uuid of its file name). Only the first
// session_meta sets the identity (0.146 writes more, for its subagents'
// threads): session.started, at that line's time, has runtime
// "codex <cli_version>", provider model_provider, kind subagent with the
// parent thread as parent_session when its source is a subagent's, and
// the labels cwd, originator ("Codex Desktop", "codex_exec"), source,
// git_branch, git_commit and forked_from; history true unless the file is
// followed live. It is read from session_meta alone, so it says the same
// however much of the file was read.
//
// # Turns
//
//   - event_msg task_started (turn_started) opens a turn; turn = its
//     turn_id. Its turn.started waits for the prompt (the next lines), and
//     carries it.
//   - task_complete (turn_complete) completes it (reason end_turn), or
//     fails it (stage execute) when it carries an error (0.146) or a model
//     error was the turn's last word; turn_aborted completes it with the
//     abort's reason (interrupted, replaced, review_ended,
//     budget_limited).
//   - A turn whose calls have no output yet ends once they have: Codex
//     writes an output after its turn was aborted (0.146), and the output
//     answers its call.
//   - A task_started while a turn is still open abandons it (reason "a new
//     task started before this turn ended", in execute once the model
//     answered): a person started new work over it, and its calls without
//     an output become orphans; an open turn that only waited for outputs
//     ends with its own end, and one a model error ended fails.
//   - A task_started naming the open turn again starts nothing (counted as
//     skipped); one reusing the turn_id of an ended turn opens a turn of
//     its own, turn "<turn_id>-L<line>", so that no two events share an id.
//   - Without task events (0.77) a user message opens an implicit turn
//     (turn "implicit-L<line>"), which the next one ends: completed, or
//     abandoned while a call of it has no output.
//   - A turn still open at the end of the file stays in flight; a history
//     import ends an implicit turn whose model answered last (the file
//     does not say more), and a turn a model error ended.
//   - Before a turn's first model output (or model error), turn.stage_
//     completed for context and history: the turn is in execute.
//
// # Messages
//
// A prompt is the user message item a user_message event names: the
// latest user item before it (0.77, 0.104) or the next one (0.146, which
// writes the event first). Other user items (AGENTS.md, the environment
// context), developer messages and other agents' messages are meta user
// messages; those Codex injects before a task belong to no turn. A user
// message a person typed into a running task is a message of that turn
// (no new turn). Items wait for what decides them: a user item for its
// user_message, and an item written while a call of the latest response
// had no output for that output (the Anthropic shape puts the results
// first).
//
// The model's items of one response (reasoning as a thinking block with
// its summary; assistant message text; function_call, custom_tool_call
// and local_shell_call as tool_use with id = call_id and the arguments as
// input; web_search_call, image_generation_call and tool_search_call, and
// tool_search_output, as server_tool_use and tool_search_tool_result
// blocks, which Codex's provider runs itself and which have no output to
// wait for) form one assistant message.appended, message_id
// "rollout-L<line of its first item>", model from the latest
// turn_context. The response ends at the token_count whose total grew,
// the next turn_context, or anything else of the history; outputs
// written while it streamed follow it. Its usage is that token_count's
// last_token_usage (OpenAI counts cached tokens in the input: input_tokens
// is the difference, cache_read_input_tokens the cached part,
// reasoning_output_tokens the reasoning); Codex repeats a count, and only
// one whose total grew is a model call.
//
// Each tool_use gets tool_call.started; each output (*_output: a string,
// an array of content items, or one) tool_call.completed and a tool_result
// paired by call_id, also across its turn's end. Its is_error comes from
// the call's *_end event (exit_code, success, an MCP result's Err or
// isError), else from the output ("Process exited with code N", "Exit
// code: N", an object with success false), else from the shell tool's
// metadata.exit_code (0.77). Turnstone never writes an output Codex did
// not write: a call without one stays pending, and becomes an orphan when
// its turn is abandoned.
//
// An error event is error.recorded (message; code, the name of its
// codex_error_info; its HTTP status; kind transient for overload,
// connection, stream, server and usage-limit errors, logic for
// unauthorized, bad request, context window and sandbox errors).
//
// # Compaction
//
// A compacted line (summary message, replacement_history) and the
// context_compacted event after it are one compaction: distillation.
// requested, .started and .completed in the turn it happened in (an
// inline compaction), with tokens_before the context of the model call
// before it (its total tokens) and tokens_after the input of the first
// model call after it, then the summary (or Turnstone's note of how many
// items replaced the history) as a meta user message. It is recorded
// before the next event of the history, once the calls that ran through
// it have their outputs.
//
// # What is not mapped
//
// thread_rolled_back (num_turns: the last user turns a client rolled
// back out of the model's context) records nothing and is counted in
// Result.Skipped: the event model's rewind, session.rewound, is written
// by Turnstone alone and names a log sequence that a conversion cannot
// know, so the rolled-back turns stay in the recorded history. A response
// recorded live before its token_count was written (a followed file read
// between the two) keeps no usage: no later event can carry it without
// content. docs/importers.md ("Known limits") says how often each occurs.
//
// # Identity, cuts and live files
//
// Event ids are events.DeterministicID(time, "<tenant>/<session>/<key>")
// with keys from the file: a line's number (Codex appends to a rollout,
// never rewrites it), a turn's id, a call's id. Importing a rollout twice
// stores nothing new; a grown rollout continues its session. A file cut
// anywhere (a copy taken while Codex wrote it, or a followed file) records
// a response cut by its end as far as it goes, with its calls (the
// importer never holds back a call it read: see importer.PieceKey), and the
// grown file continues it. What the next lines decide waits for them: an
// item not known yet to be a prompt, a turn whose prompt is not written,
// and, in a followed file, a compaction the file ends with. A cut between
// a compaction and the first model call after it cannot know the size
// after the compaction: a distillation recorded from such a cut has
// tokens_after 0.
//
// A malformed line (not a JSON object with a type) or a line over
// Options.MaxLineBytes is a Diagnostic and is skipped; an unreadable
// timestamp is not an error (the line takes the time of the line before
// it). Every event produced passes events.Validate; secrets are masked by
// the log on append. Nothing in this package panics on its input.
package codex
