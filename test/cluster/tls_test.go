package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// config/quickstart with its TLS component, as a user's overlay uses it: Mosquitto serves TLS on
// 8883 with the certificate of the Secret a2a-fleet-mosquitto-tls (cert-manager's keys, made here),
// and the operator administers it over tls:// with --broker-ca-file; the service and the agents
// stay on the plain listener. The agents becoming Ready and connected proves the operator's TLS
// connection (dynsec admin and card publisher) through the Service's DNS name.
func TestQuickstartWithTLSOnARealCluster(t *testing.T) {
	ctx := context.Background()
	t.Cleanup(func() {
		if t.Failed() {
			env.Dump(t, Namespace, samplesNamespace)
		}
	})
	uninstall(ctx, t)
	caPEM, certPEM, keyPEM := testCertificates(t, "a2a-fleet-mosquitto.a2a-fleet-system.svc", "a2a-fleet-mosquitto.a2a-fleet-system.svc.cluster.local")
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "a2a-fleet-mosquitto-tls", Namespace: Namespace},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{"ca.crt": caPEM, "tls.crt": certPEM, "tls.key": keyPEM},
	}
	if err := env.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	overlay, err := env.Kustomization(t.TempDir(), "config/quickstart", "config/quickstart/tls")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.KubectlRun(ctx, "apply", "--server-side", "-k", overlay); err != nil {
		t.Fatal(err)
	}
	if err := env.WaitDeployments(ctx, Namespace, 5*time.Minute, "a2a-fleet-controller-manager", "a2a-fleet-conversation-service", "a2a-fleet-mosquitto"); err != nil {
		t.Fatal(err)
	}
	pods, err := env.Pods(ctx, Namespace, "app.kubernetes.io/component=operator")
	if err != nil || len(pods) == 0 {
		t.Fatalf("no operator pod: %v", err)
	}
	if args := strings.Join(pods[0].Spec.Containers[0].Args, " "); !strings.Contains(args, "--broker-url=tls://") || !strings.Contains(args, "--broker-ca-file=") {
		t.Fatalf("the operator is not configured for TLS to the broker: %s", args)
	}
	b := runSamples(ctx, t)
	t.Run("no restarts, no RBAC refusals, one leader", func(t *testing.T) { healthy(ctx, t) })
	t.Run("chat through the conversation service", func(t *testing.T) { b.chatConfirm(ctx, t) })
}

// testCertificates makes a CA and a server certificate for names (PEM), as cert-manager would.
func testCertificates(t *testing.T, names ...string) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "a2a-fleet test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
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
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
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
