package auth

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"
)

// Keys are the users' public nkeys (U...), by user name, as the server
// configuration names them.
type Keys map[string]string

// EnsureKeys makes sure every user of the spec has a seed file
// (<credentials>/<user>.nk, mode 0600, in a directory of mode 0700): it
// reads the seeds that exist and generates the missing ones. It returns
// every user's public key and the names of the users whose seeds it
// created now. Re-running it keeps the keys there are; a user added to
// the spec gets a new one; deleting a seed file rotates that user's key
// (docs/security.md). Errors: the directory or a file cannot be read or
// written; a file that holds no user seed.
func EnsureKeys(s *Spec) (Keys, []string, error) {
	dir := s.CredentialsDir()
	if dir == "" {
		_, err := StateDir()
		return nil, nil, fmt.Errorf("credentials: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("credentials: %w", err)
	}
	keys := Keys{}
	var created []string
	for _, u := range s.AllUsers() {
		path := s.SeedFile(u.Name)
		pub, err := readSeed(path)
		if errors.Is(err, fs.ErrNotExist) {
			pub, err = writeSeed(path)
			created = append(created, u.Name)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("credentials of %s: %w", u.Name, err)
		}
		keys[u.Name] = pub
	}
	return keys, created, nil
}

// readSeed returns the public key of the user seed in path.
func readSeed(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	kp, err := nkeys.FromSeed(bytes.TrimSpace(b))
	if err != nil {
		return "", fmt.Errorf("%s: not an nkey seed: %w", path, err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return "", err
	}
	if !nkeys.IsValidPublicUserKey(pub) {
		return "", fmt.Errorf("%s: not a user seed (SU...)", path)
	}
	return pub, nil
}

// writeSeed creates a new user key pair, writes its seed to path (mode
// 0600, never over an existing file) and returns its public key.
func writeSeed(path string) (string, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", err
	}
	defer kp.Wipe()
	seed, err := kp.Seed()
	if err != nil {
		return "", err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	if _, err := f.Write(append(seed, '\n')); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return kp.PublicKey()
}

// WebTokenFile is the file of the web view's operator token:
// <credentials>/web.token (mode 0600).
func (s *Spec) WebTokenFile() string { return filepath.Join(s.CredentialsDir(), "web.token") }

// EnsureWebToken returns the operator's token for the web view (under
// auth the view and its JSON answer only requests that carry it:
// internal/web), reading it from WebTokenFile or, when the file is
// missing or rotate is set, writing a new one there: 32 random bytes,
// base64url. It reports whether it wrote one. Deleting the file (or
// `engine auth token --rotate`) rotates it; the engines read it at
// start.
func EnsureWebToken(s *Spec, rotate bool) (string, bool, error) {
	path := s.WebTokenFile()
	if s.CredentialsDir() == "" {
		_, err := StateDir()
		return "", false, fmt.Errorf("web token: %w", err)
	}
	if !rotate {
		b, err := os.ReadFile(path)
		if err == nil {
			if t := string(bytes.TrimSpace(b)); len(t) >= 32 {
				return t, false, nil
			}
			return "", false, fmt.Errorf("web token %s: shorter than 32 characters; delete it to make a new one", path)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", false, fmt.Errorf("web token: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", false, fmt.Errorf("web token: %w", err)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", false, fmt.Errorf("web token: %w", err)
	}
	t := base64.RawURLEncoding.EncodeToString(raw)
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(t+"\n"), 0o600); err != nil {
		return "", false, fmt.Errorf("web token: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", false, fmt.Errorf("web token: %w", err)
	}
	return t, true, nil
}
