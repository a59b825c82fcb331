package reconciler

import (
	"strings"
	"testing"
	"time"
)

func TestParsePolicyDefaultsAndOverrides(t *testing.T) {
	t.Parallel()
	p, err := ParsePolicy([]byte(`
turn_deadline: 90s
budget:
  same_output_limit: 4
tenants:
  acme:
    turn_deadline: 30s
    transient:
      chain: ["retry*3", "switch_provider", "pause"]
`))
	if err != nil {
		t.Fatal(err)
	}
	if time.Duration(p.TurnDeadline) != 90*time.Second || p.Budget.SameOutputLimit != 4 || p.Budget.SameErrorLimit != 3 {
		t.Fatalf("base: %+v", p)
	}
	a := p.For("acme")
	if time.Duration(a.TurnDeadline) != 30*time.Second || a.Budget.SameOutputLimit != 4 || len(a.Transient.Chain) != 3 {
		t.Fatalf("acme: deadline %s, output limit %d, chain %v", time.Duration(a.TurnDeadline), a.Budget.SameOutputLimit, a.Transient.Chain)
	}
	if p.For("other") != p {
		t.Fatal("a tenant without overrides gets the base policy")
	}
	empty, err := ParsePolicy(nil)
	if err != nil || time.Duration(empty.TurnDeadline) != 10*time.Minute || time.Duration(empty.ToolDeadline) != 2*time.Hour ||
		time.Duration(empty.ToolTimeoutGrace) != 30*time.Second || empty.TurnMaxDuration != 0 || !*empty.Distillation.Guard {
		t.Fatalf("empty file: %+v, %v", empty, err)
	}
}

func TestParsePolicyNamesTheBadKey(t *testing.T) {
	t.Parallel()
	tests := []struct{ yaml, want string }{
		{"turn_deadline: soon", "soon"},
		{"turn_deadline: -5s", "turn_deadline: must be positive"},
		{"turn_deadlines: 5s", "turn_deadlines"},
		{"budget:\n  same_error_limit: 0", "budget.same_error_limit"},
		{"restart:\n  in_flight_turns: maybe", "restart.in_flight_turns"},
		{"transient:\n  chain: [retry*2, explode]", "transient.chain"},
		{"tenants:\n  acme:\n    turn_deadline: 0s", "tenants.acme.turn_deadline"},
		{"tenants:\n  acme:\n    budget:\n      nonsense: 1", "tenants.acme"},
		{"tenants:\n  \"a.b\":\n    turn_deadline: 5s", "tenants.a.b"},
		{"retention:\n  max_age: -1h", "retention.max_age: must not be negative"},
		{"retention:\n  max_age: 30 days", "30 days"},
		{"tenants:\n  acme:\n    retention:\n      max_age: -1h", "tenants.acme.retention.max_age"},
	}
	for _, tt := range tests {
		_, err := ParsePolicy([]byte(tt.yaml))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: error %v, want it to name %q", tt.yaml, err, tt.want)
		}
	}
}

// TestParsePolicyRetention: no retention by default; a base max age, a
// tenant's override (in days), and which tenants keep forever.
func TestParsePolicyRetention(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		yaml    string
		retains bool
		want    map[string]time.Duration
	}{
		{"", false, map[string]time.Duration{"any": 0}},
		{"retention:\n  max_age: 720h", true, map[string]time.Duration{"any": 720 * time.Hour}},
		{"tenants:\n  acme:\n    retention:\n      max_age: 30d", true, map[string]time.Duration{"acme": 30 * 24 * time.Hour, "other": 0}},
		{"retention:\n  max_age: 90d\ntenants:\n  keep:\n    retention:\n      max_age: 0s", true,
			map[string]time.Duration{"keep": 0, "other": 90 * 24 * time.Hour}},
	} {
		p, err := ParsePolicy([]byte(tt.yaml))
		if err != nil {
			t.Fatalf("%q: %v", tt.yaml, err)
		}
		if p.Retains() != tt.retains {
			t.Errorf("%q: Retains %v, want %v", tt.yaml, p.Retains(), tt.retains)
		}
		for tenant, want := range tt.want {
			if got := time.Duration(p.For(tenant).Retention.MaxAge); got != want {
				t.Errorf("%q: %s keeps %s, want %s", tt.yaml, tenant, got, want)
			}
		}
	}
}
