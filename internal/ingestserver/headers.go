package ingestserver

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
)

// This file is how the ingest keeps JetStream's publish promises
// (nats-server's jetstream headers; docs/events.md, "Headers"): each
// expectation a publisher may send is either checked, atomically with
// the append, or refused with a documented code; no header that would
// change what JetStream stores or when is ever ignored.
//
//   - Nats-Expected-Stream: must be AGENT_EVENTS, else 10060.
//   - Nats-Expected-Last-Subject-Sequence: the session's last sequence
//     (the subject is the session's), else 10071.
//   - Nats-Expected-Last-Sequence: on the session too, else 10071: a
//     publisher sees only its own sessions of a stream every tenant
//     shares, so its "last sequence" is its session's.
//   - Nats-Expected-Last-Msg-Id: the id of the session's last event,
//     else 10070.
//   - any other Nats-Expected-* header, and the headers of a JetStream
//     atomic batch, message TTL, rollup, counter or schedule: refused
//     with ingest.CodeUnsupportedHeader (14005), nothing stored.
//
// Header names are matched without regard to case.

// expectations are the JetStream expectations a request carries.
type expectations struct {
	stream    string // Nats-Expected-Stream
	hasSeq    bool   // Nats-Expected-Last-(Subject-)Sequence given
	seq       uint64 // its value: the session's last sequence
	lastMsgID string // Nats-Expected-Last-Msg-Id
}

// conditional reports whether the append depends on the session's state.
func (x expectations) conditional() bool { return x.hasSeq || x.lastMsgID != "" }

// unsupportedPrefixes are the JetStream publish headers whose promise the
// ingest cannot keep (nats.go jetstream's header names; ADR-50 batches,
// ADR-43 TTLs and counters, ADR-51 schedules).
var unsupportedPrefixes = []string{
	"nats-expected-", "nats-batch-", "nats-ttl", "nats-rollup", "nats-schedule", "nats-incr", "nats-marker-reason",
}

// hasExpectations reports whether h holds a header readExpectations
// checks or refuses: the request is then appended on its own.
func hasExpectations(h nats.Header) bool {
	for k := range h {
		if len(k) < 5 || !strings.EqualFold(k[:5], "nats-") {
			continue // most headers, every request: no allocation
		}
		for _, p := range unsupportedPrefixes {
			if len(k) >= len(p) && strings.EqualFold(k[:len(p)], p) {
				return true
			}
		}
	}
	return false
}

// readExpectations reads the JetStream headers of a request: the
// expectations to check, or the refusal of a header the ingest does not
// support or a value that is not one.
func readExpectations(h nats.Header) (expectations, *refusal) {
	var x expectations
	seqs := map[string]uint64{}
	for k, vs := range h {
		if len(vs) == 0 {
			continue
		}
		v := strings.TrimSpace(vs[0])
		switch {
		case strings.EqualFold(k, jetstream.ExpectedStreamHeader):
			x.stream = v
		case strings.EqualFold(k, jetstream.ExpectedLastSubjSeqHeader), strings.EqualFold(k, jetstream.ExpectedLastSeqHeader):
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return x, &refusal{status: 400, code: ingest.CodeInvalid, quarantine: true, outcome: "invalid",
					reason: fmt.Sprintf("header %s: %q is not a sequence", k, v)}
			}
			seqs[k] = n
		case strings.EqualFold(k, jetstream.ExpectedLastMsgIDHeader):
			if v == "" {
				return x, &refusal{status: 400, code: ingest.CodeInvalid, quarantine: true, outcome: "invalid",
					reason: fmt.Sprintf("header %s: empty", k)}
			}
			x.lastMsgID = v
		default:
			lk := strings.ToLower(k)
			for _, p := range unsupportedPrefixes {
				if strings.HasPrefix(lk, p) {
					return x, &refusal{status: 400, code: ingest.CodeUnsupportedHeader, outcome: "unsupported",
						reason: fmt.Sprintf("header %s is not supported by Turnstone's ingest, so its promise cannot be kept: nothing was stored. Supported: %s, %s, %s, %s and %s (docs/events.md); send a batch as a JSON array",
							k, jetstream.MsgIDHeader, jetstream.ExpectedStreamHeader, jetstream.ExpectedLastSubjSeqHeader, jetstream.ExpectedLastSeqHeader, jetstream.ExpectedLastMsgIDHeader)}
				}
			}
		}
	}
	for k, n := range seqs {
		if x.hasSeq && n != x.seq {
			return x, &refusal{status: 400, code: ingest.CodeWrongLastSequence, outcome: "conflict",
				reason: fmt.Sprintf("wrong last sequence: header %s says %d, another expectation says %d", k, n, x.seq)}
		}
		x.hasSeq, x.seq = true, n
	}
	if x.stream != "" && x.stream != events.EventsStream {
		return x, &refusal{status: 400, code: ingest.CodeStreamNotMatch, outcome: "invalid",
			reason: fmt.Sprintf("expected stream does not match: %s is %q, the ingest stores in %s", jetstream.ExpectedStreamHeader, x.stream, events.EventsStream)}
	}
	return x, nil
}

// checkExpectations checks what a conditional request expects of its
// session before its atomic append, and returns the last sequence to
// append on: the expected one, or the session's as it is now (for
// Last-Msg-Id). The atomic append checks that sequence again, so the
// whole check holds at the moment of the write.
func (s *Server) checkExpectations(ctx context.Context, x expectations, tenant, session string) (uint64, *refusal, error) {
	if x.hasSeq && x.lastMsgID == "" {
		return x.seq, nil, nil
	}
	last, id, err := s.log.LastID(ctx, tenant, session)
	if err != nil && !errors.Is(err, events.ErrSessionNotFound) {
		return 0, nil, err
	}
	if x.lastMsgID != "" && x.lastMsgID != id {
		return 0, &refusal{status: 400, code: ingest.CodeWrongLastMsgID, outcome: "conflict",
			reason: fmt.Sprintf("wrong last msg ID: the session's last event is %q, not %q; read it again and decide again", id, x.lastMsgID)}, nil
	}
	if x.hasSeq && x.seq != last {
		return 0, &refusal{status: 400, code: ingest.CodeWrongLastSequence, outcome: "conflict",
			reason: "wrong last sequence: the session changed since it was read; read it again and decide again"}, nil
	}
	return last, nil, nil
}
