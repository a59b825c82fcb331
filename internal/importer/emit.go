package importer

import (
	"fmt"
	"time"

	"github.com/turnstone-dev/turnstone/events"
)

// Emitter builds the events of one converted session: each with a
// deterministic id, the session's source, validated; an event that fails
// validation is a Diagnostic of the line it came from instead. It also
// knows which events the log holds already (Input.Stored), for Pieces.
type Emitter struct {
	s      *Session
	res    *Result
	source string
	prefix string
	stored StoredIDs
	have   map[string]struct{}
	loaded bool
	err    error
	staged map[string]bool
}

// NewEmitter returns an Emitter that appends to s.Events, reports invalid
// events in res, sets source on every event, and asks stored (may be nil)
// which events the log holds.
func NewEmitter(s *Session, res *Result, source string, stored StoredIDs) *Emitter {
	return &Emitter{s: s, res: res, source: source, prefix: s.Tenant + "/" + s.Session + "/", stored: stored, staged: map[string]bool{}}
}

// ID is the event id of key at time idAt in this session:
// events.DeterministicID(idAt, "<tenant>/<session>/<key>").
func (e *Emitter) ID(idAt time.Time, key string) string {
	return events.DeterministicID(idAt, e.prefix+key)
}

// Emit appends one event of type p at time at, its id from key and at.
// line is the transcript line it comes from, for a Diagnostic.
func (e *Emitter) Emit(at time.Time, key, turn string, p events.Payload, line int) {
	e.EmitID(at, at, key, turn, p, line)
}

// EmitID is Emit with the id's time idAt apart from the event's time at
// (a turn's end takes its id from the turn's start, so that it is the
// same event whenever it is converted).
func (e *Emitter) EmitID(at, idAt time.Time, key, turn string, p events.Payload, line int) {
	ev, err := events.NewAt(at, e.ID(idAt, key), e.s.Tenant, e.s.Session, turn, p)
	if err == nil {
		ev.Source = e.source
		err = events.Validate(&ev)
	}
	if err != nil {
		e.res.Diagnostics = append(e.res.Diagnostics, Diagnostic{File: e.s.File, Line: line,
			Err: fmt.Errorf("convert %s: %w", p.EventType(), err)})
		return
	}
	e.s.Events = append(e.s.Events, ev)
}

// Stored reports whether the log holds the event with id. It asks
// Input.Stored once; its error is kept (Err) and counts as "not stored".
func (e *Emitter) Stored(id string) bool {
	if !e.loaded {
		e.loaded = true
		if e.stored != nil {
			e.have, e.err = e.stored(e.s.Tenant, e.s.Session)
		}
	}
	_, ok := e.have[id]
	return ok
}

// Err is the error Input.Stored returned, if it did.
func (e *Emitter) Err() error { return e.err }

// Stages records that turn has left its context and history stages
// (turn.stage_completed for each), once per turn and conversion, before
// its first model output (assistant message, tool call or model error) at
// time at: importers have no stage events from the runtime, and a turn
// whose model answered is in its execute stage. The events take their ids
// from the turn and at, so a file converted before and after it grew
// gives them once.
func (e *Emitter) Stages(at time.Time, turn string, line int) {
	if turn == "" || e.staged[turn] {
		return
	}
	e.staged[turn] = true
	for _, st := range []events.Stage{events.StageContext, events.StageHistory} {
		e.Emit(at, turn+"/stage/"+string(st), turn, &events.TurnStageCompleted{Stage: st}, line)
	}
}

// PieceKey is the event key of the message.appended that records the
// records first..last of one assistant response. A whole response, read
// to its end, is "<first>/message"; a piece of one (the response was still
// open where the file ended, or it continues pieces stored before) is
// "<first>/message/<last>", so that a piece and the whole are other
// events, and a grown file's conversion can tell which records the stored
// pieces hold (Pieces). first and last are the records' own keys (a uuid,
// a line number).
func PieceKey(first, last string, whole bool) string {
	if whole {
		return first + "/message"
	}
	return first + "/message/" + last
}

// Piece is the records From..To (indexes, inclusive) of one response,
// recorded as one message.appended; Whole when it is the whole response
// read to its end (PieceKey).
type Piece struct {
	From, To int
	Whole    bool
}

// Pieces returns how to record a response of n records: the pieces the
// log holds already (Input.Stored), in order from the first record, and
// then, for the records no stored piece holds, one more piece, Whole when
// it starts at the first record and closed says the response is read to
// its end. Re-recording the stored pieces as they were gives the same
// events again (the log drops them); the last piece continues them.
// id(i, j, whole) is the id of the message.appended that records records
// i..j (PieceKey, at record i's time). A stored piece is only ever
// followed by the piece that starts after its last record.
func (e *Emitter) Pieces(n int, closed bool, id func(i, j int, whole bool) string) []Piece {
	if n == 0 {
		return nil
	}
	if e.stored != nil {
		if e.Stored(id(0, n-1, true)) {
			return []Piece{{From: 0, To: n - 1, Whole: true}}
		}
	}
	var out []Piece
	start := 0
	if e.stored != nil {
	next:
		for start < n {
			for j := n - 1; j >= start; j-- {
				if e.Stored(id(start, j, false)) {
					out = append(out, Piece{From: start, To: j})
					start = j + 1
					continue next
				}
			}
			break
		}
	}
	if start < n {
		out = append(out, Piece{From: start, To: n - 1, Whole: start == 0 && closed})
	}
	return out
}
