package cluster

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/a2amqtttest"
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
	pki := a2amqtttest.NewPKI(t, "a2a-fleet test CA")
	certFile, keyFile := pki.IssueServerFor(t, names...)
	for _, f := range []struct {
		path string
		into *[]byte
	}{{pki.CAFile(), &caPEM}, {certFile, &certPEM}, {keyFile, &keyPEM}} {
		b, err := os.ReadFile(f.path)
		if err != nil {
			t.Fatal(err)
		}
		*f.into = b
	}
	return caPEM, certPEM, keyPEM
}
