package convservice

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// clientRef is the MQTT identity a replica connects as. Its client id is
// a2a-fleet/system/conversation-service-<token>, where token is an HMAC of
// the replica id under the route secret: stable across restarts of the same
// replica (its persistent session survives them) and not derivable from
// anything an agent sees (the replica id is in every forwarded Response
// Topic), so no client can take the replica's session over by connecting
// with its client id. The operator also reserves org a2a-fleet, so no Agent
// can claim any id under it.
func clientRef(secret []byte, replica string) a2amqtt.AgentRef {
	m := hmac.New(sha256.New, []byte("a2a-fleet conversation-service client id"))
	m.Write(secret)
	m.Write([]byte{0})
	m.Write([]byte(replica))
	return a2amqtt.AgentRef{
		Org: identity.Service.Org, Unit: identity.Service.Unit,
		Agent: identity.Service.Agent + "-" + hex.EncodeToString(m.Sum(nil)[:16]),
	}
}

// tlsConfig builds the broker connection's TLS settings from the config's
// files; nil when none is set (the URL scheme still selects TLS with the
// system roots).
func tlsConfig(cfg Config) (*tls.Config, error) {
	if cfg.TLSCAFile == "" && cfg.TLSCertFile == "" && cfg.TLSKeyFile == "" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.TLSCAFile != "" {
		pem, err := os.ReadFile(cfg.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("broker CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("broker CA file %s: no PEM certificate found", cfg.TLSCAFile)
		}
		c.RootCAs = pool
	}
	if (cfg.TLSCertFile == "") != (cfg.TLSKeyFile == "") {
		return nil, errors.New("broker client certificate and key must be given together")
	}
	if cfg.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCertFile, cfg.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("broker client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}
