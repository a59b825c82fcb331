package auth

import (
	"strings"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/pgroup"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// covers reports whether the NATS subject pattern covers subject (which
// may hold wildcards, as a subscription does): "*" matches one token of
// subject (its own "*" included), ">" the rest.
func covers(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || s[i] == ">" {
			return false
		}
		if tok != "*" && (tok != s[i] || s[i] == "*") {
			return false
		}
	}
	return len(p) == len(s)
}

func TestCovers(t *testing.T) {
	for _, c := range []struct {
		pattern, subject string
		want             bool
	}{
		{"agent.rejected.*", "agent.rejected.acme.s1", false},
		{"agent.rejected.*.*", "agent.rejected.acme.s1", true},
		{"agent.in.*.*.*", "agent.in.3.*.*", true},
		{"agent.in.3.*.*", "agent.in.*.*.*", false},
		{"$KV.b.>", "$KV.b.1.acme.s1", true},
		{"$KV.b.>", "$KV.b", false},
	} {
		if got := covers(c.pattern, c.subject); got != c.want {
			t.Errorf("covers(%q, %q) = %v", c.pattern, c.subject, got)
		}
	}
}

// allowed reports whether the permissions allow subject: an allow row
// covers it and no deny row does.
func allowed(allow, deny []string, subject string) bool {
	for _, d := range deny {
		if covers(d, subject) {
			return false
		}
	}
	for _, a := range allow {
		if covers(a, subject) {
			return true
		}
	}
	return false
}

// TestEngineMayPublishEverySubjectItWrites derives every subject an
// engine publishes and subscribes to from the functions that build them
// (not from copies of their strings), for sessions whose tokens are
// valid and for those that are not (a refused event's quarantine record
// names "_invalid"), and checks the permission table allows each: a
// grant that is one token short (agent.rejected.* for the quarantine's
// agent.rejected.<tenant>.<session>) fails here, not in production.
func TestEngineMayPublishEverySubjectItWrites(t *testing.T) {
	const partitions = 8
	perm := RolePermissions(RoleEngine, "", partitions, false)
	type use struct{ what, subject string }
	var pubs, subs []use
	pub := func(what, s string) { pubs = append(pubs, use{what, s}) }
	sub := func(what, s string) { subs = append(subs, use{what, s}) }

	for _, sess := range [][2]string{{"acme", "s1"}, {"a-b_C9", strings.Repeat("x", events.MaxTokenLen)}, {"bad:tenant", "s1"}, {"acme", "has space"}} {
		tenant, session := sess[0], sess[1]
		p := events.Partition(tenant, session, partitions)
		pub("quarantine record", ingest.QuarantineSubject(tenant, session))
		if events.ValidToken(tenant) && events.ValidToken(session) {
			pub("append (ingest, reconciler)", events.StoredEventSubject(p, tenant, session))
			pub("snapshot", events.SnapshotSubject(tenant, session))
			pub("recovery command", recovery.CommandSubject(tenant, session))
			pub("fleet index row", "$KV."+projections.IndexBucket+"."+projections.IndexKey(p, tenant, session))
			pub("presence ping", recovery.ControlSubject(tenant, recovery.PresenceSession))
		}
	}
	pub("group heartbeat", "$KV."+pgroup.DefaultBucket+"."+projections.EngineGroup+"."+pgroup.MemberName())
	pub("write probe", "$KV."+events.ProbeBucket+".reconciler")
	pub("account info", "$JS.API.INFO")
	pub("runtime discovery", "$SRV.PING.turnstone-runtime")
	for _, st := range []string{events.EventsStream, events.SnapshotsStream, recovery.Stream, ingest.QuarantineStream, "KV_" + projections.IndexBucket} {
		pub("stream info", "$JS.API.STREAM.INFO."+st)
		pub("direct get", "$JS.API.DIRECT.GET."+st)
	}
	for p := range partitions {
		name := projections.ProjectorConsumerName("", p)
		pub("projector consumer", "$JS.API.CONSUMER.INFO."+events.EventsStream+"."+name)
		pub("projector pull", "$JS.API.CONSUMER.MSG.NEXT."+events.EventsStream+"."+name)
		pub("projector unpin", "$JS.API.CONSUMER.UNPIN."+events.EventsStream+"."+name)
		sub("ingest: the partition's appends", ingest.IngestSubject(p, "*", "*"))
	}
	pub("ack", "$JS.ACK."+events.EventsStream+".projector-p0.1.2.3.4.5.6")
	src, _ := ingest.IngestMapping(partitions)
	sub("ingest: unmapped appends", src)
	sub("reads", ingest.ReadSubject("*", "*"))
	sub("replies", "_INBOX.abc.>")

	for _, u := range pubs {
		if !allowed(perm.Publish, perm.PublishDeny, u.subject) {
			t.Errorf("%s: the engine may not publish to %s", u.what, u.subject)
		}
	}
	for _, u := range subs {
		if !allowed(perm.Subscribe, perm.SubscribeDeny, u.subject) {
			t.Errorf("%s: the engine may not subscribe to %s", u.what, u.subject)
		}
	}
	// And a tenant may publish its appends but never reach the mapped
	// subjects, the stored subjects or another tenant's.
	tp := RolePermissions(RoleTenant, "acme", partitions, false)
	for _, c := range []struct {
		subject string
		want    bool
	}{
		{events.EventSubject("acme", "s1"), true},
		{events.EventSubject("globex", "s1"), false},
		{ingest.IngestSubject(events.Partition("acme", "s1", partitions), "acme", "s1"), false},
		{events.StoredEventSubject(0, "acme", "s1"), false},
		{ingest.QuarantineSubject("acme", "s1"), false},
	} {
		if got := allowed(tp.Publish, tp.PublishDeny, c.subject); got != c.want {
			t.Errorf("tenant acme publishing %s: allowed %v, want %v", c.subject, got, c.want)
		}
	}
}
