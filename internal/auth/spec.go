// Package auth sets Turnstone up on NATS's own security model: accounts,
// users with nkeys and subject permissions, no home-made authentication.
//
// Turnstone's processes (operator, engines, workers) live in one account,
// TURNSTONE, with JetStream. Each tenant gets its own account, T_<tenant>,
// without JetStream, that imports exactly its own subjects from TURNSTONE
// (appends and reads through the engine, its stored events live) and
// exports its runtime's control subjects to TURNSTONE. Within each
// account every user has a role (operator, engine, worker, tenant) whose
// permissions are the narrowest that work: roles.go holds them as data,
// docs/security.md shows them as a table.
//
// A Spec (a small YAML file, `engine serve --auth FILE`) names the
// tenants; EnsureKeys generates an nkey seed per user on first use and
// keeps it after; ServerConfig writes the nats-server configuration of
// the accounts, users and permissions, the same for the embedded server
// and for an external cluster (`engine auth config`).
package auth

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/turnstone-dev/turnstone/events"
	"gopkg.in/yaml.v3"
)

// Role is what a user may do; RolePermissions says how, subject by
// subject.
type Role string

// The roles.
const (
	// RoleOperator may do anything in the TURNSTONE account: set up and
	// change streams, consumers and buckets, purge and erase, read
	// everything.
	RoleOperator Role = "operator"
	// RoleEngine is an engine process (engine serve --use-existing).
	RoleEngine Role = "engine"
	// RoleWorker is a recovery worker process.
	RoleWorker Role = "worker"
	// RoleTenant is a tenant's service: it appends and reads its own
	// sessions through the engine, follows its own stored events and
	// answers its own runtime's control requests.
	RoleTenant Role = "tenant"
)

// Account names.
const (
	// Account is the account of Turnstone's processes.
	Account = "TURNSTONE"
	// TenantAccountPrefix starts a tenant's account: T_<tenant>.
	TenantAccountPrefix = "T_"
)

// TenantAccount is the account of tenant: "T_<tenant>".
func TenantAccount(tenant string) string { return TenantAccountPrefix + tenant }

// StateDir is where Turnstone keeps what it writes for this user outside
// any working tree: $XDG_STATE_HOME/turnstone, or
// ~/.local/state/turnstone when XDG_STATE_HOME is not set (the XDG Base
// Directory Specification's state directory). Errors: no home directory.
func StateDir() (string, error) {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "turnstone"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", fmt.Errorf("state directory: %w (set XDG_STATE_HOME, or credentials: in the spec)", err)
	}
	return filepath.Join(home, ".local", "state", "turnstone"), nil
}

// Errors of the package. Match them with errors.Is.
var (
	// ErrInvalidSpec wraps every rule a Spec breaks.
	ErrInvalidSpec = errors.New("invalid auth spec")
)

// Spec is the auth setup of one Turnstone installation, as the YAML file
// of `engine serve --auth FILE` holds it:
//
//	tenants: [acme, globex]      # required: one account and one user each
//	credentials: ./credentials   # optional: where the nkey seeds go
//	partitions: 8                # optional: the event stream's partitions
//	users:                       # optional: more users than the defaults
//	  - {name: alice, role: operator}
//	  - {name: acme-batch, role: tenant, tenant: acme}
//
// Users operator, engine and worker (one of each role) and one user per
// tenant named as the tenant always exist; Users adds more (a person's
// own operator key, a second service of a tenant).
type Spec struct {
	// Tenants are the tenant tokens ([A-Za-z0-9_-]), each with its
	// account T_<tenant> and a user of the same name.
	Tenants []string `yaml:"tenants"`
	// Credentials is the directory of the seed files (<user>.nk, mode
	// 0600) and the web view's token, relative to the spec file's
	// directory. Default: outside any working tree, <data>/credentials
	// when the engine's --data is given (UseDataDir), else
	// StateDir()/credentials.
	Credentials string `yaml:"credentials"`
	// Partitions is the event stream's partition count (default
	// events.DefaultPartitions): the durable consumers of each partition
	// are protected by name from changes by engines and workers.
	Partitions int `yaml:"partitions"`
	// Users are the users beyond the defaults.
	Users []User `yaml:"users"`
	// Retention gives the engines the rights their retention sweep needs
	// (RetentionGrants: purge every Turnstone stream, write the audit
	// stream). Set it when the policy has a retention.max_age; without it
	// only the operator can erase.
	Retention bool `yaml:"retention"`

	// dir is the spec file's directory (LoadSpec sets it).
	dir string
	// dataDir is the engine's --data, when given (UseDataDir).
	dataDir string
}

// UseDataDir makes <dir>/credentials the credentials directory when the
// spec names none: `engine serve --data DIR` keeps them with its store.
func (s *Spec) UseDataDir(dir string) { s.dataDir = dir }

// User is one NATS user: its name (the seed file's name, a token), its
// role and, for RoleTenant, its tenant.
type User struct {
	Name   string `yaml:"name"`
	Role   Role   `yaml:"role"`
	Tenant string `yaml:"tenant,omitempty"`
}

// Account is the account the user lives in.
func (u User) Account() string {
	if u.Role == RoleTenant {
		return TenantAccount(u.Tenant)
	}
	return Account
}

// reserved are the default users' names, which no tenant may take.
var reserved = []string{string(RoleOperator), string(RoleEngine), string(RoleWorker)}

// LoadSpec reads and validates the spec file at path. Errors name the
// file; a spec that breaks a rule wraps ErrInvalidSpec.
func LoadSpec(path string) (*Spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth spec: %w", err)
	}
	s, err := ParseSpec(b)
	if err != nil {
		return nil, fmt.Errorf("auth spec %s: %w", path, err)
	}
	abs, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("auth spec %s: %w", path, err)
	}
	s.dir = abs
	return s, nil
}

// ParseSpec parses and validates a spec; unknown keys are errors. Its
// credentials directory is relative to the working directory (LoadSpec
// makes it relative to the file's).
func ParseSpec(b []byte) (*Spec, error) {
	var s Spec
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidSpec, err)
	}
	s.setDefaults()
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

func (s *Spec) setDefaults() {
	if s.Partitions == 0 {
		s.Partitions = events.DefaultPartitions
	}
}

// Validate reports every rule the spec breaks, joined; each wraps
// ErrInvalidSpec.
func (s *Spec) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", ErrInvalidSpec, fmt.Sprintf(format, a...)))
	}
	if len(s.Tenants) == 0 {
		bad("tenants: name at least one tenant")
	}
	seen := map[string]bool{}
	for _, t := range s.Tenants {
		switch {
		case !events.ValidToken(t) || strings.HasPrefix(t, "_"):
			bad("tenant %q: want 1-%d characters of [A-Za-z0-9_-], not starting with _", t, events.MaxTokenLen)
		case slices.Contains(reserved, t):
			bad("tenant %q: the name is taken by Turnstone's own user of that role", t)
		case seen[t]:
			bad("tenant %q: named twice", t)
		}
		seen[t] = true
	}
	if s.Partitions < 1 || s.Partitions > 1024 {
		bad("partitions: want 1 to 1024 (the event stream's partition count), got %d", s.Partitions)
	}
	for _, u := range s.Users {
		switch {
		case !events.ValidToken(u.Name):
			bad("user %q: the name must be 1-%d characters of [A-Za-z0-9_-]", u.Name, events.MaxTokenLen)
		case seen[u.Name] || slices.Contains(reserved, u.Name):
			bad("user %q: the name is taken (by a tenant, a default user or another user)", u.Name)
		}
		seen[u.Name] = true
		switch u.Role {
		case RoleOperator, RoleEngine, RoleWorker:
			if u.Tenant != "" {
				bad("user %q: tenant is for role tenant only", u.Name)
			}
		case RoleTenant:
			if !slices.Contains(s.Tenants, u.Tenant) {
				bad("user %q: tenant %q is not one of the spec's tenants", u.Name, u.Tenant)
			}
		default:
			bad("user %q: role %q is not one of operator, engine, worker, tenant", u.Name, u.Role)
		}
	}
	return errors.Join(errs...)
}

// CredentialsDir is the absolute directory of the seed files: the spec's
// credentials (relative to the spec file), else <data>/credentials
// (UseDataDir), else StateDir()/credentials; "" when none can be named
// (no home directory: EnsureKeys says so).
func (s *Spec) CredentialsDir() string {
	switch {
	case s.Credentials == "" && s.dataDir != "":
		d, _ := filepath.Abs(filepath.Join(s.dataDir, "credentials"))
		return d
	case s.Credentials == "":
		d, err := StateDir()
		if err != nil {
			return ""
		}
		return filepath.Join(d, "credentials")
	case filepath.IsAbs(s.Credentials) || s.dir == "":
		d, _ := filepath.Abs(s.Credentials)
		return d
	}
	return filepath.Join(s.dir, s.Credentials)
}

// AllUsers returns every user of the spec: operator, engine, worker, one
// per tenant (named as the tenant), then Users, in that order.
func (s *Spec) AllUsers() []User {
	out := []User{{Name: "operator", Role: RoleOperator}, {Name: "engine", Role: RoleEngine}, {Name: "worker", Role: RoleWorker}}
	for _, t := range s.Tenants {
		out = append(out, User{Name: t, Role: RoleTenant, Tenant: t})
	}
	return append(out, s.Users...)
}

// SeedFile is the path of user's seed file: <credentials>/<user>.nk.
func (s *Spec) SeedFile(user string) string {
	return filepath.Join(s.CredentialsDir(), user+".nk")
}
