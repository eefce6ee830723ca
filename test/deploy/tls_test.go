package deploy

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/a2a-fleet/a2a-fleet/test/deploy/installed"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/render"
)

// config/quickstart with its TLS component: Mosquitto serves TLS on 8883 with the certificate of
// the Secret a2a-fleet-mosquitto-tls, and the operator administers it over tls:// with
// --broker-ca-file. The agents becoming Ready proves the operator's TLS connection (dynsec admin
// and card publisher); the service and the agents stay on the plain listener.
func TestQuickstartWithTLSToTheBroker(t *testing.T) {
	root, err := render.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := render.KustomizeOverlay(root, t.TempDir(), []string{"config/quickstart"}, []string{"config/quickstart/tls"})
	if err != nil {
		t.Fatal(err)
	}
	// The certificate a user (or cert-manager) provides: for the Service's name, and for the
	// loopback address that stands for it here.
	caPEM, certPEM, keyPEM := testCertificates(t, []string{"a2a-fleet-mosquitto.a2a-fleet-system.svc"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	secret := &corev1.Secret{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{Name: "a2a-fleet-mosquitto-tls", Namespace: render.Namespace},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{"ca.crt": caPEM, "tls.crt": certPEM, "tls.key": keyPEM},
	}
	u, err := toUnstructured(secret)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	s := installed.Install(ctx, t, append(objs, u))
	s.DumpOnFailure()
	operator := s.Pods[installed.Operator][0]
	if !strings.Contains(strings.Join(operator.Translations, "\n"), "tls://") && !strings.Contains(operator.Logs(), `"broker":"tls://`) {
		t.Fatalf("the operator does not use tls:// to the broker:\n%s", strings.Join(operator.Translations, "\n"))
	}
	s.ApplySamples(ctx, "default")
	s.WaitAgentsReady(ctx, "default", 2*time.Minute)
	checkHealthy(ctx, t, s)
}

func toUnstructured(obj any) (*unstructured.Unstructured, error) {
	m, err := runtimeToMap(obj)
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}

// testCertificates makes a CA and a server certificate for names and ips (PEM).
func testCertificates(t *testing.T, names []string, ips []net.IP) (caPEM, certPEM, keyPEM []byte) {
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
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names, IPAddresses: ips,
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

func runtimeToMap(obj any) (map[string]any, error) {
	return runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
}
