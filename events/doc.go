// Package events is Turnstone's event model and its append-only log on NATS
// JetStream.
//
// An Event is one JSON object on the wire: a CloudEvents 1.0 style envelope
// (specversion, id, type, source, time) plus tenant, session, an optional
// turn, and a typed data payload. Message content blocks follow the
// Anthropic Messages API shapes (text, tool_use, tool_result, thinking).
// The wire contract is documented for publishers in any language in
// docs/events.md.
//
// Every event is validated (Validate) and masked (Mask) before it is
// stored: bearer tokens, API keys, cloud keys, passwords, private keys and
// credentials in URLs never reach the log (docs/masking.md lists the forms).
//
// Log (log.go) stores events in the AGENT_EVENTS stream, one subject per
// session, and reads them back by sequence or time, or follows new ones.
// The package knows nothing about projections or recovery.
package events
