package refruntime

import (
	"context"
	"fmt"
	"strings"

	"github.com/cenkalti/backoff/v4"
	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// distill compacts the session's history when it is clean (see Open), or
// records why it did not.
func (r *Runtime) distill(ctx context.Context, s *session, req recovery.ControlRequest) recovery.ControlReply {
	reason := req.Reason
	if reason == "" {
		reason = "control request " + req.CommandID
	}
	var skip, detail string
	err := retryConflicts(ctx, r.cfg.ConflictRetries, func() error {
		var evs []events.Event
		err := r.log.ReadSession(ctx, r.cfg.Tenant, s.id, events.ReadOptions{}, func(ev events.Event) error {
			evs = append(evs, ev)
			return nil
		})
		if err != nil {
			return backoff.Permanent(err)
		}
		state := projections.Fold(evs)
		var plan []events.Event
		plan, skip, detail, err = r.planDistill(s.id, state, evs, reason)
		if err != nil {
			return backoff.Permanent(err)
		}
		_, err = r.log.Append(ctx, plan, events.ExpectLastSeq(state.LastSeq))
		return err
	}, nil)
	if err != nil {
		return failed("distill: "+err.Error(), logError(err))
	}
	if skip != "" {
		return failed("distillation skipped: "+skip, events.ErrorInfo{
			Message: "refruntime: distillation skipped: " + skip + ": " + detail,
			Kind:    events.KindLogic,
			Code:    skip,
		})
	}
	return r.ok(s, detail)
}

// planDistill returns the events a distillation of state appends: when
// the history is dirty, distillation.requested and distillation.skipped
// with the reason (skip) and its detail; else requested, started,
// completed and the summary as a meta user message, with a detail for the
// reply.
func (r *Runtime) planDistill(session string, state *projections.Session, evs []events.Event, reason string) (plan []events.Event, skip, detail string, err error) {
	add := func(p events.Payload) {
		if err != nil {
			return
		}
		var ev events.Event
		if ev, err = r.event(session, "", p); err == nil {
			plan = append(plan, ev)
		}
	}
	add(&events.DistillationRequested{Reason: reason})
	if skip, detail = dirtyHistory(state); skip != "" {
		add(&events.DistillationSkipped{Reason: skip, Detail: detail})
		return plan, skip, detail, err
	}
	from := state.FirstSeq
	if state.HistoryStart.Seq != 0 {
		from = state.HistoryStart.Seq + 1
	}
	to := state.LastSeq
	var size, records int
	for _, ev := range evs {
		if ev.Seq >= from && ev.Type == events.TypeMessageAppended {
			size += len(ev.Data)
			records++
		}
	}
	summary := fmt.Sprintf("Summary of the conversation so far (%d message records, events %d-%d): the user asked for tasks; the assistant ran the tools it needed and answered each.", records, from, to)
	add(&events.DistillationStarted{FromSeq: from, ToSeq: to})
	add(&events.DistillationCompleted{
		FromSeq: from, ToSeq: to,
		TokensBefore: int64(size / 4), TokensAfter: int64(len(summary) / 4),
		Trigger: "auto", Summary: summary,
	})
	add(&events.MessageAppended{Role: events.RoleUser, Meta: true, Content: []events.ContentBlock{textBlock(summary)}})
	return plan, "", fmt.Sprintf("distilled events %d-%d (%d message records)", from, to, records), err
}

// dirtyHistory returns why a distillation must not run over state (the
// first of projections' DirtyReasons) and all the reasons, or "".
func dirtyHistory(state *projections.Session) (reason, detail string) {
	reasons := state.DirtyReasons("")
	if len(reasons) == 0 {
		return "", ""
	}
	return reasons[0], strings.Join(reasons, ", ")
}
