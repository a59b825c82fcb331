package cli

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
)

// ClientConfig is how a Turnstone process or CLI command authenticates
// to the NATS server and checks its certificate: the client side of
// docs/security.md. The flag names follow the `nats` CLI's where it has
// them (--creds, --nkey; its --tlscert, --tlskey, --tlsca are spelled
// --tls-cert, --tls-key, --tls-ca here, as in `engine serve`). The zero
// value connects without credentials or TLS of its own (nats.go still
// speaks TLS to a server that requires it, checking the system's CAs).
type ClientConfig struct {
	// Creds is a NATS credentials file (a user JWT and its seed, from
	// `nsc` in decentralised JWT auth): nats.UserCredentials.
	Creds string
	// Nkey is a file holding a user's nkey seed (SU..., such as the
	// <credentials>/<user>.nk files `engine serve --auth` writes):
	// nats.NkeyOptionFromSeed.
	Nkey string
	// TLSCert and TLSKey are PEM files of the client's certificate and
	// key, for a server that requires mutual TLS: nats.ClientCert.
	TLSCert, TLSKey string
	// TLSCA is a PEM file of the certificate authorities that signed the
	// server's certificate: nats.RootCAs.
	TLSCA string
}

// Environment variables that give a ClientConfig's defaults (flags win).
const (
	EnvCreds   = "TURNSTONE_CREDS"
	EnvNkey    = "TURNSTONE_NKEY"
	EnvTLSCert = "TURNSTONE_TLS_CERT"
	EnvTLSKey  = "TURNSTONE_TLS_KEY"
	EnvTLSCA   = "TURNSTONE_TLS_CA"
)

// AddFlags adds --creds, --nkey, --tls-cert, --tls-key and --tls-ca to
// fs, their defaults from the environment (EnvCreds ...). certUsage and
// caUsage, when not empty, replace the help of --tls-cert/--tls-key and
// of --tls-ca (engine serve gives them the server's meaning too).
func (c *ClientConfig) AddFlags(fs *pflag.FlagSet, certUsage, caUsage string) {
	if certUsage == "" {
		certUsage = "PEM file of this client's certificate (mutual TLS; with --tls-key)"
	}
	if caUsage == "" {
		caUsage = "PEM file of the CAs that signed the NATS server's certificate (env " + EnvTLSCA + ")"
	}
	fs.StringVar(&c.Creds, "creds", os.Getenv(EnvCreds), "NATS credentials file (user JWT and seed) to authenticate with (env "+EnvCreds+")")
	fs.StringVar(&c.Nkey, "nkey", os.Getenv(EnvNkey), "file of the user nkey seed to authenticate with, such as credentials/<user>.nk written by engine serve --auth (env "+EnvNkey+")")
	fs.StringVar(&c.TLSCert, "tls-cert", os.Getenv(EnvTLSCert), certUsage+" (env "+EnvTLSCert+")")
	fs.StringVar(&c.TLSKey, "tls-key", os.Getenv(EnvTLSKey), "PEM file of the private key of --tls-cert (env "+EnvTLSKey+")")
	if !strings.Contains(caUsage, EnvTLSCA) {
		caUsage += " (env " + EnvTLSCA + ")"
	}
	fs.StringVar(&c.TLSCA, "tls-ca", os.Getenv(EnvTLSCA), caUsage)
}

// Validate reports every contradiction, joined: both --creds and --nkey,
// a certificate without its key or a key without its certificate.
func (c ClientConfig) Validate() error {
	var errs []error
	if c.Creds != "" && c.Nkey != "" {
		errs = append(errs, errors.New("--creds and --nkey: give one (a credentials file holds its own key)"))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key: give both or neither"))
	}
	return errors.Join(errs...)
}

// Authenticated reports whether the config names credentials.
func (c ClientConfig) Authenticated() bool { return c.Creds != "" || c.Nkey != "" }

// Options returns the nats.go connect options of the config. Errors: an
// invalid config; a seed file that cannot be read or holds no seed.
func (c ClientConfig) Options() ([]nats.Option, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var opts []nats.Option
	if c.Creds != "" {
		if _, err := os.Stat(c.Creds); err != nil {
			return nil, fmt.Errorf("--creds: %w", err)
		}
		opts = append(opts, nats.UserCredentials(c.Creds))
	}
	if c.Nkey != "" {
		o, err := nats.NkeyOptionFromSeed(c.Nkey)
		if err != nil {
			return nil, fmt.Errorf("--nkey %s: %w", c.Nkey, err)
		}
		opts = append(opts, o)
	}
	if c.TLSCert != "" {
		opts = append(opts, nats.ClientCert(c.TLSCert, c.TLSKey))
	}
	if c.TLSCA != "" {
		opts = append(opts, nats.RootCAs(c.TLSCA))
	}
	return opts, nil
}
