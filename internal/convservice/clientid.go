package convservice

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"

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
// files (a2amqtt.BrokerTLS: the client certificate and CA are re-read at every
// reconnect); nil for a plaintext broker URL.
func tlsConfig(cfg Config) (*tls.Config, error) {
	return a2amqtt.BrokerTLS(cfg.BrokerURL, a2amqtt.TLSFiles{CA: cfg.TLSCAFile, Cert: cfg.TLSCertFile, Key: cfg.TLSKeyFile})
}
