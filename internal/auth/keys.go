package auth

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"

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
