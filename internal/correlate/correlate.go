// Package correlate groups the errors and anomalies of many sessions, of
// many tenants, into fleet incidents: when a provider goes down at 16:07
// and forty sessions break, that is one incident with forty sessions, not
// forty rows.
//
// The input is Signals (one error or one anomaly of one session, at one
// event) and Outcomes (the recovery commands of those sessions and how
// they ended); FromSession derives both from a session's projected state.
// Correlate is the rule: signals with the same correlation key (KeyOf)
// form one incident; within it, a window is a run of signals no further
// apart than Config.Gap, and an incident seen in two or more windows is
// recurring. Each incident states its root-cause hypothesis as evidence:
// counts, the key, the time span and the recovery outcomes of its
// sessions, never a guess beyond them.
//
// The package is pure: no I/O, no clock but Config.Now. Package forensics
// reads the fleet index and the sessions' states and calls it; `engine
// incidents`, the web view and /metrics show what it returns.
package correlate

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/projections"
)

// Kind says whether a Signal is an error a runtime recorded or an anomaly
// the fold flagged.
type Kind string

// The signal kinds.
const (
	// KindError: an error the runtime recorded (error.recorded, or the
	// error of a turn.failed). Its Class is a recovery.Class.
	KindError Kind = "error"
	// KindAnomaly: something the fold flagged: a violation (its Class is
	// the rule, such as "tool_use_without_result"), an abandoned turn
	// (ClassTurnAbandoned), a flaky-suspected tool run (ClassFlakyTool)
	// or a loop (ClassLoop).
	KindAnomaly Kind = "anomaly"
)

// Classes of anomalies that are not violation rules.
const (
	// ClassTurnAbandoned: a turn had no outcome by its deadline.
	ClassTurnAbandoned = "turn_abandoned"
	// ClassFlakyTool: a tool call failed and its immediate identical
	// re-run passed.
	ClassFlakyTool = "flaky_tool"
	// ClassLoop: the same assistant output, or the same error, several
	// times in a row (projections.DefaultLoopLimit).
	ClassLoop = "loop"
	// ClassRecoveryFailed and ClassRecoveryParked: a recovery command
	// ended with outcome failed, or was parked. The signal's Code is the
	// command's kind.
	ClassRecoveryFailed = "recovery_failed"
	ClassRecoveryParked = "recovery_parked"
	// ClassLogic: an error of kind logic that names no provider, error
	// code or HTTP status: the runtime's own code threw (a stage of the
	// turn failed), not the provider. recovery.Classify files it under
	// invalid_request for the strategy chains; an incident keys it by
	// runtime and stage instead, never by provider (KeyFields).
	ClassLogic = "logic"
)

// Signal is one error or one anomaly of one session, at the event where
// it arose.
type Signal struct {
	// Tenant and Session name the session.
	Tenant  string `json:"tenant"`
	Session string `json:"session"`
	// Seq is the stream sequence of the event that carried it (0 when
	// unknown); Time that event's time (the publisher's).
	Seq  uint64    `json:"seq,omitempty"`
	Time time.Time `json:"time"`
	// Kind is error or anomaly.
	Kind Kind `json:"kind"`
	// Class is, for an error, its recovery.Class ("overloaded"); for an
	// anomaly, its rule or ClassTurnAbandoned or ClassFlakyTool.
	Class string `json:"class"`
	// Code is the provider's error type ("overloaded_error") and Status
	// the HTTP status (529), when the error had them.
	Code   string `json:"code,omitempty"`
	Status int    `json:"status,omitempty"`
	// Provider, Model and Runtime are the session's (an error's own
	// provider wins); Tool the tool concerned, when one is.
	Provider string `json:"provider,omitempty"`
	Model    string `json:"model,omitempty"`
	Runtime  string `json:"runtime,omitempty"`
	Tool     string `json:"tool,omitempty"`
	// Turn and Stage are the turn and stage it arose in, when known.
	Turn  string `json:"turn,omitempty"`
	Stage string `json:"stage,omitempty"`
	// Detail is the error message or the violation's detail (a preview).
	Detail string `json:"detail,omitempty"`
	// Cause is, for ClassTurnAbandoned, why the turn was abandoned
	// (events.AbandonDeadline, AbandonEngineRestart, AbandonManual; empty
	// when the event did not say).
	Cause string `json:"cause,omitempty"`
	// Orphans counts the tool_use blocks this signal left without a
	// result: the orphans an abandoned turn declared are its consequence,
	// one cause with it, not an incident of their own (FromSession).
	Orphans int `json:"orphans,omitzero"`
}

// The recovery outcomes an Outcome can have: events.OutcomeRecovered,
// OutcomeDegraded and OutcomeFailed, and these.
const (
	// OutcomeParked: the command was parked after its last delivery failed.
	OutcomeParked = "parked"
	// OutcomeRunning: the command has neither an outcome nor a park yet.
	OutcomeRunning = "running"
	// OutcomeNone: no recovery command ran on the session after the
	// incident's first signal in it (Affected.Outcome only).
	OutcomeNone = "none"
)

// Outcome is one recovery command of a session and how it ended.
type Outcome struct {
	Tenant  string `json:"tenant"`
	Session string `json:"session"`
	// CommandID and Kind are the command's; Strategy the strategy that
	// ended it (or the latest tried).
	CommandID string `json:"command_id"`
	Kind      string `json:"kind"`
	Strategy  string `json:"strategy,omitempty"`
	// Outcome is recovered, degraded, failed, parked or running.
	Outcome string `json:"outcome"`
	// Seq is the sequence of the command's first recovery.* event in the
	// session's log: a command counts for a signal that arose before it.
	Seq      uint64 `json:"seq"`
	Attempts int    `json:"attempts,omitempty"`
}

// Done reports whether the command ended (any outcome but running).
func (o Outcome) Done() bool { return o.Outcome != OutcomeRunning && o.Outcome != "" }

// By is what the outcome is credited to: the strategy that ended the
// command, or its kind when it named none.
func (o Outcome) By() string { return cmp.Or(o.Strategy, o.Kind) }

// Config sets the windows of Correlate and what counts as open. The zero
// value uses the defaults.
type Config struct {
	// Gap ends a window: two signals of one key further apart than Gap
	// are in two windows. Default DefaultGap.
	Gap time.Duration
	// OpenFor: an incident is open while its latest signal is younger
	// than OpenFor at Now and some affected session has not recovered
	// (recovered or degraded) since. Default DefaultOpenFor.
	OpenFor time.Duration
	// Now is the time Open is judged at (zero: time.Now()).
	Now time.Time
}

// The defaults of Config.
const (
	DefaultGap     = 10 * time.Minute
	DefaultOpenFor = 30 * time.Minute
)

func (c *Config) setDefaults() {
	if c.Gap <= 0 {
		c.Gap = DefaultGap
	}
	if c.OpenFor <= 0 {
		c.OpenFor = DefaultOpenFor
	}
	if c.Now.IsZero() {
		c.Now = time.Now()
	}
}

// Incident is the signals of one correlation key across the fleet.
type Incident struct {
	// ID is stable for a key: "inc-" and 12 hex digits of the SHA-256 of
	// Key.String().
	ID  string `json:"id"`
	Key Key    `json:"key"`
	// Title names the key for people: "provider anthropic: overloaded_error (529)".
	Title string `json:"title"`
	// FirstSeen and LastSeen are the times of its first and last signal.
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
	// Windows are its runs of signals (see Config.Gap), in time order;
	// Recurring is set when there are two or more.
	Windows   []Window `json:"windows"`
	Recurring bool     `json:"recurring"`
	// Open: see Config.OpenFor.
	Open bool `json:"open"`
	// Signals counts its signals; Sessions lists the affected sessions
	// (by their first signal), Tenants the affected tenants, sorted.
	Signals  int        `json:"signals"`
	Sessions []Affected `json:"sessions"`
	Tenants  []string   `json:"tenants"`
	// Outcomes counts the affected sessions by recovery outcome (see
	// Affected.Outcome), most sessions first.
	Outcomes []OutcomeCount `json:"outcomes"`
	// Breakdown counts its sessions by the fields the key does not fix.
	Breakdown Breakdown `json:"breakdown"`
	// Hypothesis is the evidence, in one sentence: "30 sessions on
	// provider anthropic failed with overloaded_error (529) between
	// 16:07 and 16:08 UTC; 28 recovered by switch_provider, 2 with no
	// recovery".
	Hypothesis string `json:"hypothesis"`
	// Code is the error code as most of its sessions gave it
	// ("overloaded_error (529)"; empty for anomalies and codeless errors).
	Code string `json:"code,omitempty"`
	// Example is the detail of its first signal.
	Example string `json:"example,omitempty"`
	// Severity ranks it for triage (see Severity).
	Severity Severity `json:"severity"`
	// Label says what happened in a few words, for a table:
	// "turn abandoned by hand", "logic error in stage history",
	// "authentication_error (401)".
	Label string `json:"label"`
	// Recovered counts the affected sessions whose recovery ended
	// recovered or degraded.
	Recovered int `json:"recovered"`
	// Causes counts the affected sessions of a turn_abandoned incident by
	// the cause of their first abandon (Signal.Cause; "unknown" when the
	// event named none), most first.
	Causes []Count `json:"causes,omitempty"`
	// Orphans counts the tool_use blocks its signals left without a
	// result (Signal.Orphans).
	Orphans int `json:"orphans,omitzero"`
}

// Severity ranks an incident for triage.
type Severity string

// The severities, from the most urgent.
const (
	// SeverityHigh: it is open (recent, and a session has not recovered),
	// a recovery gave up on a session (failed or parked), or the class
	// needs a person (authentication).
	SeverityHigh Severity = "high"
	// SeverityMedium: a session has not recovered, but the incident is
	// no longer open (older than Config.OpenFor), or its recovery still
	// runs.
	SeverityMedium Severity = "medium"
	// SeverityLow: every affected session recovered (or degraded), or the
	// class recovers by itself (flaky_tool: the re-run passed).
	SeverityLow Severity = "low"
)

// Rank is the severity's order, 0 for the most urgent.
func (s Severity) Rank() int {
	switch s {
	case SeverityHigh:
		return 0
	case SeverityMedium:
		return 1
	}
	return 2
}

// Window is one run of an incident's signals.
type Window struct {
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Signals  int       `json:"signals"`
	Sessions int       `json:"sessions"`
}

// Affected is one session an incident touched.
type Affected struct {
	Tenant  string `json:"tenant"`
	Session string `json:"session"`
	// Seq and Time are those of its first signal of the incident.
	Seq  uint64    `json:"seq,omitempty"`
	Time time.Time `json:"time"`
	// Signals counts its signals of the incident.
	Signals int `json:"signals"`
	// Outcome is the outcome of the latest recovery command that started
	// after its first signal and ended (recovered, degraded, failed,
	// parked); else running when one has not ended; else none. By is the
	// strategy (or kind) that outcome is credited to.
	Outcome string `json:"outcome"`
	By      string `json:"by,omitempty"`
}

// OutcomeCount counts the affected sessions with one outcome by one
// strategy.
type OutcomeCount struct {
	Outcome  string `json:"outcome"`
	By       string `json:"by,omitempty"`
	Sessions int    `json:"sessions"`
}

// Count is one value of a breakdown and how many sessions had it.
type Count struct {
	Value    string `json:"value"`
	Sessions int    `json:"sessions"`
}

// Breakdown counts an incident's sessions by provider, model, runtime,
// tool and error code (values that are empty are left out).
type Breakdown struct {
	Providers []Count `json:"providers,omitempty"`
	Models    []Count `json:"models,omitempty"`
	Runtimes  []Count `json:"runtimes,omitempty"`
	Tools     []Count `json:"tools,omitempty"`
	Codes     []Count `json:"codes,omitempty"`
}

// Correlate groups signals into incidents by KeyOf, splits each into
// windows (Config.Gap), credits each affected session with its recovery
// outcome from outcomes, and states the hypothesis. Signals with a zero
// Time are ignored (they cannot be placed in a window). Incidents come
// newest first (LastSeen descending), then by sessions, then by ID.
func Correlate(signals []Signal, outcomes []Outcome, cfg Config) []Incident {
	cfg.setDefaults()
	groups := map[Key][]Signal{}
	for _, s := range signals {
		if s.Time.IsZero() {
			continue
		}
		k := KeyOf(s)
		groups[k] = append(groups[k], s)
	}
	bySession := map[sessionRef][]Outcome{}
	for _, o := range outcomes {
		r := sessionRef{o.Tenant, o.Session}
		bySession[r] = append(bySession[r], o)
	}
	out := make([]Incident, 0, len(groups))
	for k, sigs := range groups {
		out = append(out, build(k, sigs, bySession, cfg))
	}
	slices.SortFunc(out, func(a, b Incident) int {
		return cmp.Or(b.LastSeen.Compare(a.LastSeen), cmp.Compare(len(b.Sessions), len(a.Sessions)), cmp.Compare(a.ID, b.ID))
	})
	return out
}

type sessionRef struct{ tenant, session string }

func build(k Key, sigs []Signal, outcomes map[sessionRef][]Outcome, cfg Config) Incident {
	slices.SortFunc(sigs, func(a, b Signal) int {
		return cmp.Or(a.Time.Compare(b.Time), cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Session, b.Session), cmp.Compare(a.Seq, b.Seq))
	})
	sum := sha256.Sum256([]byte(k.String()))
	in := Incident{
		ID: "inc-" + hex.EncodeToString(sum[:6]), Key: k, Title: k.Title(),
		FirstSeen: sigs[0].Time.UTC(), LastSeen: sigs[len(sigs)-1].Time.UTC(),
		Signals: len(sigs), Example: sigs[0].Detail,
	}
	// Windows.
	var win *Window
	winSessions := map[sessionRef]bool{}
	for i, s := range sigs {
		if i == 0 || s.Time.Sub(sigs[i-1].Time) > cfg.Gap {
			in.Windows = append(in.Windows, Window{Start: s.Time.UTC()})
			win = &in.Windows[len(in.Windows)-1]
			clear(winSessions)
		}
		win.End = s.Time.UTC()
		win.Signals++
		if r := (sessionRef{s.Tenant, s.Session}); !winSessions[r] {
			winSessions[r] = true
			win.Sessions++
		}
	}
	in.Recurring = len(in.Windows) >= 2
	// Affected sessions, by their first signal.
	idx := map[sessionRef]int{}
	tenants := map[string]bool{}
	bd := newBreakdown()
	causes := map[string]int{}
	for _, s := range sigs {
		r := sessionRef{s.Tenant, s.Session}
		i, ok := idx[r]
		if !ok {
			i = len(in.Sessions)
			idx[r] = i
			in.Sessions = append(in.Sessions, Affected{Tenant: s.Tenant, Session: s.Session, Seq: s.Seq, Time: s.Time.UTC()})
			tenants[s.Tenant] = true
			bd.add(r, s)
			if k.Class == ClassTurnAbandoned {
				causes[cmp.Or(s.Cause, "unknown")]++
			}
		}
		in.Sessions[i].Signals++
		in.Orphans += s.Orphans
	}
	for c, n := range causes {
		in.Causes = append(in.Causes, Count{Value: c, Sessions: n})
	}
	slices.SortFunc(in.Causes, func(a, b Count) int {
		return cmp.Or(cmp.Compare(b.Sessions, a.Sessions), cmp.Compare(a.Value, b.Value))
	})
	for t := range tenants {
		in.Tenants = append(in.Tenants, t)
	}
	slices.Sort(in.Tenants)
	in.Breakdown = bd.result(k)
	if codes := bd.result(Key{}).Codes; len(codes) > 0 {
		in.Code = codes[0].Value
	}
	// Outcomes.
	counts := map[OutcomeCount]int{}
	recovered := 0
	for i := range in.Sessions {
		a := &in.Sessions[i]
		a.Outcome, a.By = outcomeAfter(outcomes[sessionRef{a.Tenant, a.Session}], a.Seq)
		counts[OutcomeCount{Outcome: a.Outcome, By: a.By}]++
		if a.Outcome == "recovered" || a.Outcome == "degraded" {
			recovered++
		}
	}
	for oc, n := range counts {
		oc.Sessions = n
		in.Outcomes = append(in.Outcomes, oc)
	}
	slices.SortFunc(in.Outcomes, func(a, b OutcomeCount) int {
		return cmp.Or(cmp.Compare(b.Sessions, a.Sessions), cmp.Compare(outcomeRank(a.Outcome), outcomeRank(b.Outcome)), cmp.Compare(a.By, b.By))
	})
	in.Recovered = recovered
	in.Open = cfg.Now.Sub(in.LastSeen) < cfg.OpenFor && recovered < len(in.Sessions)
	in.Severity = severity(&in)
	in.Label = label(&in)
	in.Hypothesis = hypothesis(&in)
	return in
}

// severity ranks an incident (see Severity).
func severity(in *Incident) Severity {
	if in.Key.Class == ClassFlakyTool || in.Recovered == len(in.Sessions) {
		return SeverityLow
	}
	if in.Open || in.Key.Class == "authentication" {
		return SeverityHigh
	}
	for _, oc := range in.Outcomes {
		if oc.Outcome == "failed" || oc.Outcome == OutcomeParked {
			return SeverityHigh
		}
	}
	return SeverityMedium
}

// causeWords says how a turn (or, plural, several) was abandoned, for
// people (projections.AbandonedHow).
func causeWords(cause string, plural bool) string {
	if plural && cause == events.AbandonDeadline {
		return "by their deadline"
	}
	return projections.AbandonedHow(cause)
}

// label says what happened in a few words (Incident.Label).
func label(in *Incident) string {
	k := in.Key
	switch {
	case k.Kind == KindError && k.Class == ClassLogic:
		if k.Stage != "" {
			return "logic error in stage " + k.Stage
		}
		return "logic error"
	case k.Kind == KindError:
		if in.Code != "" {
			return k.Class + ": " + in.Code
		}
		return k.Class + " error"
	case k.Class == ClassTurnAbandoned:
		l := "turn abandoned"
		if len(in.Causes) == 1 {
			if w := causeWords(in.Causes[0].Value, false); w != "" {
				l += " " + w
			}
		}
		if in.Orphans > 0 {
			l += ", " + plural(in.Orphans, "orphaned tool_use")
		}
		return l
	case k.Class == ClassFlakyTool:
		return "flaky tool " + k.Tool
	case k.Class == ClassLoop:
		return "loop"
	case k.Class == ClassRecoveryFailed:
		return "recovery " + k.Code + " failed"
	case k.Class == ClassRecoveryParked:
		return "recovery " + k.Code + " parked"
	}
	return strings.ReplaceAll(k.Class, "_", " ")
}

// outcomeAfter picks a session's outcome for a signal at seq: the latest
// command (by first sequence) that started after seq and ended; else
// running when one started after it and has not ended; else none. A
// signal of unknown sequence (0) counts every command.
func outcomeAfter(os []Outcome, seq uint64) (outcome, by string) {
	var done, running *Outcome
	for i := range os {
		o := &os[i]
		if seq != 0 && o.Seq <= seq {
			continue
		}
		if o.Done() {
			if done == nil || o.Seq > done.Seq {
				done = o
			}
		} else if running == nil || o.Seq > running.Seq {
			running = o
		}
	}
	switch {
	case done != nil:
		return done.Outcome, done.By()
	case running != nil:
		return OutcomeRunning, running.By()
	}
	return OutcomeNone, ""
}

func outcomeRank(o string) int {
	switch o {
	case "recovered":
		return 0
	case "degraded":
		return 1
	case "failed":
		return 2
	case OutcomeParked:
		return 3
	case OutcomeRunning:
		return 4
	}
	return 5
}

// breakdown counts sessions by the fields of their first signal.
type breakdown struct{ providers, models, runtimes, tools, codes map[string]int }

func newBreakdown() *breakdown {
	return &breakdown{map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}}
}

func (b *breakdown) add(_ sessionRef, s Signal) {
	inc := func(m map[string]int, v string) {
		if v != "" {
			m[v]++
		}
	}
	inc(b.providers, s.Provider)
	inc(b.models, s.Model)
	inc(b.runtimes, s.Runtime)
	inc(b.tools, s.Tool)
	inc(b.codes, codeText(s.Code, s.Status))
}

func (b *breakdown) result(k Key) Breakdown {
	list := func(m map[string]int, fixed string) []Count {
		if fixed != "" {
			return nil // the key names it: every session has it
		}
		out := make([]Count, 0, len(m))
		for v, n := range m {
			out = append(out, Count{Value: v, Sessions: n})
		}
		slices.SortFunc(out, func(a, b Count) int {
			return cmp.Or(cmp.Compare(b.Sessions, a.Sessions), cmp.Compare(a.Value, b.Value))
		})
		return out
	}
	return Breakdown{
		Providers: list(b.providers, k.Provider), Models: list(b.models, k.Model), Runtimes: list(b.runtimes, k.Runtime),
		Tools: list(b.tools, k.Tool), Codes: list(b.codes, k.Code),
	}
}

// codeText is how an error's code and status read: "overloaded_error
// (529)", "overloaded_error", "HTTP 529", or "".
func codeText(code string, status int) string {
	switch {
	case code != "" && status != 0:
		return code + " (" + strconv.Itoa(status) + ")"
	case code != "":
		return code
	case status != 0:
		return "HTTP " + strconv.Itoa(status)
	}
	return ""
}

// hypothesis states the incident's evidence in one sentence.
func hypothesis(in *Incident) string {
	k := in.Key
	n := len(in.Sessions)
	var b strings.Builder
	b.WriteString(plural(n, "session"))
	switch {
	case k.Kind == KindError && k.Provider != "" && k.Model != "":
		fmt.Fprintf(&b, " on provider %s, model %s,", k.Provider, k.Model)
	case k.Provider != "":
		fmt.Fprintf(&b, " on provider %s", k.Provider)
	case k.Tool != "":
		fmt.Fprintf(&b, " running tool %s", k.Tool)
	case k.Runtime != "":
		fmt.Fprintf(&b, " of runtime %s", k.Runtime)
	}
	if len(in.Tenants) > 1 {
		fmt.Fprintf(&b, " (%s)", plural(len(in.Tenants), "tenant"))
	}
	b.WriteByte(' ')
	b.WriteString(what(k, in))
	b.WriteByte(' ')
	b.WriteString(span(in))
	b.WriteString("; ")
	parts := make([]string, 0, len(in.Outcomes))
	for _, oc := range in.Outcomes {
		parts = append(parts, outcomeText(oc))
	}
	b.WriteString(strings.Join(parts, ", "))
	return b.String()
}

// what says what the key's signals were.
func what(k Key, in *Incident) string {
	if k.Kind == KindError {
		if k.Class == ClassLogic {
			s := "failed"
			if k.Stage != "" {
				s += " in stage " + k.Stage
			}
			return s + " with a logic error of its own (not a provider's)"
		}
		code := in.Code
		if code == "" {
			return "failed with " + article(k.Class) + " " + k.Class + " error"
		}
		return "failed with " + code
	}
	switch k.Class {
	case ClassTurnAbandoned:
		s := "had a turn abandoned"
		switch {
		case len(in.Causes) == 1 && causeWords(in.Causes[0].Value, false) != "":
			s += " " + causeWords(in.Causes[0].Value, false)
		case len(in.Causes) > 1:
			var parts []string
			for _, c := range in.Causes {
				w := causeWords(c.Value, c.Sessions > 1)
				if w == "" {
					w = "for a reason not recorded"
				}
				parts = append(parts, strconv.Itoa(c.Sessions)+" "+w)
			}
			s += " (" + strings.Join(parts, ", ") + ")"
		}
		if in.Orphans > 0 {
			s += ", leaving " + plural(in.Orphans, "orphaned tool_use")
		}
		return s
	case ClassFlakyTool:
		return "had a tool call fail and its identical re-run pass (flaky_tool)"
	case ClassLoop:
		return "looped (the same output or error again and again)"
	case ClassRecoveryFailed:
		return "had recovery " + k.Code + " fail"
	case ClassRecoveryParked:
		return "had recovery " + k.Code + " parked"
	}
	return "broke " + k.Class
}

func article(w string) string {
	if w != "" && strings.ContainsRune("aeiou", rune(w[0])) {
		return "an"
	}
	return "a"
}

// span is "between 2026-11-22 16:07 and 16:11 UTC" ("at 2026-11-22
// 16:07 UTC" within one minute), or the windows of a recurring incident.
func span(in *Incident) string {
	if !in.Recurring {
		return between(in.FirstSeen, in.LastSeen)
	}
	ws := make([]string, 0, len(in.Windows))
	for i, w := range in.Windows {
		if i == 4 && len(in.Windows) > 5 {
			ws = append(ws, fmt.Sprintf("%d more", len(in.Windows)-4))
			break
		}
		ws = append(ws, fmt.Sprintf("%s (%s)", between(w.Start, w.End), plural(w.Sessions, "session")))
	}
	return fmt.Sprintf("in %d windows: %s", len(in.Windows), strings.Join(ws, "; "))
}

func between(a, b time.Time) string {
	a, b = a.UTC(), b.UTC()
	if a.Truncate(time.Minute).Equal(b.Truncate(time.Minute)) {
		return "at " + a.Format("2006-01-02 15:04") + " UTC"
	}
	if a.Format(time.DateOnly) == b.Format(time.DateOnly) {
		return "between " + a.Format("2006-01-02 15:04") + " and " + b.Format("15:04") + " UTC"
	}
	return "between " + a.Format("2006-01-02 15:04") + " and " + b.Format("2006-01-02 15:04") + " UTC"
}

func outcomeText(oc OutcomeCount) string {
	n := strconv.Itoa(oc.Sessions)
	switch oc.Outcome {
	case "recovered", "degraded":
		return n + " " + oc.Outcome + " by " + oc.By
	case "failed":
		return n + " failed to recover (" + oc.By + ")"
	case OutcomeParked:
		return n + " parked (" + oc.By + ")"
	case OutcomeRunning:
		return n + " still recovering (" + oc.By + ")"
	}
	return n + " with no recovery"
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
