package events

import "fmt"

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
// agent.evt.<tenant>.<session>. The stream stores them under the
// partitioned form (StoredEventSubject). It does not check the tokens.
func EventSubject(tenant, session string) string {
	return EventSubjectPrefix + "." + tenant + "." + session
}

// StoredEventSubject is the subject a session's events are stored under
// after the stream's partition transform:
// agent.evt.<partition>.<tenant>.<session>. Pass partition -1 for the
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

// SnapshotSubject is the subject of a session's snapshots:
// agent.snap.<tenant>.<session>.
func SnapshotSubject(tenant, session string) string {
	return SnapshotSubjectPrefix + "." + tenant + "." + session
}
