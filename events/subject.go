package events

import (
	"fmt"
	"strconv"
	"strings"
)

// Subject names of wire contract version 1.
const (
	// EventsStream is the stream that holds every event.
	EventsStream = "AGENT_EVENTS"
	// SnapshotsStream holds the projections' snapshots, a bounded number
	// per session.
	SnapshotsStream = "AGENT_SNAPSHOTS"
	// EventSubjectPrefix starts every publish subject:
	// agent.evt.<tenant>.<session>.
	EventSubjectPrefix = "agent.evt"
	// SnapshotSubjectPrefix starts every snapshot subject:
	// agent.snap.<tenant>.<session>.
	SnapshotSubjectPrefix = "agent.snap"
	// MaxTokenLen is the longest tenant or session token, in bytes.
	MaxTokenLen = 128
	// BreakersSession is the session token, in each tenant, whose log holds
	// the tenant's circuit breaker changes (breaker.changed), so every
	// recovery worker sees the same breaker states and a replay shows when
	// a provider was cut off. Session tokens starting with "_" are
	// Turnstone's own.
	BreakersSession = "_breakers"
)

// ValidToken reports whether s can be a tenant or session subject token:
// 1 to MaxTokenLen characters of [A-Za-z0-9_-].
func ValidToken(s string) bool {
	if len(s) == 0 || len(s) > MaxTokenLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// EventSubject is the subject a publisher sends a session's events to:
// agent.evt.<tenant>.<session>: the engine that owns the session's
// partition answers it and stores the event under the partitioned form
// (StoredEventSubject). It does not check the tokens.
func EventSubject(tenant, session string) string {
	return EventSubjectPrefix + "." + tenant + "." + session
}

// StoredEventSubject is the subject a session's events are stored under:
// agent.evt.<partition>.<tenant>.<session> (Partition). Pass partition -1 for the
// wildcard form ("*") that readers filter on without knowing the partition
// count.
func StoredEventSubject(partition int, tenant, session string) string {
	p := "*"
	if partition >= 0 {
		p = fmt.Sprint(partition)
	}
	return EventSubjectPrefix + "." + p + "." + tenant + "." + session
}

// StoredPartitionFilter is the subject filter of the events stored in
// partition p: agent.evt.<p>.>.
func StoredPartitionFilter(p int) string {
	return fmt.Sprintf("%s.%d.>", EventSubjectPrefix, p)
}

// ParseStoredSubject splits a stored event subject,
// agent.evt.<partition>.<tenant>.<session> (StoredEventSubject), into its
// partition, tenant and session. When the subject is not of that form it
// returns ok false and, in why, what is wrong with it, for people: not five
// tokens (an event stored by an earlier version's stream, whose partition
// transform did not map a subject holding a literal "*"), a partition
// that is not a number, or a tenant or session token the contract forbids
// (ValidToken). tenant and session are then the tokens where a session's
// would be, as far as the subject has them. It does not know the stream's
// partition count (Log.SessionsChecked checks it).
func ParseStoredSubject(subject string) (partition int, tenant, session string, ok bool, why string) {
	rest, found := strings.CutPrefix(subject, EventSubjectPrefix+".")
	if !found {
		return 0, "", "", false, "not an event subject (" + EventSubjectPrefix + ".<partition>.<tenant>.<session>)"
	}
	parts := strings.Split(rest, ".")
	switch len(parts) {
	case 3:
	case 2: // the publish form, stored by an earlier version's stream
		return 0, parts[0], parts[1], false, fmt.Sprintf("%d tokens, want 5 (%s.<partition>.<tenant>.<session>): stored without its partition (by a stream of an earlier version, whose transform did not map a token the contract forbids, such as a literal \"*\")", len(parts)+2, EventSubjectPrefix)
	default:
		t, s := "", ""
		if len(parts) > 1 {
			t = parts[1]
		}
		if len(parts) > 2 {
			s = parts[2]
		}
		return 0, t, s, false, fmt.Sprintf("%d tokens, want 5 (%s.<partition>.<tenant>.<session>)", len(parts)+2, EventSubjectPrefix)
	}
	tenant, session = parts[1], parts[2]
	p, err := strconv.Atoi(parts[0])
	if err != nil || p < 0 {
		return 0, tenant, session, false, fmt.Sprintf("partition token %q is not a number", parts[0])
	}
	for _, tok := range [][2]string{{"tenant", tenant}, {"session", session}} {
		if !ValidToken(tok[1]) {
			return p, tenant, session, false, fmt.Sprintf("%s token %q is not 1-%d characters of [A-Za-z0-9_-]", tok[0], tok[1], MaxTokenLen)
		}
	}
	return p, tenant, session, true, ""
}

// SnapshotSubject is the subject of a session's snapshots:
// agent.snap.<tenant>.<session>.
func SnapshotSubject(tenant, session string) string {
	return SnapshotSubjectPrefix + "." + tenant + "." + session
}
