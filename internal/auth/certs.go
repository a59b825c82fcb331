package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// The files WriteCerts writes in its directory.
const (
	// CAFile is the self-signed CA's certificate (PEM, mode 0644): give
	// it to every client (--tls-ca) to check the server's certificate.
	CAFile = "ca.pem"
	// ServerCertFile is the server's certificate, signed by the CA (PEM,
	// mode 0644): nats-server --tlscert.
	ServerCertFile = "server.pem"
	// ServerKeyFile is the server certificate's private key (PEM, mode
	// 0600): nats-server --tlskey.
	ServerKeyFile = "server-key.pem"
)

// DefaultCertValidity is how long the certificates WriteCerts makes are
// valid when CertConfig.ValidFor is zero: one year.
const DefaultCertValidity = 365 * 24 * time.Hour

// certRenewBefore: WriteCerts replaces certificates that expire sooner.
const certRenewBefore = 30 * 24 * time.Hour

// ErrInvalidCertConfig wraps every rule a CertConfig breaks.
var ErrInvalidCertConfig = errors.New("invalid certificate config")

// CertConfig says which certificates WriteCerts makes: a self-signed CA
// and a server certificate it signs, for nats-server's client port when
// no other CA is at hand (docker-compose.yml; `engine auth certs`).
type CertConfig struct {
	// Dir is the directory of the files (CAFile, ServerCertFile,
	// ServerKeyFile), created (mode 0755) when missing. Required.
	Dir string
	// Hosts are the DNS names and IP addresses clients reach the server
	// by, each a subject alternative name of the server's certificate.
	// At least one.
	Hosts []string
	// ValidFor is how long the certificates are valid from now; default
	// DefaultCertValidity.
	ValidFor time.Duration
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

func (c *CertConfig) setDefaults() {
	if c.ValidFor == 0 {
		c.ValidFor = DefaultCertValidity
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports every rule the config breaks, joined, each wrapping
// ErrInvalidCertConfig.
func (c CertConfig) Validate() error {
	var errs []error
	if c.Dir == "" {
		errs = append(errs, fmt.Errorf("%w: no directory", ErrInvalidCertConfig))
	}
	if len(c.Hosts) == 0 {
		errs = append(errs, fmt.Errorf("%w: no hosts: name at least one host clients connect to", ErrInvalidCertConfig))
	}
	for _, h := range c.Hosts {
		if h == "" {
			errs = append(errs, fmt.Errorf("%w: an empty host", ErrInvalidCertConfig))
		}
	}
	if c.ValidFor < 0 {
		errs = append(errs, fmt.Errorf("%w: negative validity %s", ErrInvalidCertConfig, c.ValidFor))
	}
	return errors.Join(errs...)
}

// WriteCerts makes sure cfg.Dir holds a CA certificate and a server
// certificate signed by it for cfg.Hosts. Files that already cover every
// host and stay valid for 30 more days are kept (created is false), so it
// can run at every start; otherwise a new CA and server certificate are
// written (created is true) and clients need the new CAFile. The CA's
// private key is never written: nobody can sign another certificate with
// it afterwards. Errors: an invalid cfg (ErrInvalidCertConfig), a
// directory or file that cannot be written.
func WriteCerts(cfg CertConfig) (created bool, err error) {
	if err := cfg.Validate(); err != nil {
		return false, err
	}
	cfg.setDefaults()
	now := cfg.Now()
	if certsCover(cfg.Dir, cfg.Hosts, now.Add(certRenewBefore)) {
		return false, nil
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return false, fmt.Errorf("certificates: %w", err)
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return false, fmt.Errorf("certificates: %w", err)
	}
	ca := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: "Turnstone NATS CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(cfg.ValidFor),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return false, fmt.Errorf("certificates: CA: %w", err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return false, fmt.Errorf("certificates: %w", err)
	}
	srv := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: cfg.Hosts[0]},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(cfg.ValidFor),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range cfg.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			srv.IPAddresses = append(srv.IPAddresses, ip)
		} else {
			srv.DNSNames = append(srv.DNSNames, h)
		}
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return false, fmt.Errorf("certificates: server: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		return false, fmt.Errorf("certificates: %w", err)
	}
	// The key first, the CA last: a reader that finds the CA finds a
	// server certificate it signed.
	for _, f := range []struct {
		name string
		typ  string
		der  []byte
		mode os.FileMode
	}{
		{ServerKeyFile, "EC PRIVATE KEY", keyDER, 0o600},
		{ServerCertFile, "CERTIFICATE", srvDER, 0o644},
		{CAFile, "CERTIFICATE", caDER, 0o644},
	} {
		if err := writeFileAtomic(filepath.Join(cfg.Dir, f.name), pem.EncodeToMemory(&pem.Block{Type: f.typ, Bytes: f.der}), f.mode); err != nil {
			return false, fmt.Errorf("certificates: %w", err)
		}
	}
	return true, nil
}

// certsCover reports whether dir holds the three files, the server
// certificate is signed by the CA, names every host and is valid at
// until.
func certsCover(dir string, hosts []string, until time.Time) bool {
	read := func(name string) *x509.Certificate {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return nil
		}
		blk, _ := pem.Decode(b)
		if blk == nil {
			return nil
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil
		}
		return c
	}
	ca, srv := read(CAFile), read(ServerCertFile)
	if ca == nil || srv == nil {
		return false
	}
	if _, err := os.Stat(filepath.Join(dir, ServerKeyFile)); err != nil {
		return false
	}
	if srv.CheckSignatureFrom(ca) != nil || until.After(srv.NotAfter) || until.After(ca.NotAfter) {
		return false
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			if !slices.ContainsFunc(srv.IPAddresses, ip.Equal) {
				return false
			}
		} else if !slices.Contains(srv.DNSNames, h) {
			return false
		}
	}
	return true
}

// serial is a random 128-bit certificate serial number.
func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

// writeFileAtomic writes b to path through a temporary file in the same
// directory renamed over it, so a reader sees the old file or the new one.
func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
