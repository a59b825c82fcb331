package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/turnstone-dev/turnstone/events"
)

// resolveSession finds the session an argument names: "TENANT/SESSION", a
// session token, or a unique prefix of one (as git takes a short hash).
// tenant, when set, limits the search to that tenant.
func resolveSession(ctx context.Context, log *events.Log, arg, tenant string) (events.SessionRef, error) {
	if t, s, ok := strings.Cut(arg, "/"); ok {
		tenant, arg = t, s
	}
	if arg == "" {
		return events.SessionRef{}, fmt.Errorf("no session named")
	}
	refs, err := log.Sessions(ctx, tenant)
	if err != nil {
		return events.SessionRef{}, err
	}
	var exact, prefix []events.SessionRef
	for _, r := range refs {
		switch {
		case r.Session == arg:
			exact = append(exact, r)
		case strings.HasPrefix(r.Session, arg):
			prefix = append(prefix, r)
		}
	}
	matches := exact
	if len(matches) == 0 {
		matches = parentOf(prefix)
	}
	switch len(matches) {
	case 1:
		return matches[0], nil
	case 0:
		where := "the log"
		if tenant != "" {
			where = "tenant " + tenant
		}
		return events.SessionRef{}, fmt.Errorf("session %q: %w in %s (engine sessions lists them)", arg, events.ErrSessionNotFound, where)
	}
	var names []string
	for i, m := range matches {
		if i == 5 {
			names = append(names, "...")
			break
		}
		names = append(names, m.Tenant+"/"+m.Session)
	}
	return events.SessionRef{}, fmt.Errorf("session %q is ambiguous: %s; name it as TENANT/SESSION", arg, strings.Join(names, ", "))
}

// parentOf narrows prefix matches to the one session every other match
// extends (a session and its sidechains, named <session>_agent-<id>), or
// returns them all when there is no such session.
func parentOf(matches []events.SessionRef) []events.SessionRef {
	if len(matches) < 2 {
		return matches
	}
	shortest := matches[0]
	for _, m := range matches[1:] {
		if len(m.Session) < len(shortest.Session) {
			shortest = m
		}
	}
	for _, m := range matches {
		if m.Tenant != shortest.Tenant || !strings.HasPrefix(m.Session, shortest.Session) {
			return matches
		}
	}
	return []events.SessionRef{shortest}
}
