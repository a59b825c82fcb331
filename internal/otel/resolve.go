package otel

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
	"go.opentelemetry.io/otel/trace"
)

// maxLinkDepth bounds a chain of sidechains (a subagent of a subagent...)
// the resolver follows; deeper ones (or a cycle) stop there.
const maxLinkDepth = 8

// maxScans bounds the sessions whose scan the resolver keeps.
const maxScans = 64

// link is where a sidechain's turns nest: the span of the parent's tool
// call that started it (invalid when the parent or the call is not in the
// log), and the root session of the chain (the main session the user
// talks to), which is every span's session.id.
type link struct {
	tool spanRef
	root string
}

// scan is what the resolver read of one session: its own parent link, the
// id of each turn's turn.started, and where each tool_use is.
type scan struct {
	parentSession, parentTool string
	turnStarted               map[string]string   // turn id -> event id
	toolUses                  map[string]toolSite // tool_use id -> its record
}

type toolSite struct{ eventID, turn string }

// resolver finds the parent tool call of a sidechain session in the log,
// so that the sidechain's turns nest under it in the parent's trace. It
// reads the parent session (not the exporter's state): the parent may be
// folded by another engine. It is safe for concurrent use.
type resolver struct {
	log projections.SessionReader

	mu    sync.Mutex
	scans map[string]*scan
	order []string
}

func newResolver(log projections.SessionReader) *resolver {
	return &resolver{log: log, scans: map[string]*scan{}}
}

// errFound ends a scan early.
var errFound = errors.New("found")

// scanSession reads a session up to the tool_use id want (all of it when
// want is empty or absent), from the cache when it holds want.
func (r *resolver) scanSession(ctx context.Context, tenant, session, want string) (*scan, error) {
	key := tenant + "/" + session
	r.mu.Lock()
	sc, ok := r.scans[key]
	r.mu.Unlock()
	if ok {
		if _, has := sc.toolUses[want]; has || want == "" {
			return sc, nil
		}
	}
	sc = &scan{turnStarted: map[string]string{}, toolUses: map[string]toolSite{}}
	err := r.log.ReadSession(ctx, tenant, session, events.ReadOptions{}, func(ev events.Event) error {
		if ev.Err != nil {
			return nil
		}
		switch ev.Type {
		case events.TypeSessionStarted:
			if p, err := ev.Payload(); err == nil {
				if ss := p.(*events.SessionStarted); ss.ParentSession != "" {
					sc.parentSession, sc.parentTool = ss.ParentSession, ss.ParentToolUseID
				}
			}
		case events.TypeTurnStarted:
			if _, ok := sc.turnStarted[ev.Turn]; !ok {
				sc.turnStarted[ev.Turn] = ev.ID
			}
		case events.TypeMessageAppended:
			p, err := ev.Payload()
			if err != nil {
				return nil
			}
			m := p.(*events.MessageAppended)
			if m.Role != events.RoleAssistant {
				return nil
			}
			for i := range m.Content {
				b := &m.Content[i]
				if b.Type == events.BlockToolUse && b.ID != "" {
					if _, ok := sc.toolUses[b.ID]; !ok {
						sc.toolUses[b.ID] = toolSite{eventID: ev.ID, turn: ev.Turn}
					}
					if b.ID == want {
						return errFound
					}
				}
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, errFound) {
		if errors.Is(err, events.ErrSessionNotFound) {
			return sc, nil
		}
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	r.mu.Lock()
	if _, ok := r.scans[key]; !ok {
		r.order = append(r.order, key)
		if len(r.order) > maxScans {
			delete(r.scans, r.order[0])
			r.order = r.order[1:]
		}
	}
	r.scans[key] = sc
	r.mu.Unlock()
	return sc, nil
}

// resolve returns the link of a sidechain of parent started by its tool
// call toolUseID. A parent or a call not in the log gives a link with an
// invalid span and the parent as root. Errors: the log's, wrapped.
func (r *resolver) resolve(ctx context.Context, tenant, parent, toolUseID string, depth int) (link, error) {
	if depth > maxLinkDepth {
		return link{root: parent}, nil
	}
	sc, err := r.scanSession(ctx, tenant, parent, toolUseID)
	if err != nil {
		return link{}, err
	}
	// The parent's own place: a sidechain of a sidechain nests in the
	// chain's root trace.
	var up link
	hasUp := false
	if sc.parentSession != "" && sc.parentSession != parent {
		if up, err = r.resolve(ctx, tenant, sc.parentSession, sc.parentTool, depth+1); err != nil {
			return link{}, err
		}
		hasUp = true
	}
	root := parent
	if hasUp {
		root = up.root
	}
	site, ok := sc.toolUses[toolUseID]
	if toolUseID == "" || !ok {
		return link{root: root}, nil
	}
	span := toolSpanID(tenant, parent, site.eventID, toolUseID)
	var tr spanRef
	switch startedID, started := sc.turnStarted[site.turn]; {
	case site.turn != "" && started && hasUp && up.tool.valid():
		tr = up.tool
	case site.turn != "" && started:
		tr.Trace = turnTraceID(tenant, parent, startedID)
	default:
		tr.Trace = ownTraceID(tenant, parent, site.eventID)
	}
	return link{tool: spanRef{Trace: tr.Trace, Span: span}, root: root}, nil
}

// The ids of each kind of span (see ids.go): the event (and block) the
// span starts at, in its session.

func turnTraceID(tenant, session, startedID string) trace.TraceID {
	return traceIDOf("turn", tenant, session, startedID)
}

func turnSpanID(tenant, session, startedID string) trace.SpanID {
	return spanIDOf("turn", tenant, session, startedID)
}

func toolSpanID(tenant, session, eventID, toolUseID string) trace.SpanID {
	return spanIDOf("tool", tenant, session, eventID, toolUseID)
}

func chatSpanID(tenant, session, eventID string) trace.SpanID {
	return spanIDOf("chat", tenant, session, eventID)
}

// ownTraceID is the trace of a span outside any turn: its own, from the
// event it starts at.
func ownTraceID(tenant, session, eventID string) trace.TraceID {
	return traceIDOf("own", tenant, session, eventID)
}
