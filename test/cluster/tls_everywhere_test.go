package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// tlsEverywhereCAMount is where the samples' agent pods find the broker's CA (A2A_TLS_CA).
const tlsEverywhereCAMount = "/etc/a2a-fleet/broker-ca"

// config/quickstart with config/quickstart/tls-everywhere, as a user's overlay uses it: Mosquitto
// serves only its TLS listener, the operator, the conversation service and the example agents'
// pods connect over TLS and verify the broker with the CA, and the plain listener is closed. The
// agents becoming Ready and connected, a2actl (on this machine, over TLS through a NodePort)
// seeing their cards and a conversation through the conversation service prove every party's
// TLS link; a connection to the plain port is refused. The example agents get the CA from a
// Secret of their namespace mounted by their Agents' pod templates (A2A_TLS_CA), as a namespace
// owner provides it (docs/install.md, "TLS").
func TestQuickstartWithTLSEverywhereOnARealCluster(t *testing.T) {
	ctx := context.Background()
	uninstall(ctx, t)
	// A failure is dumped once, by the first cleanup that runs (before anything is deleted).
	dumped := false
	dump := func() {
		if t.Failed() && !dumped {
			dumped = true
			env.Dump(t, Namespace, samplesNamespace)
		}
	}
	t.Cleanup(func() { dump(); uninstall(context.Background(), t) })
	nodeIP, err := firstNodeIP(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The certificate names the Service (the in-cluster parties) and the node's address (a2actl
	// on this machine, through the NodePort).
	caPEM, certPEM, keyPEM := certificatesFor(t, []string{"a2a-fleet-mosquitto.a2a-fleet-system.svc", "a2a-fleet-mosquitto.a2a-fleet-system.svc.cluster.local"}, []net.IP{net.ParseIP(nodeIP)})
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tlsSecret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "a2a-fleet-mosquitto-tls", Namespace: Namespace},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{"ca.crt": caPEM, "tls.crt": certPEM, "tls.key": keyPEM},
	}
	if err := env.Client.Create(ctx, tlsSecret); err != nil {
		t.Fatal(err)
	}
	overlay, err := env.Kustomization(t.TempDir(), "config/quickstart", "config/quickstart/tls-everywhere")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.KubectlRun(ctx, "apply", "--server-side", "-k", overlay); err != nil {
		t.Fatal(err)
	}
	if err := env.WaitDeployments(ctx, Namespace, 5*time.Minute, "a2a-fleet-controller-manager", "a2a-fleet-conversation-service", "a2a-fleet-mosquitto"); err != nil {
		t.Fatal(err)
	}
	t.Run("every party is configured for TLS", func(t *testing.T) { tlsConfigured(ctx, t) })
	t.Run("the broker has no plain listener", func(t *testing.T) {
		pods, err := env.Pods(ctx, Namespace, "app.kubernetes.io/name=mosquitto")
		if err != nil || len(pods) != 1 {
			t.Fatalf("want 1 Mosquitto pod, got %d (%v)", len(pods), err)
		}
		out, err := env.Exec(ctx, Namespace, pods[0].Name, "mosquitto", "/bin/sh", "-c", "cat /mosquitto/listeners/*.conf")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "listener 1883") || !strings.Contains(out, "listener 8883") {
			t.Fatalf("the broker's listeners are not the TLS one alone:\n%s", out)
		}
	})

	// The example agents, with the CA from a Secret of their namespace.
	// A ConfigMap: the CA certificate is public, and the operator runs no workload that
	// references a Secret other than the Agent's own credentials.
	caConfigMap := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "a2a-fleet-broker-ca", Namespace: samplesNamespace}, Data: map[string]string{"ca.crt": string(caPEM)}}
	if err := env.Client.Create(ctx, caConfigMap); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { dump(); _ = env.Client.Delete(context.Background(), caConfigMap) })
	samples, err := samplesWithCA(t, caConfigMap.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.KubectlRun(ctx, "apply", "--server-side", "-n", samplesNamespace, "-k", samples); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dump()
		_, _ = env.KubectlRun(context.Background(), "delete", "-n", samplesNamespace, "-k", samples, "--ignore-not-found", "--wait=true", "--timeout=2m")
	})
	if _, err := env.WaitAgents(ctx, samplesNamespace, 4*time.Minute, true, sampleAgents...); err != nil {
		t.Fatal(err)
	}
	if _, err := env.WaitAgents(ctx, samplesNamespace, time.Minute, false, "console"); err != nil {
		t.Fatal(err)
	}
	for _, name := range sampleAgents {
		pods, err := env.Pods(ctx, samplesNamespace, "a2a.fleet.dev/agent="+name)
		if err != nil || len(pods) != 1 {
			t.Fatalf("Agent %s: want 1 ready pod, got %d (%v)", name, len(pods), err)
		}
		if broker := containerEnv(pods[0].Spec.Containers[0], "A2A_BROKER"); !strings.HasPrefix(broker, "tls://") {
			t.Errorf("Agent %s's pod connects to %q, not the TLS listener", name, broker)
		}
	}

	// This machine onto the bus over TLS: a NodePort to 8883, a2actl verifying with the CA.
	tlsPort, err := nodePort(ctx, t, "a2a-fleet-mosquitto-e2e-tls", 8883, dump)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("A2A_TLS_CA", caFile)
	b := &bus{broker: fmt.Sprintf("tls://%s:%d", nodeIP, tlsPort), console: t.TempDir()}
	console := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: samplesNamespace, Name: "console-mqtt-credentials"}, console); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"username", "password"} {
		if err := os.WriteFile(filepath.Join(b.console, key), console.Data[key], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b.checkCards(ctx, t)
	t.Run("chat through the conversation service", func(t *testing.T) { b.chatConfirm(ctx, t) })
	t.Run("the plain port refuses connections", func(t *testing.T) {
		plainPort, err := nodePort(ctx, t, "a2a-fleet-mosquitto-e2e-plain", 1883, dump)
		if err != nil {
			t.Fatal(err)
		}
		// The TLS port of the same pod answers, so a refusal on the plain one is the closed
		// listener, not an unreachable node.
		for _, c := range []struct {
			port int32
			open bool
		}{{tlsPort, true}, {plainPort, false}} {
			conn, err := net.DialTimeout("tcp", net.JoinHostPort(nodeIP, fmt.Sprint(c.port)), 5*time.Second)
			if conn != nil {
				conn.Close()
			}
			if (err == nil) != c.open {
				t.Errorf("NodePort %d (open: %v): dial error %v", c.port, c.open, err)
			}
		}
	})
	t.Run("no restarts, no RBAC refusals, one leader", func(t *testing.T) { healthy(ctx, t) })
}

// tlsConfigured checks the running Deployments: the operator administers the broker over
// tls:// with a CA file and gives the workloads a tls:// URL (its default: --broker-url), the
// conversation service connects over tls:// with a CA file.
func tlsConfigured(ctx context.Context, t *testing.T) {
	pods, err := env.Pods(ctx, Namespace, "app.kubernetes.io/component=operator")
	if err != nil || len(pods) == 0 {
		t.Fatalf("no operator pod: %v", err)
	}
	args := strings.Join(pods[0].Spec.Containers[0].Args, " ")
	if !strings.Contains(args, "--broker-url=tls://") || !strings.Contains(args, "--broker-ca-file=") || strings.Contains(args, "mqtt://") {
		t.Errorf("the operator is not configured for TLS to the broker: %s", args)
	}
	pods, err = env.Pods(ctx, Namespace, "app.kubernetes.io/name=conversation-service")
	if err != nil || len(pods) == 0 {
		t.Fatalf("no conversation service pod: %v", err)
	}
	c := pods[0].Spec.Containers[0]
	if broker, ca := containerEnv(c, "A2A_BROKER"), containerEnv(c, "A2A_TLS_CA_FILE"); !strings.HasPrefix(broker, "tls://") || ca == "" {
		t.Errorf("the conversation service is not configured for TLS: A2A_BROKER %q, A2A_TLS_CA_FILE %q", broker, ca)
	}
}

func containerEnv(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// samplesWithCA is config/samples-workloads (with the suite's images) whose example agents mount
// the ConfigMap caConfigMap and point A2A_TLS_CA at its ca.crt.
func samplesWithCA(t *testing.T, caConfigMap string) (string, error) {
	base, err := env.Kustomization(t.TempDir(), "config/samples-workloads")
	if err != nil {
		return "", err
	}
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, base)
	if err != nil {
		return "", err
	}
	var k strings.Builder
	fmt.Fprintf(&k, "resources:\n- %s\npatches:\n", rel)
	for _, name := range sampleAgents {
		fmt.Fprintf(&k, `- target: {kind: Agent, name: %s}
  patch: |-
    - {op: add, path: /spec/workload/template/spec/containers/0/env/-, value: {name: A2A_TLS_CA, value: %s/ca.crt}}
    - {op: add, path: /spec/workload/template/spec/containers/0/volumeMounts, value: [{name: broker-ca, mountPath: %s, readOnly: true}]}
    - {op: add, path: /spec/workload/template/spec/volumes, value: [{name: broker-ca, configMap: {name: %s}}]}
`, name, tlsEverywhereCAMount, tlsEverywhereCAMount, caConfigMap)
	}
	return dir, os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k.String()), 0o644)
}

// nodePort exposes Mosquitto's port target on a NodePort Service of the test's own (deleted at
// the end, after dump) and returns the node port.
func nodePort(ctx context.Context, t *testing.T, name string, target int32, dump func()) (int32, error) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace}}
	svc.Spec = corev1.ServiceSpec{
		Type:     corev1.ServiceTypeNodePort,
		Selector: map[string]string{"app.kubernetes.io/name": "mosquitto"},
		Ports:    []corev1.ServicePort{{Name: "mqtt", Port: target, TargetPort: intstr.FromInt32(target)}},
	}
	if err := env.Client.Create(ctx, svc); err != nil && !apierrors.IsAlreadyExists(err) {
		return 0, fmt.Errorf("create Service %s: %w", name, err)
	}
	t.Cleanup(func() { dump(); _ = env.Client.Delete(context.Background(), svc) })
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
		return 0, err
	}
	return svc.Spec.Ports[0].NodePort, nil
}

func firstNodeIP(ctx context.Context) (string, error) {
	nodes := &corev1.NodeList{}
	if err := env.Client.List(ctx, nodes); err != nil || len(nodes.Items) == 0 {
		return "", fmt.Errorf("list nodes: %v (%d)", err, len(nodes.Items))
	}
	for _, a := range nodes.Items[0].Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address, nil
		}
	}
	return "", fmt.Errorf("node %s has no InternalIP", nodes.Items[0].Name)
}

// certificatesFor makes a CA and a server certificate for the DNS names and addresses (PEM), as
// cert-manager would.
func certificatesFor(t *testing.T, names []string, ips []net.IP) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "a2a-fleet TLS-everywhere test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: names, IPAddresses: ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}
