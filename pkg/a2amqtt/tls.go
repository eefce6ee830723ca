package a2amqtt

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"sync"
)

// Environment variables every a2a-fleet component reads for TLS to the broker (TLSFilesFromEnv).
const (
	EnvTLSCA   = "A2A_TLS_CA"
	EnvTLSCert = "A2A_TLS_CERT"
	EnvTLSKey  = "A2A_TLS_KEY"
)

// TLSFiles names PEM files for a TLS connection to the broker. All are optional: without CA the
// system roots verify the broker; without Cert/Key no client certificate is offered (both or
// neither). The client certificate and the CA bundle are re-read from disk at every TLS
// handshake, so a rotated certificate or CA (cert-manager, a renewed Secret volume) is used at
// the next reconnect without a restart.
type TLSFiles struct {
	CA   string
	Cert string
	Key  string
	// ServerName overrides the name the broker's certificate is verified against (default: the
	// broker URL's host).
	ServerName string
	// InsecureSkipVerify does not verify the broker's certificate (tests only).
	InsecureSkipVerify bool
}

// TLSFilesFromEnv reads A2A_TLS_CA, A2A_TLS_CERT and A2A_TLS_KEY.
func TLSFilesFromEnv() TLSFiles {
	return TLSFiles{CA: os.Getenv(EnvTLSCA), Cert: os.Getenv(EnvTLSCert), Key: os.Getenv(EnvTLSKey)}
}

// IsZero reports whether nothing is set.
func (f TLSFiles) IsZero() bool {
	return f.CA == "" && f.Cert == "" && f.Key == "" && f.ServerName == "" && !f.InsecureSkipVerify
}

// TLSConfig builds a *tls.Config from the files (TLS 1.2 or newer). It fails with an error
// naming the file and the problem: unreadable, no PEM certificate in the CA bundle, a
// certificate without its key (or the reverse), a key that does not match the certificate.
// Every a2a-fleet component (SDK agents, a2actl, the conversation service, the operator's
// broker clients, devstack) builds its broker TLS settings with it: it is the only place that
// reads TLS files.
//
// Both files are read again at every handshake (a connection or a reconnect): the client
// certificate through GetClientCertificate, the CA bundle in VerifyConnection (the config's
// own verification is replaced by the same x509 verification against the bundle read then).
// When a file is momentarily unreadable or inconsistent (a rotation writes the certificate and
// the key one after the other) the last good one is used.
func (f TLSFiles) TLSConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CA != "" {
		roots, err := readCAFile(f.CA)
		if err != nil {
			return nil, err
		}
		cas := &reloader[*x509.CertPool]{last: roots, load: func() (*x509.CertPool, error) { return readCAFile(f.CA) }}
		// Verification moves to VerifyConnection, which reads the bundle per handshake.
		cfg.InsecureSkipVerify = true //nolint:gosec // verified in VerifyConnection
		cfg.VerifyConnection = func(cs tls.ConnectionState) error { return verifyBroker(cs, cas.get(), f.ServerName) }
	}
	if f.InsecureSkipVerify {
		cfg.InsecureSkipVerify = true //nolint:gosec // opt-in, tests only
		cfg.VerifyConnection = nil
	}
	switch {
	case f.Cert == "" && f.Key == "":
	case f.Cert == "":
		return nil, fmt.Errorf("a2amqtt: client key %s given without a client certificate (%s)", f.Key, EnvTLSCert)
	case f.Key == "":
		return nil, fmt.Errorf("a2amqtt: client certificate %s given without its key (%s)", f.Cert, EnvTLSKey)
	default:
		kp, err := readKeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, err
		}
		pairs := &reloader[*tls.Certificate]{last: kp, load: func() (*tls.Certificate, error) { return readKeyPair(f.Cert, f.Key) }}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return pairs.get(), nil }
	}
	return cfg, nil
}

func readCAFile(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("a2amqtt: broker CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("a2amqtt: broker CA file %s holds no PEM certificate", path)
	}
	return pool, nil
}

func readKeyPair(cert, key string) (*tls.Certificate, error) {
	kp, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("a2amqtt: client certificate %s / key %s: %w", cert, key, err)
	}
	return &kp, nil
}

// verifyBroker is crypto/tls's own verification of the broker's chain and name, against roots.
func verifyBroker(cs tls.ConnectionState, roots *x509.CertPool, serverName string) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("a2amqtt: the broker sent no certificate")
	}
	if serverName == "" {
		serverName = cs.ServerName // the SNI: empty for an IP address
	}
	if serverName == "" {
		return errors.New("a2amqtt: no name to verify the broker's certificate against: set TLSFiles.ServerName, or build the config with BrokerTLS")
	}
	opts := x509.VerifyOptions{Roots: roots, DNSName: serverName, Intermediates: x509.NewCertPool()}
	for _, c := range cs.PeerCertificates[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := cs.PeerCertificates[0].Verify(opts); err != nil {
		return fmt.Errorf("a2amqtt: broker certificate: %w", err)
	}
	return nil
}

// reloader re-reads a file-backed value at every use and keeps the last good one when the files
// are momentarily unreadable or inconsistent.
type reloader[T any] struct {
	mu   sync.Mutex
	last T
	load func() (T, error)
}

func (r *reloader[T]) get() T {
	r.mu.Lock()
	defer r.mu.Unlock()
	if v, err := r.load(); err == nil {
		r.last = v
	}
	return r.last
}

// isTLSScheme reports whether a broker URL scheme is TLS.
func isTLSScheme(scheme string) bool {
	switch scheme {
	case "tls", "ssl", "mqtts", "wss":
		return true
	}
	return false
}

// BrokerTLS is the TLS configuration of a connection to brokerURL built from f (TLSConfig),
// with ServerName defaulting to the URL's host: nil for a plaintext URL, an error when f names
// TLS material for one (refused rather than silently unused).
func BrokerTLS(brokerURL string, f TLSFiles) (*tls.Config, error) {
	u, err := url.Parse(brokerURL)
	if err != nil {
		return nil, fmt.Errorf("a2amqtt: broker URL: %w", err)
	}
	if !isTLSScheme(u.Scheme) {
		if !f.IsZero() {
			return nil, fmt.Errorf("a2amqtt: TLS settings given but broker URL %s is plaintext (%s://); use mqtts://", u.Redacted(), u.Scheme)
		}
		return nil, nil
	}
	if f.ServerName == "" {
		f.ServerName = u.Hostname()
	}
	return f.TLSConfig()
}

// brokerTLS resolves the TLS settings of a connection: TLSConfig or TLSFiles, only for a TLS
// URL. TLS material with a plaintext URL is refused rather than silently unused.
func brokerTLS(u *url.URL, cfg Config) (*tls.Config, error) {
	if cfg.TLSConfig != nil && !cfg.TLSFiles.IsZero() {
		return nil, errors.New("a2amqtt: set Config.TLSConfig or Config.TLSFiles, not both")
	}
	if cfg.TLSConfig != nil {
		if !isTLSScheme(u.Scheme) {
			return nil, fmt.Errorf("a2amqtt: TLS settings given but broker URL %s is plaintext (%s://); use mqtts://", u.Redacted(), u.Scheme)
		}
		return cfg.TLSConfig, nil
	}
	return BrokerTLS(u.String(), cfg.TLSFiles)
}
