package events_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/turnstone-dev/turnstone/events"
)

// TestResolveSession: a full name, a token, a unique prefix, a prefix of
// a session and its sidechains name a session; an unknown name and an
// ambiguous prefix are refused with their sentinels.
func TestResolveSession(t *testing.T) {
	t.Parallel()
	l, _ := openLog(t, events.Config{})
	ctx := context.Background()
	for _, ref := range []string{"acme/abc123", "acme/abc123_agent-a1", "acme/abd999", "globex/abc123", "globex/zzz"} {
		tenant, session, _ := strings.Cut(ref, "/")
		ev, err := events.New(tenant, session, "", &events.SessionStarted{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Append(ctx, []events.Event{ev}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, tenant, want string
		err                error
	}{
		{name: "acme/abc123", want: "acme/abc123"},
		{name: "zzz", want: "globex/zzz"},
		{name: "abd", want: "acme/abd999"},
		{name: "abc1", tenant: "acme", want: "acme/abc123"}, // the session, not its sidechain
		{name: "abc123_agent", want: "acme/abc123_agent-a1"},
		{name: "abc123", err: events.ErrAmbiguousSession}, // in two tenants
		{name: "ab", tenant: "acme", err: events.ErrAmbiguousSession},
		{name: "nope", err: events.ErrSessionNotFound},
		{name: "acme/", err: events.ErrSessionNotFound},
	} {
		ref, err := l.ResolveSession(ctx, tc.name, tc.tenant)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Errorf("%q (tenant %q): %v, want %v", tc.name, tc.tenant, err, tc.err)
			}
			continue
		}
		if err != nil || ref.Tenant+"/"+ref.Session != tc.want {
			t.Errorf("%q (tenant %q): %s/%s, %v; want %s", tc.name, tc.tenant, ref.Tenant, ref.Session, err, tc.want)
		}
	}
}
