package auth_test

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/turnstone-dev/turnstone/internal/auth"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestWriteCerts: the server certificate verifies against the CA for
// every host (names and IPs) as a TLS client checks it; a second run
// keeps the files; a new host, or a certificate about to expire, gets a
// new CA and certificate; the key is private; a bad config is refused.
func TestWriteCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	hosts := []string{"nats-1", "localhost", "127.0.0.1"}
	created, err := auth.WriteCerts(auth.CertConfig{Dir: dir, Hosts: hosts})
	if err != nil || !created {
		t.Fatalf("first run: created %v, %v", created, err)
	}
	verify := func(host string) error {
		roots := x509.NewCertPool()
		roots.AddCert(readCert(t, filepath.Join(dir, auth.CAFile)))
		_, err := readCert(t, filepath.Join(dir, auth.ServerCertFile)).Verify(x509.VerifyOptions{DNSName: host, Roots: roots})
		return err
	}
	for _, h := range hosts {
		if err := verify(h); err != nil {
			t.Errorf("host %s: %v", h, err)
		}
	}
	if verify("nats-2") == nil {
		t.Error("nats-2 verified, but it is not one of the hosts")
	}
	if fi, err := os.Stat(filepath.Join(dir, auth.ServerKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("server key: %v, %v; want mode 0600", fi, err)
	}
	ca := readCert(t, filepath.Join(dir, auth.CAFile))

	if created, err := auth.WriteCerts(auth.CertConfig{Dir: dir, Hosts: hosts[:2]}); err != nil || created {
		t.Fatalf("second run with hosts it names: created %v, %v; want kept", created, err)
	}
	if !readCert(t, filepath.Join(dir, auth.CAFile)).Equal(ca) {
		t.Fatal("second run replaced the CA")
	}
	later := func() time.Time { return time.Now().Add(auth.DefaultCertValidity - 24*time.Hour) }
	if created, err := auth.WriteCerts(auth.CertConfig{Dir: dir, Hosts: hosts, Now: later}); err != nil || !created {
		t.Fatalf("a day before expiry: created %v, %v; want new certificates", created, err)
	}
	if created, err := auth.WriteCerts(auth.CertConfig{Dir: dir, Hosts: []string{"nats-2"}}); err != nil || !created {
		t.Fatalf("new host: created %v, %v; want new certificates", created, err)
	}
	if err := verify("nats-2"); err != nil {
		t.Fatalf("nats-2 after replacement: %v", err)
	}
	if readCert(t, filepath.Join(dir, auth.CAFile)).Equal(ca) {
		t.Fatal("new certificates with the old CA: its key was kept somewhere")
	}

	for _, bad := range []auth.CertConfig{{Hosts: hosts}, {Dir: dir}, {Dir: dir, Hosts: []string{""}}, {Dir: dir, Hosts: hosts, ValidFor: -time.Hour}} {
		if _, err := auth.WriteCerts(bad); !errors.Is(err, auth.ErrInvalidCertConfig) {
			t.Errorf("%+v: %v, want ErrInvalidCertConfig", bad, err)
		}
	}
}
