package test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/turnstone-dev/turnstone/internal/auth/authtest"
	"github.com/turnstone-dev/turnstone/internal/cli"
	"github.com/turnstone-dev/turnstone/internal/embedded"
)

// writeCert writes a certificate (signed by parent, or self-signed when
// parent is nil) and its key as PEM files in dir, named name.pem and
// name-key.pem.
func writeCert(t *testing.T, dir, name string, tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+"-key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// TestAuthMutualTLS: with --tls-cert, --tls-key and --tls-ca on the
// embedded server, a client with its nkey, a certificate of the CA and
// the CA to check the server connects (cli.ClientConfig, the flags of
// every command); without a client certificate, or without the CA that
// signed the server's, it is refused.
func TestAuthMutualTLS(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	now := time.Now()
	ca, caKey := writeCert(t, dir, "ca", &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "turnstone test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}, nil, nil)
	writeCert(t, dir, "server", &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca, caKey)
	writeCert(t, dir, "client", &x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "acme"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, ca, caKey)
	p := func(name string) string { return filepath.Join(dir, name) }

	srv := authtest.Start(t, []string{"acme"}, "", func(c *embedded.Config) {
		c.TLS = embedded.TLSConfig{Cert: p("server.pem"), Key: p("server-key.pem"), CA: p("ca.pem")}
	})
	url := srv.ClientURL() // tls://127.0.0.1:<port>
	connect := func(cfg cli.ClientConfig) error {
		opts, err := cfg.Options()
		if err != nil {
			return err
		}
		nc, err := nats.Connect(url, append(opts, nats.Timeout(2*time.Second), nats.NoReconnect())...)
		if err == nil {
			nc.Close()
		}
		return err
	}
	full := cli.ClientConfig{Nkey: srv.Spec.SeedFile("acme"), TLSCert: p("client.pem"), TLSKey: p("client-key.pem"), TLSCA: p("ca.pem")}
	if err := connect(full); err != nil {
		t.Fatalf("nkey, client certificate and CA: %v", err)
	}
	noCert := full
	noCert.TLSCert, noCert.TLSKey = "", ""
	if err := connect(noCert); err == nil {
		t.Fatal("without a client certificate: connected, want refused (mutual TLS)")
	}
	noCA := full
	noCA.TLSCA = ""
	if err := connect(noCA); err == nil {
		t.Fatal("without the CA of the server's certificate: connected, want refused")
	}
	noKey := full
	noKey.Nkey = ""
	if err := connect(noKey); err == nil {
		t.Fatal("certificate but no nkey: connected, want refused (auth is the nkey's)")
	}
}
