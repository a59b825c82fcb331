package web

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/internal/clock"
	"github.com/turnstone-dev/turnstone/internal/correlate"
	"github.com/turnstone-dev/turnstone/internal/forensics"
	"github.com/turnstone-dev/turnstone/projections"
)

// statuses are the session statuses the sessions page filters by, in the
// order it shows them.
var statuses = []string{string(projections.StatusBroken), string(projections.StatusPaused), string(projections.StatusInterrupted), string(projections.StatusInTurn), string(projections.StatusIdle)}

type sessionsPage struct {
	Form      url.Values
	Page      forensics.Page
	PageNum   int
	Pages     int
	Prev      string
	Next      string
	Statuses  []facet
	Took      time.Duration
	Filtering bool
	// Order is the page's order (forensics.Order).
	Order string
}

type facet struct {
	Name   string
	Count  int
	URL    string
	Active bool
}

// sessions is the fleet: the index, filtered and paged.
func (s *Server) sessions(_ http.ResponseWriter, r *http.Request) (string, any, error) {
	start := time.Now()
	q := r.URL.Query()
	if err := s.cfg.Index.Ready(r.Context()); err != nil {
		return "", nil, err
	}
	query := forensics.Query{
		Tenant: q.Get("tenant"), Status: q.Get("status"), Runtime: q.Get("runtime"), Model: q.Get("model"),
		Session: q.Get("session"), Anomalous: q.Get("anomalous") != "", Limit: s.cfg.PageSize,
		Order: forensics.Order(q.Get("order")),
	}
	if query.Status != "" && !contains(statuses, query.Status) {
		return "", nil, badRequest("status %q: want one of %s", query.Status, strings.Join(statuses, ", "))
	}
	if query.Order == "" {
		query.Order = forensics.OrderTriage
	}
	if !slices.Contains(forensics.Orders, query.Order) {
		return "", nil, badRequest("order %q: want triage or recent", query.Order)
	}
	var err error
	if query.Since, err = parseWhen(q.Get("since"), time.Now()); err != nil {
		return "", nil, badRequest("since: %v", err)
	}
	if query.Until, err = parseWhen(q.Get("until"), time.Now()); err != nil {
		return "", nil, badRequest("until: %v", err)
	}
	pageNum := 1
	if p := q.Get("page"); p != "" {
		if pageNum, err = strconv.Atoi(p); err != nil || pageNum < 1 {
			return "", nil, badRequest("page %q: want a number from 1", p)
		}
	}
	query.Offset = (pageNum - 1) * query.Limit
	page := s.cfg.Index.Query(query)
	v := sessionsPage{Form: q, Page: page, PageNum: pageNum, Pages: max(1, (page.Total+query.Limit-1)/query.Limit), Order: string(query.Order)}
	link := func(set map[string]string) string {
		u := url.Values{}
		for k, vs := range q {
			if len(vs) > 0 && vs[0] != "" && k != "page" {
				u.Set(k, vs[0])
			}
		}
		for k, val := range set {
			if val == "" {
				u.Del(k)
			} else {
				u.Set(k, val)
			}
		}
		if len(u) == 0 {
			return Prefix
		}
		return Prefix + "?" + u.Encode()
	}
	if pageNum > 1 {
		v.Prev = link(map[string]string{"page": strconv.Itoa(pageNum - 1)})
	}
	if pageNum < v.Pages {
		v.Next = link(map[string]string{"page": strconv.Itoa(pageNum + 1)})
	}
	for _, st := range statuses {
		v.Statuses = append(v.Statuses, facet{Name: st, Count: page.ByStatus[st], URL: link(map[string]string{"status": st}), Active: st == query.Status})
	}
	v.Filtering = len(q) > 0
	v.Took = time.Since(start)
	return "sessions", v, nil
}

type sessionPage struct {
	T *forensics.Timeline
	S *projections.Session
	// V is the state's View now (its Status says interrupted for a
	// history session that ends mid-turn; its pending tool_use ids).
	V       projections.View
	Base    string // the session page's path
	First   uint64
	Last    uint64
	Until   uint64 // the sequence the state is as of
	Latest  bool
	Next    uint64 // the next event after Until, 0 at the end
	Prev    uint64 // the event before Until, 0 at the start
	Summary projections.Summary
	Indexed bool
	Related []projections.Summary
	Bands   []bandView
	Orphans []projections.Orphan
	Took    time.Duration
	// C are the state's counts by state (Session.Counts); Errors counts
	// the runtime's errors and the tool calls that failed.
	C        projections.Counts
	Errors   int
	Position int // events folded
	Total    int // events in the session (from the index, when known)
}

// session is one session's timeline, as of until_seq.
func (s *Server) session(_ http.ResponseWriter, r *http.Request) (string, any, error) {
	start := time.Now()
	ctx := r.Context()
	tenant, session, err := sessionOf(r)
	if err != nil {
		return "", nil, err
	}
	first, err := s.cfg.Log.FirstSeq(ctx, tenant, session)
	if err != nil {
		return "", nil, err
	}
	last, err := s.cfg.Log.LastSeq(ctx, tenant, session)
	if err != nil {
		return "", nil, err
	}
	var until uint64
	if u := r.URL.Query().Get("until_seq"); u != "" {
		if until, err = strconv.ParseUint(u, 10, 64); err != nil {
			return "", nil, badRequest("until_seq %q: want a stream sequence", u)
		}
		if until >= last {
			until = 0
		}
	}
	t, err := forensics.BuildTimeline(ctx, s.cfg.Log, tenant, session, until, s.cfg.Timeline)
	if err != nil {
		return "", nil, err
	}
	v := sessionPage{T: t, S: t.State, V: t.State.View(), Base: sessionPath(tenant, session), First: first, Last: last, Until: t.State.LastSeq, Latest: until == 0,
		Position: t.State.Events}
	if v.Latest {
		v.Until = last
	}
	if n := len(t.Events); n > 1 {
		v.Prev = t.Events[n-2].Seq
	}
	if !v.Latest {
		// The next event: read one past the state.
		_ = s.cfg.Log.ReadSession(ctx, tenant, session, events.ReadOptions{FromSeq: t.State.LastSeq + 1}, func(ev events.Event) error {
			v.Next = ev.Seq
			return errStop
		})
	}
	v.Summary, v.Indexed = s.cfg.Index.Get(tenant, session)
	v.Total = v.Summary.Events
	v.Related = s.cfg.Index.Related(tenant, session)
	for _, f := range t.State.Forks {
		if !containsSession(v.Related, f.Session) {
			v.Related = append(v.Related, projections.Summary{Tenant: tenant, Session: f.Session, ForkedFrom: session})
		}
	}
	v.Bands = bands(t.Turns)
	v.C = t.State.Counts()
	v.Errors = t.State.Errors.Total + t.State.Totals.ToolErrors
	v.Orphans = t.State.Orphans
	v.Took = time.Since(start)
	return "session", v, nil
}

var errStop = errors.New("stop")

type eventPage struct {
	Tenant, Session string
	Base            string
	Ev              events.Event
	JSON            string
	Invalid         string
}

// event is one raw event, its body masked again and indented; with
// ?format=json the masked body itself.
func (s *Server) event(w http.ResponseWriter, r *http.Request) (string, any, error) {
	tenant, session, err := sessionOf(r)
	if err != nil {
		return "", nil, err
	}
	seq, err := strconv.ParseUint(r.PathValue("seq"), 10, 64)
	if err != nil || seq == 0 {
		return "", nil, badRequest("sequence %q: want a stream sequence", r.PathValue("seq"))
	}
	var ev *events.Event
	err = s.cfg.Log.ReadSession(r.Context(), tenant, session, events.ReadOptions{FromSeq: seq, UntilSeq: seq}, func(e events.Event) error {
		if e.Seq == seq {
			ev = &e
		}
		return nil
	})
	if err != nil {
		return "", nil, err
	}
	if ev == nil {
		return "", nil, notFound("session %s/%s has no event at sequence %d", tenant, session, seq)
	}
	// Stored bodies were masked when they were appended; mask again so a
	// body stored before a masking rule existed shows no secret either.
	body := events.MaskJSON(ev.Raw)
	if r.URL.Query().Get("format") == "json" {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(body)
		return "", nil, nil
	}
	var pretty bytes.Buffer
	if json.Indent(&pretty, body, "", "  ") != nil {
		pretty.Reset()
		pretty.Write(body)
	}
	v := eventPage{Tenant: tenant, Session: session, Base: sessionPath(tenant, session), Ev: *ev, JSON: pretty.String()}
	if ev.Err != nil {
		v.Invalid = ev.Err.Error()
	}
	return "event", v, nil
}

type diffPage struct {
	D        forensics.Diff
	Base     string
	From, To string
}

// diff is what changed in the session's state between ?from= and ?to=.
func (s *Server) diff(_ http.ResponseWriter, r *http.Request) (string, any, error) {
	tenant, session, err := sessionOf(r)
	if err != nil {
		return "", nil, err
	}
	q := r.URL.Query()
	parse := func(name string) (uint64, error) {
		v := q.Get(name)
		if v == "" {
			return 0, nil
		}
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, badRequest("%s %q: want a stream sequence", name, v)
		}
		return n, nil
	}
	from, err := parse("from")
	if err != nil {
		return "", nil, err
	}
	to, err := parse("to")
	if err != nil {
		return "", nil, err
	}
	d, err := forensics.DiffLog(r.Context(), s.cfg.Log, tenant, session, from, to)
	if errors.Is(err, forensics.ErrBadRange) {
		return "", nil, badRequest("%v", err)
	}
	if err != nil {
		return "", nil, err
	}
	return "diff", diffPage{D: d, Base: sessionPath(tenant, session), From: q.Get("from"), To: q.Get("to")}, nil
}

type incidentsPage struct {
	Form      url.Values
	Incidents []correlate.Incident
	Open      int
	Took      time.Duration
	Since     string
}

// incidents are the fleet's correlated incidents.
func (s *Server) incidents(_ http.ResponseWriter, r *http.Request) (string, any, error) {
	start := time.Now()
	incs, q, err := s.loadIncidents(r)
	if err != nil {
		return "", nil, err
	}
	// Most urgent first, then newest: the table is read top down.
	incs = slices.Clone(incs)
	slices.SortStableFunc(incs, func(a, b correlate.Incident) int {
		return cmp.Or(cmp.Compare(a.Severity.Rank(), b.Severity.Rank()), b.LastSeen.Compare(a.LastSeen))
	})
	v := incidentsPage{Form: q, Incidents: incs, Since: q.Get("since")}
	for _, in := range incs {
		if in.Open {
			v.Open++
		}
	}
	v.Took = time.Since(start)
	return "incidents", v, nil
}

type incidentPage struct {
	In       correlate.Incident
	Sessions []correlate.Affected
	PageNum  int
	Pages    int
	Prev     string
	Next     string
	Query    string
}

// incident is one incident with every affected session, paged.
func (s *Server) incident(_ http.ResponseWriter, r *http.Request) (string, any, error) {
	incs, q, err := s.loadIncidents(r)
	if err != nil {
		return "", nil, err
	}
	id := r.PathValue("id")
	for _, in := range incs {
		if in.ID != id {
			continue
		}
		per := 100
		pageNum, _ := strconv.Atoi(q.Get("page"))
		pageNum = max(pageNum, 1)
		v := incidentPage{In: in, PageNum: pageNum, Pages: max(1, (len(in.Sessions)+per-1)/per)}
		lo := min((pageNum-1)*per, len(in.Sessions))
		v.Sessions = in.Sessions[lo:min(lo+per, len(in.Sessions))]
		keep := url.Values{}
		for _, k := range []string{"since", "tenant"} {
			if q.Get(k) != "" {
				keep.Set(k, q.Get(k))
			}
		}
		v.Query = keep.Encode()
		pageURL := func(n int) string {
			u := url.Values{}
			for k := range keep {
				u.Set(k, keep.Get(k))
			}
			u.Set("page", strconv.Itoa(n))
			return Prefix + "incidents/" + url.PathEscape(id) + "?" + u.Encode()
		}
		if pageNum > 1 {
			v.Prev = pageURL(pageNum - 1)
		}
		if pageNum < v.Pages {
			v.Next = pageURL(pageNum + 1)
		}
		return "incident", v, nil
	}
	return "", nil, notFound("no incident %q (in the period asked for)", id)
}

func (s *Server) loadIncidents(r *http.Request) ([]correlate.Incident, url.Values, error) {
	q := r.URL.Query()
	since, err := parseWhen(q.Get("since"), time.Now())
	if err != nil {
		return nil, q, badRequest("since: %v", err)
	}
	incs, err := s.cfg.Index.Incidents(r.Context(), forensics.IncidentsConfig{Since: since, Tenant: q.Get("tenant"), Correlate: s.cfg.Correlate})
	return incs, q, err
}

// sessionOf reads and checks the tenant and session of a path.
func sessionOf(r *http.Request) (string, string, error) {
	tenant, session := r.PathValue("tenant"), r.PathValue("session")
	if !events.ValidToken(tenant) || !events.ValidToken(session) {
		return "", "", badRequest("%q/%q is not a tenant and a session", tenant, session)
	}
	return tenant, session, nil
}

func sessionPath(tenant, session string) string {
	return Prefix + "session/" + url.PathEscape(tenant) + "/" + url.PathEscape(session)
}

// parseWhen reads a time filter: empty (none), a duration before now
// ("24h", "90m", "7d": clock.ParseDuration), RFC 3339, a datetime-local value ("2026-11-22T16:07")
// or a date (UTC).
func parseWhen(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := clock.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02 15:04", time.DateOnly} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%q: want a duration (24h, 7d), RFC 3339, YYYY-MM-DDTHH:MM or a date", s)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func containsSession(xs []projections.Summary, session string) bool {
	for _, x := range xs {
		if x.Session == session {
			return true
		}
	}
	return false
}
