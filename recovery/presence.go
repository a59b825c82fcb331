package recovery

// Names of the presence protocol (docs/control.md, "Presence"): a runtime
// announces itself as a nats.go/micro service (ADR-32) named
// PresenceService, with metadata PresenceMetaTenant and
// PresenceMetaSessions, and proves it by answering an ActionPing control
// request on agent.ctl.<tenant>.<PresenceSession>.
const (
	// PresenceService is the nats.go/micro service name runtimes register.
	PresenceService = "turnstone-runtime"
	// PresenceMetaTenant is the service metadata key naming the tenant served.
	PresenceMetaTenant = "tenant"
	// PresenceMetaSessions is the metadata key naming the sessions served: "*"
	// (or absent) for every session of the tenant, else a prefix of
	// session tokens.
	PresenceMetaSessions = "sessions"
	// PresenceSession is the session token of the control ping that proves a
	// runtime answers the tenant's control subjects:
	// agent.ctl.<tenant>._presence. Session tokens starting with "_" are
	// Turnstone's own.
	PresenceSession = "_presence"
	// ActionPing is the control action of that request. Any reply (ok,
	// rejected, failed) proves presence; no responders proves absence.
	ActionPing = "ping"
)
