package a2amqtt_test

import (
	"bytes"
	"crypto/tls"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/a2amqtttest"
)

// TestTLSMutualAuthentication: an agent and a requester reach each other through Mosquitto's
// TLS listener with client certificates built from PEM files (TLSFiles); every misconfiguration
// fails at Connect with an error that names the problem.
func TestTLSMutualAuthentication(t *testing.T) {
	pki := a2amqtttest.NewPKI(t, "a2a-fleet test CA")
	m, url := a2amqtttest.StartTLSMosquitto(t, pki)
	agentCert, agentKey := pki.Issue(t, "agent-b", false)
	callerCert, callerKey := pki.Issue(t, "agent-a", false)

	agent, err := agents.Start(tctx(t, 10*time.Second), agents.KindEcho, agents.Options{
		BrokerURL: url, Agent: bRef, Logger: quiet(),
		TLS: a2amqtt.TLSFiles{CA: pki.CAFile(), Cert: agentCert, Key: agentKey},
	})
	if err != nil {
		t.Fatalf("agent over TLS: %v\n%s", err, m.Log())
	}
	t.Cleanup(func() { _ = agent.Close(tctx(t, 5*time.Second)) })

	t.Setenv(a2amqtt.EnvTLSCA, pki.CAFile())
	t.Setenv(a2amqtt.EnvTLSCert, callerCert)
	t.Setenv(a2amqtt.EnvTLSKey, callerKey)
	conn, err := a2amqtt.Connect(tctx(t, 10*time.Second), a2amqtt.Config{BrokerURL: url, Agent: aRef, TLSFiles: a2amqtt.TLSFilesFromEnv(), Logger: quiet()})
	if err != nil {
		t.Fatalf("requester over TLS (A2A_TLS_* env): %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(tctx(t, 5*time.Second)) })
	req, err := a2amqtt.NewRequester(tctx(t, 5*time.Second), conn, a2amqtt.RequesterOptions{Retry: fast})
	if err != nil {
		t.Fatal(err)
	}
	res, err := req.Transport(bRef).SendMessage(tctx(t, 10*time.Second), nil, userText("over tls"))
	if err != nil || a2amqtt.ResultText(res) != "echo: over tls" {
		t.Fatalf("round trip over TLS: %q %v", a2amqtt.ResultText(res), err)
	}

	other := a2amqtttest.NewPKI(t, "some other CA")
	strangerCert, strangerKey := other.Issue(t, "stranger", false)
	failing := []struct {
		name    string
		url     string
		files   a2amqtt.TLSFiles
		wantErr string
	}{
		{"no client certificate", url, a2amqtt.TLSFiles{CA: pki.CAFile()}, "certificate required"},
		{"broker not signed by the trusted CA", url, a2amqtt.TLSFiles{CA: other.CAFile(), Cert: callerCert, Key: callerKey}, "certificate signed by unknown authority"},
		{"client certificate from another CA", url, a2amqtt.TLSFiles{CA: pki.CAFile(), Cert: strangerCert, Key: strangerKey}, "unknown certificate authority"},
		{"TLS files with a plaintext URL", m.URL(), a2amqtt.TLSFiles{CA: pki.CAFile()}, "plaintext"},
		{"certificate without key", url, a2amqtt.TLSFiles{Cert: callerCert}, "without its key"},
		{"key without certificate", url, a2amqtt.TLSFiles{Key: callerKey}, "without a client certificate"},
		{"key of another certificate", url, a2amqtt.TLSFiles{Cert: callerCert, Key: agentKey}, "private key does not match"},
		{"CA file that is not PEM", url, a2amqtt.TLSFiles{CA: callerKey}, "holds no PEM certificate"},
		{"missing CA file", url, a2amqtt.TLSFiles{CA: pki.Path("nope.pem")}, "no such file"},
	}
	for _, tc := range failing {
		t.Run(tc.name, func(t *testing.T) {
			c, err := a2amqtt.Connect(tctx(t, 10*time.Second), a2amqtt.Config{
				BrokerURL: tc.url, Agent: a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "tls-probe"},
				TLSFiles: tc.files, ConnectTimeout: 2 * time.Second, FailFast: true, Logger: quiet(),
			})
			if err == nil {
				_ = c.Close(tctx(t, 2*time.Second))
				t.Fatal("connected; want an error")
			}
			// With TLS 1.3 the broker refuses a client certificate after the client finished its
			// side of the handshake; its alert can lose the race with the connection reset.
			clientCertRefused := strings.Contains(tc.wantErr, "certificate required") || strings.Contains(tc.wantErr, "unknown certificate authority")
			if clientCertRefused && strings.Contains(err.Error(), "connection reset by peer") {
				return
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %q does not mention %q", err, tc.wantErr)
			}
		})
	}
}

// TestTLSClientCertificateReload: a rotated client certificate (files rewritten in place) is
// what the next handshake presents, without rebuilding the config.
func TestTLSClientCertificateReload(t *testing.T) {
	pki := a2amqtttest.NewPKI(t, "rotation CA")
	cert, key := pki.Issue(t, "client", false)
	cfg, err := a2amqtt.TLSFiles{CA: pki.CAFile(), Cert: cert, Key: key}.TLSConfig()
	if err != nil {
		t.Fatal(err)
	}
	first, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil {
		t.Fatal(err)
	}
	// Rotate: a new key pair under the same names.
	newCert, newKey := pki.Issue(t, "client-next", false)
	for src, dst := range map[string]string{newCert: cert, newKey: key} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	second, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(first.Certificate[0], second.Certificate[0]) {
		t.Fatal("the handshake after a rotation still presents the old certificate")
	}
	// A half-written rotation (key no longer matching) keeps the last good pair.
	if err := os.WriteFile(key, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	third, err := cfg.GetClientCertificate(&tls.CertificateRequestInfo{})
	if err != nil || !bytes.Equal(third.Certificate[0], second.Certificate[0]) {
		t.Fatalf("half-written rotation: %v", err)
	}
}
