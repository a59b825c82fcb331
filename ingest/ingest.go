// Package ingest is how events from publishers Turnstone does not trust
// reach the log: the engine answers the wire contract's publish subject
// agent.evt.<tenant>.<session> itself, validates, masks and appends each
// event to its stored subject agent.evt.<partition>.<tenant>.<session>
// (which only Turnstone's processes may publish to), and replies as
// JetStream would. It also answers reads of a session
// (agent.read.<tenant>.<session>), so a tenant's service can read its own
// sessions without access to the streams. docs/events.md is the contract;
// docs/security.md says who may send what.
//
// This package is the publisher's side: the wire names and reply shapes,
// and Client, an events.SessionLog over the same subjects in Go. The
// engine's side is internal (internal/ingestserver).
package ingest

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// Names of the ingest side.
const (
	// ReadSubjectPrefix starts the subject of a read request:
	// agent.read.<tenant>.<session>.
	ReadSubjectPrefix = "agent.read"
	// ReadQueue is the queue group the engines answer reads in: any one
	// engine answers each.
	ReadQueue = "turnstone-readers"
	// QuarantineStream holds the events the ingest refused, with why.
	QuarantineStream = "AGENT_QUARANTINE"
	// QuarantineSubjectPrefix starts its subjects:
	// agent.rejected.<tenant>.<session> (_invalid in place of a token
	// that is not one), so an erase purges a session's records by subject.
	// Records of earlier versions are under agent.rejected.<tenant>.
	QuarantineSubjectPrefix = "agent.rejected"
	// RequestInfoHeader is the header NATS adds to a request that came
	// through a service import with share (the publisher's account and
	// user); the quarantine keeps it as the publisher's identity.
	RequestInfoHeader = "Nats-Request-Info"
	// IngestSubjectPrefix starts the subject an append reaches the
	// engines on once the NATS server mapped it to its partition:
	// agent.in.<partition>.<tenant>.<session> (IngestMapping). Publishers
	// never use it; each engine subscribes to its own partitions'.
	IngestSubjectPrefix = "agent.in"
)

// IngestSubject is the subject a session's appends reach the engines on
// after the server's mapping: agent.in.<partition>.<tenant>.<session>.
// partition -1 writes the wildcard "*".
func IngestSubject(partition int, tenant, session string) string {
	p := "*"
	if partition >= 0 {
		p = strconv.Itoa(partition)
	}
	return IngestSubjectPrefix + "." + p + "." + tenant + "." + session
}

// IngestMapping is the NATS subject mapping that sends each append to the
// engine owning its session's partition, for a stream of partitions
// partitions: source agent.evt.*.* (the publish subject), destination
// agent.in.{{partition(P,1,2)}}.{{wildcard(1)}}.{{wildcard(2)}}. The
// server computes the partition with the same hash as the stream's
// (events.Partition: FNV-1a over the tenant then the session token,
// modulo P), so each engine receives only the publishes of the
// partitions it owns. It goes in the `mappings` of the account the
// engines run in (TURNSTONE under auth: auth.ServerConfig writes it; the
// global account of a server without accounts: embedded.Server.MapIngest,
// or a `mappings` block in an external server's configuration;
// docs/scaling.md). NATS applies an account's mappings to the requests
// that reach it through a service import too (nats-server 2.10+), so the
// tenants' accounts need none.
func IngestMapping(partitions int) (source, destination string) {
	return events.EventSubjectPrefix + ".*.*", fmt.Sprintf("%s.{{partition(%d,1,2)}}.{{wildcard(1)}}.{{wildcard(2)}}", IngestSubjectPrefix, partitions)
}

// Error codes of an ingest reply's error.err_code, beside JetStream's own
// (10071 wrong last sequence, 10164 batch wrong last sequence, 10054
// message too large). docs/events.md lists them.
const (
	// CodeInvalid: the event breaks the wire contract; it was quarantined.
	CodeInvalid = 14000
	// CodeForbidden: the event's type or source is Turnstone's own
	// (recovery.*, snapshot.taken, breaker.changed, session.rewound,
	// session.forked; a source starting urn:turnstone:, the worker's and
	// the reconciler's); it was quarantined.
	CodeForbidden = 14001
	// CodeUnavailable: the log could not be written; try again.
	CodeUnavailable = 14003
	// CodeBusy: the publisher's tenant has as many requests queued in the
	// session's partition as the engine takes (docs/limits.md); try
	// again. Other tenants are not slowed by it.
	CodeBusy = 14004
	// CodeUnsupportedHeader: the request carries a JetStream header whose
	// promise the ingest cannot keep (a Nats-Expected-* header other
	// than those docs/events.md lists, or an atomic batch's, TTL, rollup
	// or schedule header); nothing was stored. It is refused rather than
	// ignored, so a client never believes a condition held that was not
	// checked.
	CodeUnsupportedHeader = 14005
)

// JetStream's own error codes an ingest reply uses (nats-server's
// errors.json), beside the Code constants.
const (
	// CodeStreamNotMatch (10060): Nats-Expected-Stream named a stream
	// other than AGENT_EVENTS.
	CodeStreamNotMatch = 10060
	// CodeWrongLastMsgID (10070): Nats-Expected-Last-Msg-Id is not the id
	// of the session's last event.
	CodeWrongLastMsgID = 10070
	// CodeWrongLastSequence (10071): Nats-Expected-Last-Sequence or
	// Nats-Expected-Last-Subject-Sequence is not the session's last
	// sequence.
	CodeWrongLastSequence = 10071
	// CodeMessageTooLarge (10054): the event's body is larger than the
	// log's limit (1 MiB by default; headers do not count).
	CodeMessageTooLarge = 10054
)

// ReadSubject is the subject a session is read on.
func ReadSubject(tenant, session string) string {
	return ReadSubjectPrefix + "." + tenant + "." + session
}

// PubAck is an ingest reply, in the shape of JetStream's publish
// acknowledgement (so a client's JetStream publish can read it): the
// stream and sequence the event is stored at, whether it was a duplicate
// of one stored within the duplicate window, and for a batch the number
// of events (Seq is then the last one's). Error, when set, says why
// nothing was stored.
type PubAck struct {
	Stream    string    `json:"stream,omitempty"`
	Seq       uint64    `json:"seq,omitzero"`
	Duplicate bool      `json:"duplicate,omitzero"`
	Count     int       `json:"count,omitzero"`
	Error     *APIError `json:"error,omitempty"`
}

// APIError is the error of a reply, in JetStream's shape: an HTTP-like
// Code, an ErrCode (JetStream's or one of the Code constants) and a
// Description.
type APIError struct {
	Code        int    `json:"code"`
	ErrCode     int    `json:"err_code"`
	Description string `json:"description"`
}

// Error implements error.
func (e *APIError) Error() string {
	return fmt.Sprintf("ingest error %d (%d): %s", e.Code, e.ErrCode, e.Description)
}

// ReadRequest asks for the events of a session from FromSeq (0: the
// first) up to UntilSeq (0: the last), at most MaxEvents (0: the
// server's page size). MaxEvents -1 asks only for the session's last
// sequence.
type ReadRequest struct {
	FromSeq   uint64 `json:"from_seq,omitzero"`
	UntilSeq  uint64 `json:"until_seq,omitzero"`
	MaxEvents int    `json:"max_events,omitzero"`
}

// ReadReply is a page of a session's events: each stored event (Seq,
// store time, and its body as stored: masked JSON), the session's last
// sequence, and NextSeq, the FromSeq of the next page (0 when this page
// reached UntilSeq or the end). Error is set instead when the read failed
// (404 when the session has no event).
type ReadReply struct {
	Tenant  string       `json:"tenant"`
	Session string       `json:"session"`
	LastSeq uint64       `json:"last_seq"`
	Events  []StoredItem `json:"events"`
	NextSeq uint64       `json:"next_seq,omitzero"`
	Error   *APIError    `json:"error,omitempty"`
}

// StoredItem is one stored event of a ReadReply.
type StoredItem struct {
	Seq     uint64          `json:"seq"`
	Subject string          `json:"subject"`
	Stored  time.Time       `json:"stored,omitzero"`
	Event   json.RawMessage `json:"event"`
}

// QuarantineSubject is the subject of a session's quarantine records:
// agent.rejected.<tenant>.<session>, with "_invalid" in place of a token
// that is not one.
func QuarantineSubject(tenant, session string) string {
	if !events.ValidToken(tenant) {
		tenant = "_invalid"
	}
	if !events.ValidToken(session) {
		session = "_invalid"
	}
	return QuarantineSubjectPrefix + "." + tenant + "." + session
}
