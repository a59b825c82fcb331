package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// A context is a named set of connection settings (the server URL, the
// credentials and the TLS files), saved once and used by every command, as
// the `nats` CLI's contexts are: `engine context save NAME --nats-url ...
// --nkey ... --tls-ca ...`, then `engine context select NAME`. They live
// in the user's configuration directory (ContextDir), one JSON file each,
// readable by the user alone.

// EnvContext is the environment variable that names the context to use
// (the --context flag wins; without either, the selected one).
const EnvContext = "TURNSTONE_CONTEXT"

// Context errors.
var (
	// ErrNoContext: no context of that name is saved.
	ErrNoContext = errors.New("no such context")
	// ErrContextName: the name is not 1-64 characters of [A-Za-z0-9_.-]
	// (it names a file).
	ErrContextName = errors.New("invalid context name")
)

// Context is one saved context: the connection settings it gives the
// commands (empty fields give nothing). File paths are absolute (Save
// makes them so), so that a context works from any directory.
type Context struct {
	// Name is the context's name (its file's, not stored in it).
	Name string `json:"-"`
	// Description says what it is for, for people.
	Description string `json:"description,omitempty"`
	// URL is --nats-url: a server or a comma-separated cluster.
	URL string `json:"nats_url,omitempty"`
	// Creds, Nkey, TLSCert, TLSKey and TLSCA are the ClientConfig's
	// files.
	Creds   string `json:"creds,omitempty"`
	Nkey    string `json:"nkey,omitempty"`
	TLSCert string `json:"tls_cert,omitempty"`
	TLSKey  string `json:"tls_key,omitempty"`
	TLSCA   string `json:"tls_ca,omitempty"`
}

// ContextStore is the directory of saved contexts: Dir/context/NAME.json
// and Dir/context.txt, which names the selected one. Files are written with
// mode 0600 and directories with 0700: a context names credentials.
type ContextStore struct {
	// Dir is the store's directory (DefaultContextDir: the user's
	// configuration directory's "turnstone").
	Dir string
}

// DefaultContextDir is where contexts are kept: os.UserConfigDir()
// joined with "turnstone" ($XDG_CONFIG_HOME/turnstone, else
// ~/.config/turnstone on Linux; ~/Library/Application Support/turnstone
// on macOS). Errors: os.UserConfigDir's (no home directory).
func DefaultContextDir() (string, error) {
	d, err := os.UserConfigDir()
	if err != nil {
		return "", fmt.Errorf("contexts: %w", err)
	}
	return filepath.Join(d, "turnstone"), nil
}

// DefaultContextStore is the store at DefaultContextDir.
func DefaultContextStore() (ContextStore, error) {
	d, err := DefaultContextDir()
	return ContextStore{Dir: d}, err
}

var contextNameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$`)

// ValidContextName reports whether name can name a context: 1-64
// characters of [A-Za-z0-9_.-], not starting with a dot or a dash.
func ValidContextName(name string) bool { return contextNameRE.MatchString(name) }

func checkName(name string) error {
	if !ValidContextName(name) {
		return fmt.Errorf("%w %q: want 1-64 characters of [A-Za-z0-9_.-], not starting with . or -", ErrContextName, name)
	}
	return nil
}

func (s ContextStore) path(name string) string {
	return filepath.Join(s.Dir, "context", name+".json")
}

func (s ContextStore) selectedPath() string { return filepath.Join(s.Dir, "context.txt") }

// Save writes c under c.Name, replacing a context of that name. Relative
// file paths are made absolute first (from the working directory). The
// file is written with mode 0600. Errors: ErrContextName; a ClientConfig
// contradiction (both --creds and --nkey, a certificate without its key);
// the file system's.
func (s ContextStore) Save(c Context) (Context, error) {
	if err := checkName(c.Name); err != nil {
		return c, err
	}
	if err := c.client().Validate(); err != nil {
		return c, err
	}
	for _, p := range []*string{&c.Creds, &c.Nkey, &c.TLSCert, &c.TLSKey, &c.TLSCA} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return c, fmt.Errorf("context %s: %w", c.Name, err)
		}
		*p = abs
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return c, err
	}
	if err := os.MkdirAll(filepath.Dir(s.path(c.Name)), 0o700); err != nil {
		return c, fmt.Errorf("save context %s: %w", c.Name, err)
	}
	if err := writePrivate(s.path(c.Name), append(b, '\n')); err != nil {
		return c, fmt.Errorf("save context %s: %w", c.Name, err)
	}
	return c, nil
}

// writePrivate writes b to path with mode 0600 (also when the file was
// there with a wider mode), through a temporary file and a rename.
func writePrivate(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// Load reads the context name. Errors: ErrContextName; ErrNoContext
// (wrapped, naming it); a file that is not a context's JSON.
func (s ContextStore) Load(name string) (Context, error) {
	if err := checkName(name); err != nil {
		return Context{}, err
	}
	b, err := os.ReadFile(s.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return Context{}, fmt.Errorf("context %q: %w (engine context ls lists them)", name, ErrNoContext)
	}
	if err != nil {
		return Context{}, fmt.Errorf("context %q: %w", name, err)
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	var c Context
	if err := dec.Decode(&c); err != nil {
		return Context{}, fmt.Errorf("context %q (%s): %w", name, s.path(name), err)
	}
	c.Name = name
	return c, nil
}

// List returns the saved contexts, sorted by name. A store that does not
// exist yet holds none.
func (s ContextStore) List() ([]Context, error) {
	entries, err := os.ReadDir(filepath.Join(s.Dir, "context"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("contexts: %w", err)
	}
	var out []Context
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || e.IsDir() || !ValidContextName(name) {
			continue
		}
		c, err := s.Load(name)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Context) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Selected returns the name of the selected context ("" when none is).
func (s ContextStore) Selected() (string, error) {
	b, err := os.ReadFile(s.selectedPath())
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("selected context: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Select makes name the selected context; "" selects none. Errors:
// ErrNoContext when name is not saved.
func (s ContextStore) Select(name string) error {
	if name == "" {
		err := os.Remove(s.selectedPath())
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	if _, err := s.Load(name); err != nil {
		return err
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return fmt.Errorf("select context %s: %w", name, err)
	}
	return writePrivate(s.selectedPath(), []byte(name+"\n"))
}

// Remove deletes the context name (and unselects it when it was
// selected). Errors: ErrNoContext.
func (s ContextStore) Remove(name string) error {
	if _, err := s.Load(name); err != nil {
		return err
	}
	if err := os.Remove(s.path(name)); err != nil {
		return fmt.Errorf("remove context %s: %w", name, err)
	}
	if sel, _ := s.Selected(); sel == name {
		return s.Select("")
	}
	return nil
}

// client is the context's ClientConfig.
func (c Context) client() ClientConfig {
	return ClientConfig{Creds: c.Creds, Nkey: c.Nkey, TLSCert: c.TLSCert, TLSKey: c.TLSKey, TLSCA: c.TLSCA}
}
