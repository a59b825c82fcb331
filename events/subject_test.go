package events

import (
	"strings"
	"testing"
)

func TestParseStoredSubject(t *testing.T) {
	t.Parallel()
	tests := []struct {
		subject         string
		ok              bool
		partition       int
		tenant, session string
		why             string // a part of the reason
	}{
		{"agent.evt.3.acme.chat-42", true, 3, "acme", "chat-42", ""},
		{"agent.evt.0.t1._breakers", true, 0, "t1", "_breakers", ""},
		{"agent.evt.t1.*", false, 0, "t1", "*", "4 tokens, want 5"},
		{"agent.evt.t1.s1", false, 0, "t1", "s1", "stored without its partition"},
		{"agent.evt.0.t1.*", false, 0, "t1", "*", `session token "*"`},
		{"agent.evt.0.*.s", false, 0, "*", "s", `tenant token "*"`},
		{"agent.evt.0.t1.>", false, 0, "t1", ">", `session token ">"`},
		{"agent.evt.x.t1.s1", false, 0, "t1", "s1", `partition token "x" is not a number`},
		{"agent.evt.-1.t1.s1", false, 0, "t1", "s1", "not a number"},
		{"agent.evt.0.t1.s1.extra", false, 0, "t1", "s1", "6 tokens"},
		{"agent.evt", false, 0, "", "", "not an event subject"},
		{"agent.cmd.0.t1.s1", false, 0, "", "", "not an event subject"},
	}
	for _, tt := range tests {
		t.Run(tt.subject, func(t *testing.T) {
			p, tenant, session, ok, why := ParseStoredSubject(tt.subject)
			if ok != tt.ok || tenant != tt.tenant || session != tt.session || (tt.ok && p != tt.partition) {
				t.Errorf("got partition %d, %q/%q, ok %v (%s); want %d, %q/%q, ok %v", p, tenant, session, ok, why, tt.partition, tt.tenant, tt.session, tt.ok)
			}
			if ok != (why == "") || !strings.Contains(why, tt.why) {
				t.Errorf("why = %q, want it to contain %q", why, tt.why)
			}
		})
	}
}
