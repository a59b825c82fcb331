package auth

import (
	"os"
	"strings"
	"testing"
)

// TestSecurityDocHoldsThePermissionTable: docs/security.md shows the
// permissions the server enforces, row for row.
func TestSecurityDocHoldsThePermissionTable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := PermissionTable(); !strings.Contains(string(doc), want) {
		t.Fatalf("docs/security.md does not hold the permission table of roles.go; put this in it:\n%s", want)
	}
}

// TestSpecRules: a spec breaking a rule is refused with every problem.
func TestSpecRules(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"no tenant", "tenants: []", "name at least one tenant"},
		{"bad token", "tenants: [a.b]", `tenant "a.b"`},
		{"reserved", "tenants: [engine]", "taken by Turnstone's own user"},
		{"twice", "tenants: [a, a]", "named twice"},
		{"unknown key", "tenants: [a]\nfoo: 1", "field foo not found"},
		{"user of unknown tenant", "tenants: [a]\nusers: [{name: b, role: tenant, tenant: z}]", `tenant "z" is not one of`},
		{"bad role", "tenants: [a]\nusers: [{name: b, role: admin}]", `role "admin"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseSpec([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error containing %q, got %v", tc.want, err)
			}
		})
	}
	s, err := ParseSpec([]byte("tenants: [acme]\nusers: [{name: alice, role: operator}]"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(s.AllUsers()); n != 5 {
		t.Fatalf("users: want operator, engine, worker, acme, alice, got %d", n)
	}
}

// TestEnsureKeysKeepsAndRotates: keys are created once and kept; a
// deleted seed file is a new key (rotation).
func TestEnsureKeysKeepsAndRotates(t *testing.T) {
	s, err := ParseSpec([]byte("tenants: [acme]\ncredentials: " + t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	k1, created, err := EnsureKeys(s)
	if err != nil || len(created) != 4 {
		t.Fatalf("first run: created %v, %v", created, err)
	}
	k2, created, err := EnsureKeys(s)
	if err != nil || len(created) != 0 || k2["acme"] != k1["acme"] {
		t.Fatalf("second run: created %v, same key %v, %v", created, k2["acme"] == k1["acme"], err)
	}
	if err := os.Remove(s.SeedFile("acme")); err != nil {
		t.Fatal(err)
	}
	k3, created, err := EnsureKeys(s)
	if err != nil || len(created) != 1 || k3["acme"] == k1["acme"] || k3["engine"] != k1["engine"] {
		t.Fatalf("after deleting acme's seed: created %v, %v", created, err)
	}
	if fi, err := os.Stat(s.SeedFile("acme")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("seed file mode: %v %v", fi.Mode(), err)
	}
}
