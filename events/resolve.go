package events

import (
	"context"
	"fmt"
	"strings"
)

// ResolveSession finds the session name names in the log: "TENANT/SESSION",
// a session token, or a unique prefix of one (as git takes a short hash).
// tenant, when set, limits the search to that tenant. A prefix that
// matches a session and its sidechains (<session>_agent-<id>) names the
// session.
//
// Errors: ErrSessionNotFound (wrapped) when nothing matches;
// ErrAmbiguousSession (wrapped, naming up to five candidates) when several
// do; Sessions' errors.
func (l *Log) ResolveSession(ctx context.Context, name, tenant string) (SessionRef, error) {
	if t, s, ok := strings.Cut(name, "/"); ok {
		tenant, name = t, s
	}
	if name == "" {
		return SessionRef{}, fmt.Errorf("resolve session: %w: no session named", ErrSessionNotFound)
	}
	refs, err := l.Sessions(ctx, tenant)
	if err != nil {
		return SessionRef{}, fmt.Errorf("resolve session %q: %w", name, err)
	}
	return resolveIn(refs, name, tenant)
}

// resolveIn is ResolveSession's rule over the sessions refs.
func resolveIn(refs []SessionRef, name, tenant string) (SessionRef, error) {
	var exact, prefix []SessionRef
	for _, r := range refs {
		switch {
		case r.Session == name:
			exact = append(exact, r)
		case strings.HasPrefix(r.Session, name):
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
		return SessionRef{}, fmt.Errorf("session %q: %w in %s", name, ErrSessionNotFound, where)
	}
	var names []string
	for i, m := range matches {
		if i == 5 {
			names = append(names, "...")
			break
		}
		names = append(names, m.Tenant+"/"+m.Session)
	}
	return SessionRef{}, fmt.Errorf("session %q: %w: %s; name it as TENANT/SESSION", name, ErrAmbiguousSession, strings.Join(names, ", "))
}

// parentOf narrows prefix matches to the one session every other match
// extends (a session and its sidechains, named <session>_agent-<id>), or
// returns them all when there is no such session.
func parentOf(matches []SessionRef) []SessionRef {
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
	return []SessionRef{shortest}
}
