package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/brokers"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/embedded"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/a2amqtttest"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// TestClientCertificateRotation: the operator's broker connections and the conversation
// service connect over TLS with client certificates from files (as cert-manager mounts them).
// The certificates are replaced on disk by ones from another CA, and the broker from then on
// trusts only that CA; at their next reconnect both must present the new certificate, without a
// restart. Before a2amqtt.BrokerTLS both loaded the certificate once and could never reconnect
// (the same happens at the first reconnect after a certificate expires). Mosquitto: its TLS
// listener requires client certificates, and a restart makes everyone reconnect; the embedded
// broker: its TLS listener reads the trusted client CA per handshake, records who presented
// which certificate, and ends every connection.
func TestClientCertificateRotation(t *testing.T) {
	for _, kind := range []string{"mosquitto", "embedded"} {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			testRotation(t, ctx, kind)
		})
	}
}

// rotationPKI is the certificates of the test: the broker's (from first), the clients' files
// (first's at the start), and the file of the client CA the broker trusts.
type rotationPKI struct {
	first, second *a2amqtttest.PKI
	dir           string
}

func (p *rotationPKI) clientCAFile() string { return filepath.Join(p.dir, "clients-ca.pem") }

func (p *rotationPKI) files(name string) a2amqtt.TLSFiles {
	return a2amqtt.TLSFiles{CA: p.first.CAFile(), Cert: filepath.Join(p.dir, name+".pem"), Key: filepath.Join(p.dir, name+"-key.pem")}
}

// install writes name's certificate and key, issued by ca, where the clients read them, each
// file replaced in one rename as a Secret volume update does.
func (p *rotationPKI) install(t *testing.T, ca *a2amqtttest.PKI, name string) {
	t.Helper()
	cert, key := ca.Issue(t, name, false)
	f := p.files(name)
	copyFile(t, cert, f.Cert)
	copyFile(t, key, f.Key)
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	tmp := to + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, to); err != nil {
		t.Fatal(err)
	}
}

func testRotation(t *testing.T, ctx context.Context, kind string) {
	p := &rotationPKI{first: a2amqtttest.NewPKI(t, "first-ca"), second: a2amqtttest.NewPKI(t, "second-ca"), dir: t.TempDir()}
	copyFile(t, p.first.CAFile(), p.clientCAFile())
	p.install(t, p.first, "operator")
	p.install(t, p.first, "service")
	opTLS, err := a2amqtt.BrokerTLS("mqtts://127.0.0.1", p.files("operator"))
	if err != nil {
		t.Fatal(err)
	}

	ns := cp.NewNamespace(t, ctx, "tls-")
	cp.BindNamespace(t, ctx, ns, "acme")
	secretKey := client.ObjectKey{Namespace: ns, Name: "conversation-service-credentials"}
	op := testenv.Operator{Namespaces: map[string]string{"acme": ns}, Controllers: controllers.Options{Gating: true},
		Broker: registration.BrokerConfig{TLS: opTLS, ServiceSecret: &secretKey}}

	var rotate func()
	presented := &handshakes{seen: map[string]bool{}}
	switch kind {
	case "mosquitto":
		serverCert, serverKey := p.first.Issue(t, "broker", true)
		port := brokertest.FreePort(t)
		m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{DynSec: &brokertest.DynSecOptions{}, ExtraConfig: fmt.Sprintf(
			"listener %d 127.0.0.1\ncafile %s\ncertfile %s\nkeyfile %s\nrequire_certificate true\n",
			port, p.clientCAFile(), serverCert, serverKey)})
		user, pass := m.DynSecAdmin()
		op.Broker.URL = fmt.Sprintf("mqtts://127.0.0.1:%d", port)
		op.Admin = &brokers.Config{Kind: brokers.Dynsec, Username: user, Password: pass}
		rotate = func() {
			// Down first, so that nobody's old connection outlives the switch.
			m.Stop()
			p.rotate(t)
			if err := m.Restart(); err != nil {
				t.Fatal(err)
			}
		}
	case "embedded":
		serverCert, serverKey := p.first.Issue(t, "broker", true)
		pair, err := tls.LoadX509KeyPair(serverCert, serverKey)
		if err != nil {
			t.Fatal(err)
		}
		srv, err := embedded.Start(embedded.Config{Addr: "127.0.0.1:0", TLS: presented.serverTLS(t, pair, p.clientCAFile())})
		if err != nil {
			t.Fatalf("start embedded broker: %v", err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		op.Broker.URL, op.Broker.Backend = "mqtts://"+srv.Addr(), srv.Backend()
		rotate = func() {
			p.rotate(t)
			for _, cl := range srv.Mochi().Clients.GetAll() {
				if !cl.Net.Inline {
					_ = srv.Mochi().DisconnectClient(cl, packets.ErrAdministrativeAction)
				}
			}
		}
	}
	run := cp.StartOperatorWith(t, ctx, op)
	eventually(t, 30*time.Second, "operator connected over TLS", func() error { return run.Broker.Healthy(0) })
	s := &corev1.Secret{}
	eventually(t, 30*time.Second, "service credentials", func() error { return k8s.Get(ctx, secretKey, s) })
	svcFiles := p.files("service")
	svc, err := convservice.Start(ctx, convservice.Config{
		BrokerURL: op.Broker.URL, Username: string(s.Data["username"]), Password: string(s.Data["password"]),
		TLSCAFile: svcFiles.CA, TLSCertFile: svcFiles.Cert, TLSKeyFile: svcFiles.Key,
		ReplicaID: "tls-0", Store: "bolt:" + filepath.Join(t.TempDir(), "state.db"), BoltNoSync: true,
		RestConfig: restCfg, Namespace: ns, Logger: serviceLogger(t), ReadinessGrace: time.Nanosecond,
	})
	if err != nil {
		t.Fatalf("start conversation service: %v", err)
	}
	t.Cleanup(func() { _ = svc.Close() })
	eventually(t, 30*time.Second, "service connected over TLS", func() error { return svc.Ready(ctx) })
	if kind == "embedded" && (!presented.saw("operator", "first-ca") || !presented.saw("service", "first-ca")) {
		t.Fatalf("handshakes before the rotation: %v", presented.list())
	}

	rotate()
	eventually(t, 60*time.Second, "operator and service reconnected with the new certificates", func() error {
		if kind == "embedded" && (!presented.saw("operator", "second-ca") || !presented.saw("service", "second-ca")) {
			return fmt.Errorf("client certificates presented so far: %v", presented.list())
		}
		if err := run.Broker.Healthy(0); err != nil {
			return fmt.Errorf("operator: %w", err)
		}
		if err := svc.Ready(ctx); err != nil {
			return fmt.Errorf("service: %w", err)
		}
		return nil
	})
}

// rotate replaces both clients' certificates with the second CA's, then makes the broker trust
// only that CA.
func (p *rotationPKI) rotate(t *testing.T) {
	t.Helper()
	p.install(t, p.second, "operator")
	p.install(t, p.second, "service")
	copyFile(t, p.second.CAFile(), p.clientCAFile())
}

// handshakes records the client certificates the embedded broker accepted (subject and issuer).
type handshakes struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (h *handshakes) saw(subject, issuer string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen[subject+" by "+issuer]
}

func (h *handshakes) list() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for k := range h.seen {
		out = append(out, k)
	}
	return out
}

// serverTLS requires a client certificate from the CA in caFile, read at every handshake.
func (h *handshakes) serverTLS(t *testing.T, pair tls.Certificate, caFile string) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair},
			ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool,
			VerifyConnection: func(cs tls.ConnectionState) error {
				c := cs.PeerCertificates[0]
				h.mu.Lock()
				h.seen[c.Subject.CommonName+" by "+c.Issuer.CommonName] = true
				h.mu.Unlock()
				return nil
			}}, nil
	}}
}
