package auth

import (
	"fmt"
	"strings"

	"github.com/turnstone-dev/turnstone/events"
	"github.com/turnstone-dev/turnstone/ingest"
	"github.com/turnstone-dev/turnstone/internal/audit"
	"github.com/turnstone-dev/turnstone/internal/erasure"
	"github.com/turnstone-dev/turnstone/internal/pgroup"
	"github.com/turnstone-dev/turnstone/internal/reconciler"
	"github.com/turnstone-dev/turnstone/projections"
	"github.com/turnstone-dev/turnstone/recovery"
)

// This file is the permission table: what each role may publish and
// subscribe to, as data, with why. docs/security.md shows the same table
// (TestSecurityDocHoldsThePermissionTable keeps them equal), and
// test/auth_test.go runs each role against a server that enforces it.
// The JetStream API subjects are those the server named in its
// permission violations while engines, workers and runtimes ran under
// these permissions (ADR-1 and the server's jetstream_api.go give the
// shapes).

// Grant is one row of a role's permissions.
type Grant struct {
	// Subject is a NATS subject, with wildcards. In a row with
	// PerPartition set, %d stands for each partition number.
	Subject string
	// Pub and Sub: the user may publish to the subject, subscribe to it.
	Pub, Sub bool
	// Deny makes the row a deny: it wins over every allow.
	Deny bool
	// PerPartition expands the row once per partition of the spec.
	PerPartition bool
	// Why says what needs the row.
	Why string
}

// Permissions are a user's permissions as nats-server applies them
// (`permissions` of a user in the server configuration): subjects
// allowed and denied to publish and to subscribe, and whether the user
// may publish a reply to any request it received (allow_responses).
type Permissions struct {
	Publish        []string
	PublishDeny    []string
	Subscribe      []string
	SubscribeDeny  []string
	AllowResponses bool
}

// Subjects used below, from the packages that own them.
var (
	evStream   = events.EventsStream
	snapStream = events.SnapshotsStream
	recStream  = recovery.Stream
	quarStream = ingest.QuarantineStream
	kvIndex    = projections.IndexBucket
	kvMembers  = pgroup.DefaultBucket
	kvProbe    = events.ProbeBucket
	kvActivity = reconciler.ActivityBucket
	kvCommands = recovery.StatusBucket
	projectorP = projections.ProjectorConsumerName("", 0)
	recoveryP  = recovery.ConsumerName(0)
	// otelP is the live OpenTelemetry export's consumer of partition 0
	// (otel.ConsumerName("", 0); written out so that this table links no
	// OpenTelemetry SDK; internal/otel's tests check they agree).
	otelP       = "turnstone-otel-p0"
	evPrefix    = events.EventSubjectPrefix
	snapPrefix  = events.SnapshotSubjectPrefix
	cmdPrefix   = recovery.CommandSubjectPrefix
	ctlPrefix   = recovery.ControlSubjectPrefix
	readPrefix  = ingest.ReadSubjectPrefix
	quarPrefix  = ingest.QuarantineSubjectPrefix
	inPrefix    = ingest.IngestSubjectPrefix
	engineGroup = projections.EngineGroup
	eraseNotice = erasure.NoticeSubject
	auditStream = audit.Stream
	auditPrefix = audit.SubjectPrefix
)

// partitionName turns a partition-0 name ("recovery-p0") into its
// template ("recovery-p%d").
func partitionName(name0 string) string { return strings.TrimSuffix(name0, "0") + "%d" }

// jsRead are the JetStream API rows of reading stream s: its info, its
// messages by sequence or subject (direct get, and the stream's own get).
func jsRead(s, why string) []Grant {
	return []Grant{
		{Subject: "$JS.API.STREAM.INFO." + s, Pub: true, Why: why},
		{Subject: "$JS.API.DIRECT.GET." + s, Pub: true, Why: why},
		{Subject: "$JS.API.DIRECT.GET." + s + ".>", Pub: true, Why: why},
		{Subject: "$JS.API.STREAM.MSG.GET." + s, Pub: true, Why: why},
	}
}

// jsOrdered are the rows of ordered (ephemeral) consumers on stream s:
// create one (nats.go names it in the subject), read its info, pull,
// answer the flow control of a push one (KV watches), and delete one:
// nats.go deletes the consumer it leaves behind each time an ordered
// consumer re-creates itself (a gap, a missed heartbeat, a reconnect, each
// Fetch after the first). A role knows only its own ephemeral consumers'
// names (random; no role but the operator may list consumers), and the
// durable consumers of s are denied by jsNoUpdate, which every caller
// grants beside these rows.
func jsOrdered(s, why string) []Grant {
	return []Grant{
		{Subject: "$JS.API.CONSUMER.CREATE." + s, Pub: true, Why: why},
		{Subject: "$JS.API.CONSUMER.CREATE." + s + ".*", Pub: true, Why: why},
		{Subject: "$JS.API.CONSUMER.CREATE." + s + ".*.>", Pub: true, Why: why},
		{Subject: "$JS.API.CONSUMER.INFO." + s + ".*", Pub: true, Why: why},
		{Subject: "$JS.API.CONSUMER.MSG.NEXT." + s + ".*", Pub: true, Why: why},
		{Subject: "$JS.API.CONSUMER.DELETE." + s + ".*", Pub: true, Why: why + "; delete the one left behind when it re-creates itself, or a watch stopped"},
	}
}

// jsDurable are the rows of consuming the durable consumer of each
// partition (name a template with %d) of stream s in a priority group:
// info, pull, unpin, ack; and jsNoUpdate's.
func jsDurable(s, name, why string) []Grant {
	return append([]Grant{
		{Subject: "$JS.API.CONSUMER.INFO." + s + "." + name, Pub: true, PerPartition: true, Why: why},
		{Subject: "$JS.API.CONSUMER.MSG.NEXT." + s + "." + name, Pub: true, PerPartition: true, Why: why},
		{Subject: "$JS.API.CONSUMER.UNPIN." + s + "." + name, Pub: true, PerPartition: true, Why: why + " (a new owner unpins)"},
		{Subject: "$JS.API.CONSUMER.RESET." + s + "." + name, Pub: true, PerPartition: true, Why: why + " (a new owner has what the last one left unacknowledged delivered again)"},
		{Subject: "$JS.ACK." + s + ".>", Pub: true, Why: why + " (acks)"},
	}, jsNoUpdate(s, name)...)
}

// jsNoUpdate are the denies that keep the durable consumer of each
// partition (name a template with %d) of stream s the operator's: a
// create naming it would update it, and jsOrdered's delete would remove
// it.
func jsNoUpdate(s, name string) []Grant {
	const why = "the durable consumers are the operator's: no create, update or delete over them"
	return []Grant{
		{Subject: "$JS.API.CONSUMER.CREATE." + s + "." + name, Pub: true, Deny: true, PerPartition: true, Why: why},
		{Subject: "$JS.API.CONSUMER.CREATE." + s + "." + name + ".>", Pub: true, Deny: true, PerPartition: true, Why: why},
		{Subject: "$JS.API.CONSUMER.DELETE." + s + "." + name, Pub: true, Deny: true, PerPartition: true, Why: why},
	}
}

// kvRead are the rows of reading and watching bucket b. Stopping a watch
// deletes its ephemeral consumer (nats.go does), which jsOrdered's delete
// row grants: the KV streams hold no durable consumer of Turnstone's.
func kvRead(b, why string) []Grant {
	return append(jsRead("KV_"+b, why), jsOrdered("KV_"+b, why+" (watch)")...)
}

// Grants returns the rows of role: for RoleTenant, of tenant's user.
// Every role may use its own account's inboxes for replies.
func Grants(role Role, tenant string) []Grant {
	switch role {
	case RoleOperator:
		return []Grant{
			{Subject: ">", Pub: true, Sub: true, Why: "everything in the TURNSTONE account: engine setup, erase, stream settings, every read"},
		}
	case RoleTenant:
		t := tenant
		return []Grant{
			{Subject: evPrefix + "." + t + ".*", Pub: true, Why: "append its events through the engine (service import; the engine validates, masks, stores, replies)"},
			{Subject: readPrefix + "." + t + ".*", Pub: true, Why: "read its sessions through the engine (service import)"},
			{Subject: "_INBOX.>", Sub: true, Why: "replies to its appends and reads (its own account's inboxes)"},
			{Subject: evPrefix + ".*." + t + ".*", Sub: true, Why: "follow its stored events live (stream import)"},
			{Subject: ctlPrefix + "." + t + ".>", Sub: true, Why: "answer its runtime's control requests (exported to TURNSTONE)"},
			{Subject: "$SRV.>", Pub: true, Sub: true, Why: "announce its runtime as the micro service turnstone-runtime; `nats micro list` in its account"},
		}
	case RoleEngine:
		g := []Grant{
			{Subject: inPrefix + ".*.*.*", Sub: true, Why: "ingest: publishers' appends, mapped by the server to their partition (agent.in.<partition>.<tenant>.<session>); each engine subscribes to its own partitions'"},
			{Subject: evPrefix + ".*.*", Sub: true, Why: "ingest: publishers' appends on a server without the partition mapping (agent.evt.<tenant>.<session>)"},
			{Subject: readPrefix + ".*.*", Sub: true, Why: "ingest: publishers' reads (agent.read.<tenant>.<session>)"},
			{Subject: "_INBOX.>", Sub: true, Why: "replies: JetStream API, acks, ordered consumers, KV watches, pings"},
			{Subject: evPrefix + ".*.*.*", Pub: true, Why: "append to the stored event subjects (ingest, the reconciler's own events)"},
			{Subject: quarPrefix + ".*.*", Pub: true, Why: "quarantine refused events (agent.rejected.<tenant>.<session>)"},
			{Subject: snapPrefix + ".*.*", Pub: true, Why: "write snapshots"},
			{Subject: cmdPrefix + ".*.*", Pub: true, Why: "issue recovery commands"},
			{Subject: ctlPrefix + ".*._presence", Pub: true, Why: "presence: ping each tenant's runtime"},
			{Subject: "$SRV.PING.turnstone-runtime", Pub: true, Why: "presence: discover runtimes in the TURNSTONE account (none under auth)"},
			{Subject: "$KV." + kvIndex + ".>", Pub: true, Why: "write the fleet index"},
			{Subject: "$KV." + kvMembers + "." + engineGroup + ".>", Pub: true, Why: "the engines' group: its record and its partitions' claims"},
			{Subject: "$JS.EVENT.ADVISORY.CONSUMER.PINNED." + evStream + ".*", Sub: true, Why: "hear at once that a projector consumer's pin moved (ADR-42)"},
			{Subject: "$JS.EVENT.ADVISORY.CONSUMER.UNPINNED." + evStream + ".*", Sub: true, Why: "hear at once that a projector consumer's pin moved (ADR-42)"},
			{Subject: "$KV." + kvProbe + ".>", Pub: true, Why: "the reconciler's write probe"},
			{Subject: "$KV." + kvActivity + ".>", Pub: true, Why: "signs of life: a subagent session's activity, for its parent's engine"},
			{Subject: auditPrefix + "." + string(audit.ActionPolicyLoaded), Pub: true, Why: "record the reconciler policy it loaded (engine whatif --baseline recorded)"},
			{Subject: "$JS.API.INFO", Pub: true, Why: "the reconciler's check of the account's storage"},
			{Subject: eraseNotice, Sub: true, Why: "erasure: hear an erase's notices and confirm them (block the scope, forget its state)"},
		}
		g = append(g, jsRead(evStream, "read the event log")...)
		g = append(g, jsOrdered(evStream, "read and follow sessions (ordered consumers)")...)
		g = append(g, jsDurable(evStream, partitionName(projectorP), "the projector's partition consumers")...)
		g = append(g, jsDurable(evStream, partitionName(otelP), "the OpenTelemetry export's partition consumers (docs/otel.md)")...)
		g = append(g, jsRead(snapStream, "restore sessions from snapshots")...)
		g = append(g, jsRead(recStream, "read commands (reissue), and the reconciler's write probe: is the stream full")...)
		g = append(g, jsRead(quarStream, "check the quarantine stream exists")...)
		g = append(g, kvRead(kvIndex, "the fleet index")...)
		g = append(g, kvRead(kvMembers, "the engines' group")...)
		g = append(g, kvRead(kvProbe, "the write probe")...)
		g = append(g, jsRead("KV_"+kvCommands, "command statuses")...)
		g = append(g, jsRead("KV_"+kvActivity, "signs of life: a subagent session's activity")...)
		g = append(g, jsRead(auditStream, "the policy last recorded")...)
		return g
	case RoleWorker:
		g := []Grant{
			{Subject: "_INBOX.>", Sub: true, Why: "replies: JetStream API, acks, ordered consumers, KV watches, control replies"},
			{Subject: evPrefix + ".*.*.*", Pub: true, Why: "append recovery events to the sessions' stored subjects"},
			{Subject: cmdPrefix + ".*.*", Pub: true, Why: "issue a command again (a resumed session's reissue)"},
			{Subject: ctlPrefix + ".>", Pub: true, Why: "control requests to the tenants' runtimes (imported from each tenant account)"},
			{Subject: "$KV." + kvCommands + ".>", Pub: true, Why: "command statuses"},
			{Subject: "$KV." + kvMembers + "." + recovery.WorkerGroup + ".>", Pub: true, Why: "the workers' group: its record and its partitions' claims"},
			{Subject: "$JS.API.INFO", Pub: true, Why: "account info (client checks)"},
			{Subject: eraseNotice, Sub: true, Why: "erasure: hear an erase's notices and confirm them (block the scope, forget its state)"},
		}
		g = append(g, jsRead(evStream, "read sessions")...)
		g = append(g, jsOrdered(evStream, "read and follow sessions (ordered consumers)")...)
		g = append(g, jsNoUpdate(evStream, partitionName(projectorP))...)
		g = append(g, jsNoUpdate(evStream, partitionName(otelP))...)
		g = append(g, jsRead(recStream, "read commands")...)
		g = append(g, jsDurable(recStream, partitionName(recoveryP), "the recovery partition consumers")...)
		g = append(g, jsRead(snapStream, "restore sessions from snapshots")...)
		g = append(g, kvRead(kvCommands, "command statuses")...)
		g = append(g, kvRead(kvMembers, "the workers' group")...)
		g = append(g, jsRead("KV_"+kvIndex, "the fleet index")...)
		return g
	}
	return nil
}

// RetentionGrants are the rows an engine gets on top of Grants(RoleEngine)
// when the spec sets `retention: true`: what its retention sweep needs to
// erase the sessions past their tenant's max age (engine.SweepRetention
// through engine.Erase). JetStream cannot limit a purge to some subjects by
// permission (the filter is in the request's body), so these rows let the
// engine purge the whole of each stream: a deployment without a retention
// policy leaves them out, and only the operator can purge.
func RetentionGrants() []Grant {
	g := []Grant{
		{Subject: eraseNotice, Pub: true, Why: "retention: announce its erase to every engine and worker"},
		{Subject: auditPrefix + ".>", Pub: true, Why: "retention: record each sweep's erase in the audit stream"},
		{Subject: "$KV." + kvCommands + ".>", Pub: true, Why: "retention: delete the statuses of the erased sessions' commands"},
	}
	for _, st := range []string{evStream, snapStream, recStream, quarStream, "KV_" + kvIndex, "KV_" + kvCommands} {
		g = append(g, Grant{Subject: "$JS.API.STREAM.PURGE." + st, Pub: true, Why: "retention: purge the sessions past their tenant's max age"})
	}
	g = append(g, Grant{Subject: "$JS.API.STREAM.INFO." + auditStream, Pub: true, Why: "retention: check the audit stream exists before erasing"})
	g = append(g, jsOrdered(recStream, "retention: find the erased sessions' commands")...)
	g = append(g, jsNoUpdate(recStream, partitionName(recoveryP))...)
	g = append(g, kvRead(kvCommands, "retention: the erased sessions' command statuses")...)
	return g
}

// AllowResponses reports whether role may publish a reply to any request
// it received (nats-server's allow_responses): the engine answers
// appends and reads, the tenant its runtime's control requests and
// micro service pings, the worker JetStream's flow control.
func AllowResponses(role Role) bool { return role != RoleOperator }

// RolePermissions returns the permissions of a user of role (of tenant,
// for RoleTenant), its per-partition rows expanded for partitions
// partitions; an engine's with RetentionGrants when retention is set
// (the spec's `retention: true`). The operator's are nil: it may do
// anything in its account.
func RolePermissions(role Role, tenant string, partitions int, retention bool) *Permissions {
	if role == RoleOperator {
		return nil
	}
	p := &Permissions{AllowResponses: AllowResponses(role)}
	grants := Grants(role, tenant)
	if role == RoleEngine && retention {
		grants = append(grants, RetentionGrants()...)
	}
	for _, g := range grants {
		subjects := []string{g.Subject}
		if g.PerPartition {
			subjects = subjects[:0]
			for n := range partitions {
				subjects = append(subjects, fmt.Sprintf(g.Subject, n))
			}
		}
		for _, s := range subjects {
			switch {
			case g.Pub && g.Deny:
				p.PublishDeny = append(p.PublishDeny, s)
			case g.Pub:
				p.Publish = append(p.Publish, s)
			}
			switch {
			case g.Sub && g.Deny:
				p.SubscribeDeny = append(p.SubscribeDeny, s)
			case g.Sub:
				p.Subscribe = append(p.Subscribe, s)
			}
		}
	}
	return p
}

// PermissionTable returns the permissions of every role as a Markdown
// table (role, subject, publish/subscribe, allow/deny, why), tenant rows
// written for the tenant "<tenant>" and per-partition rows with "<n>":
// the table docs/security.md holds (its test keeps the two equal).
func PermissionTable() string {
	var b strings.Builder
	b.WriteString("| role | subject | may | why |\n| --- | --- | --- | --- |\n")
	for _, role := range []Role{RoleTenant, RoleEngine, "engine, with `retention: true`", RoleWorker, RoleOperator} {
		grants := Grants(role, "<tenant>")
		if role != RoleEngine && strings.HasPrefix(string(role), string(RoleEngine)) {
			grants = RetentionGrants()
		}
		for _, g := range grants {
			var may []string
			if g.Pub {
				may = append(may, "publish")
			}
			if g.Sub {
				may = append(may, "subscribe")
			}
			verb := strings.Join(may, ", ")
			if g.Deny {
				verb = "**deny** " + verb
			}
			subject := g.Subject
			if g.PerPartition {
				subject = strings.ReplaceAll(subject, "%d", "<n>")
			}
			fmt.Fprintf(&b, "| %s | `%s` | %s | %s |\n", role, subject, verb, g.Why)
		}
	}
	return b.String()
}
