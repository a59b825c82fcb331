// Package refruntime is Turnstone's reference agent runtime, for tests,
// demos and the image (cmd/refruntime ships it): it plays the part of a
// real runtime (a coding agent, a chat bot) that records its turns into
// Turnstone's event log and obeys Turnstone's runtime control requests,
// and it fails on demand.
//
// Recording. Runtime.RunTurn runs one turn of a session and appends its
// events with events.Log.Append, with the payloads of wire contract
// version 1 (docs/events.md): session.started (the first turn of a session
// the log does not hold yet), turn.started, turn.stage_completed for each
// stage (context, history, execute, finalize), the user prompt, an
// assistant message with text and tool_use blocks, tool_call.started and
// tool_call.completed for each tool, the user message with the tool_result
// blocks (results first), the final assistant text, and turn.completed.
// Turn starts are conditional (events.ExpectLastSeq on the session's last
// sequence); a conflict re-reads the session and tries again.
//
// Faults. TurnSpec.Fault injects one failure into a turn: FaultCrashMidTool
// (the process dies between a tool_use and its tool_result),
// FaultStageThrows (a stage throws: turn.failed), FaultProvider (the model
// provider answers with an HTTP error: error.recorded then turn.failed) and
// FaultHang (the turn never ends). Runtime.StartTurnAsync starts a turn and
// returns once it is in flight, so a second turn of the same session can
// start mid-turn. Runtime.SetProviderOutage makes every call to a provider
// fail until it is cleared.
//
// Control. Runtime.Open answers control requests (recovery.ControlRequest,
// JSON) on agent.ctl.<tenant>.* in the queue group "refruntime-<tenant>",
// with a recovery.ControlReply. Unscripted, each action does what a well
// behaved runtime would (see Runtime.Open for the catalogue);
// Runtime.ScriptReplies queues the replies a session gets for an action,
// so a recovery worker's strategy chain can be driven to any outcome; and
// Runtime.SetMode makes the runtime hang (receive, never reply) or go down
// (unsubscribe: requesters get nats.ErrNoResponders). Every request
// received is kept (Runtime.Requests, Runtime.Notices) for assertions.
package refruntime
