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
// neither). The client certificate is re-read from disk at every TLS handshake, so a rotated
// certificate (cert-manager, a renewed Secret volume) is used at the next reconnect without a
// restart; the CA bundle is read once.
type TLSFiles struct {
	CA   string
	Cert string
	Key  string
	// ServerName overrides the name the broker's certificate is verified against (default: the
	// broker URL's host).
	ServerName string
}

// TLSFilesFromEnv reads A2A_TLS_CA, A2A_TLS_CERT and A2A_TLS_KEY.
func TLSFilesFromEnv() TLSFiles {
	return TLSFiles{CA: os.Getenv(EnvTLSCA), Cert: os.Getenv(EnvTLSCert), Key: os.Getenv(EnvTLSKey)}
}

// IsZero reports whether no file is named.
func (f TLSFiles) IsZero() bool { return f.CA == "" && f.Cert == "" && f.Key == "" }

// TLSConfig builds a *tls.Config from the files (TLS 1.2 or newer). It fails with an error
// naming the file and the problem: unreadable, no PEM certificate in the CA bundle, a
// certificate without its key (or the reverse), a key that does not match the certificate.
// Every a2a-fleet component (SDK agents, a2actl, the conversation service, the operator's
// broker clients, devstack) builds its broker TLS settings with it.
func (f TLSFiles) TLSConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("a2amqtt: broker CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("a2amqtt: broker CA file %s holds no PEM certificate", f.CA)
		}
		cfg.RootCAs = pool
	}
	switch {
	case f.Cert == "" && f.Key == "":
	case f.Cert == "":
		return nil, fmt.Errorf("a2amqtt: client key %s given without a client certificate (%s)", f.Key, EnvTLSCert)
	case f.Key == "":
		return nil, fmt.Errorf("a2amqtt: client certificate %s given without its key (%s)", f.Cert, EnvTLSKey)
	default:
		kp, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("a2amqtt: client certificate %s / key %s: %w", f.Cert, f.Key, err)
		}
		reload := &keyPairReloader{cert: f.Cert, key: f.Key, last: &kp}
		cfg.GetClientCertificate = reload.get
	}
	return cfg, nil
}

// keyPairReloader re-reads the client key pair at every handshake and keeps the last good one
// when the files are momentarily inconsistent (a rotation writes them one after the other).
type keyPairReloader struct {
	cert, key string
	mu        sync.Mutex
	last      *tls.Certificate
}

func (r *keyPairReloader) get(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if kp, err := tls.LoadX509KeyPair(r.cert, r.key); err == nil {
		r.last = &kp
	}
	return r.last, nil
}

// isTLSScheme reports whether a broker URL scheme is TLS.
func isTLSScheme(scheme string) bool {
	switch scheme {
	case "tls", "ssl", "mqtts", "wss":
		return true
	}
	return false
}

// brokerTLS resolves the TLS settings of a connection: TLSConfig or TLSFiles, only for a TLS
// URL. TLS material with a plaintext URL is refused rather than silently unused.
func brokerTLS(u *url.URL, cfg Config) (*tls.Config, error) {
	if cfg.TLSConfig != nil && !cfg.TLSFiles.IsZero() {
		return nil, errors.New("a2amqtt: set Config.TLSConfig or Config.TLSFiles, not both")
	}
	if !isTLSScheme(u.Scheme) {
		if cfg.TLSConfig != nil || !cfg.TLSFiles.IsZero() {
			return nil, fmt.Errorf("a2amqtt: TLS settings given but broker URL %s is plaintext (%s://); use mqtts://", u.Redacted(), u.Scheme)
		}
		return nil, nil
	}
	if cfg.TLSConfig != nil {
		return cfg.TLSConfig, nil
	}
	return cfg.TLSFiles.TLSConfig()
}
