package controllers_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// caNamespace is reconciled by a third manager, with a Registrar of its own and a workload broker
// CA file (Options.WorkloadBrokerCAFile), as the operator runs with --workload-broker-ca-file.
const caNamespace = "workload-ca"

var (
	// caFile is the CA manager's workload broker CA file; the tests replace its content the way a
	// Secret volume is updated (a rename).
	caFile      string
	caRegistrar = newRecordingRegistrar()
)

// excludeCANamespace keeps the broker-less manager's cache off caNamespace.
func excludeCANamespace(c *cache.Options) {
	c.DefaultFieldSelector = fields.AndSelectors(c.DefaultFieldSelector, fields.OneTermNotEqualSelector("metadata.namespace", caNamespace))
}

// startCAManager starts the manager of caNamespace with a fresh CA in caFile.
func startCAManager(ctx context.Context) (ctrl.Manager, error) {
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: caNamespace, Labels: map[string]string{suiteTenantLabel: "acme"}}}); err != nil {
		return nil, fmt.Errorf("create namespace: %w", err)
	}
	dir, err := os.MkdirTemp("", "workload-ca-")
	if err != nil {
		return nil, err
	}
	caFile = filepath.Join(dir, "ca.crt")
	pemCA, err := newCAPEM("first CA")
	if err != nil {
		return nil, err
	}
	if err := replaceFile(caFile, pemCA); err != nil {
		return nil, err
	}
	opts := controllers.CacheOptions()
	opts.DefaultNamespaces = map[string]cache.Config{caNamespace: {}}
	mgr, err := newManager(opts)
	if err == nil {
		err = controllers.Setup(ctx, mgr, controllers.Options{Registrar: caRegistrar,
			WorkloadBrokerURL: "tls://broker.example:8883", WorkloadBrokerCAFile: caFile, WorkloadBrokerCAPoll: 200 * time.Millisecond})
	}
	if err != nil {
		return nil, fmt.Errorf("CA manager: %w", err)
	}
	return mgr, nil
}

// newCAPEM is a self-signed CA certificate (PEM).
func newCAPEM(name string) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// replaceFile replaces path's content in one rename, as the kubelet swaps a Secret volume.
func replaceFile(path string, content []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, content, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

const caWorkload = `  workload:
    replicas: 1
    template:
      spec:
        containers:
        - name: agent
          image: example/agent:1
`

func containerEnv(d *appsv1.Deployment, name string) (string, bool) {
	for _, e := range d.Spec.Template.Spec.Containers[0].Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// With a workload broker CA, every credentials Secret carries it as ca.crt and the workload's
// A2A_TLS_CA names that file in the mounted Secret. A new CA in the file reaches the Secret without
// any reconcile of the Agent (the file is polled) with the password, the broker's copy, the pod
// template and the Events untouched; and a reconcile puts the file's CA back into a Secret edited
// by hand.
func TestCredentialsSecretCarriesTheWorkloadBrokerCA(t *testing.T) {
	ctx := context.Background()
	ns := caNamespace
	if err := applyYAML(ns, agentManifest("secured", "acme", "tls", nil, caWorkload)); err != nil {
		t.Fatalf("create agent: %v", err)
	}
	first, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	secretKey := client.ObjectKey{Namespace: ns, Name: "secured-mqtt-credentials"}
	deployKey := client.ObjectKey{Namespace: ns, Name: "secured-agent"}
	var password string
	deploy := &appsv1.Deployment{}
	eventually(t, "the Secret carries the CA and the workload names it", func() error {
		s, err := getSecret(ns, secretKey.Name)
		if err != nil {
			return err
		}
		if !bytes.Equal(s.Data[identity.SecretKeyCA], first) {
			return fmt.Errorf("Secret %s has %s %q, want the CA file's content", s.Name, identity.SecretKeyCA, s.Data[identity.SecretKeyCA])
		}
		password = string(s.Data[identity.SecretKeyPassword])
		if err := k8s.Get(ctx, deployKey, deploy); err != nil {
			return err
		}
		want := controllers.CredentialsMountPath + "/" + identity.SecretKeyCA
		if got, _ := containerEnv(deploy, a2amqtt.EnvTLSCA); got != want {
			return fmt.Errorf("workload %s = %q, want %q", a2amqtt.EnvTLSCA, got, want)
		}
		return nil
	})
	if pw := caRegistrar.passwords("acme/tls/secured"); len(pw) != 1 || pw[0] != password {
		t.Fatalf("the broker got %d passwords, want the Secret's one once", len(pw))
	}
	template := deploy.Spec.Template.DeepCopy()

	// The CA rotates (cert-manager renews it; the kubelet swaps the operator's Secret volume).
	second, err := newCAPEM("second CA")
	if err != nil {
		t.Fatal(err)
	}
	if err := replaceFile(caFile, second); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Secret carries the new CA", func() error {
		s, err := getSecret(ns, secretKey.Name)
		if err != nil {
			return err
		}
		if !bytes.Equal(s.Data[identity.SecretKeyCA], second) {
			return fmt.Errorf("Secret %s still has the old CA", s.Name)
		}
		if got := string(s.Data[identity.SecretKeyPassword]); got != password {
			return fmt.Errorf("the password changed with the CA")
		}
		return nil
	})
	// Let the reconcile the Secret's change brings run, then look at what it did.
	time.Sleep(time.Second)
	if pw := caRegistrar.passwords("acme/tls/secured"); len(pw) != 1 {
		t.Fatalf("the broker got %d passwords after a CA change, want the first one only", len(pw))
	}
	if err := k8s.Get(ctx, deployKey, deploy); err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(template, &deploy.Spec.Template) {
		t.Fatalf("the CA change changed the workload's pod template (its pods would roll):\nbefore %+v\nafter  %+v", template, deploy.Spec.Template)
	}
	var evs eventsv1.EventList
	if err := k8s.List(ctx, &evs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.Regarding.Name == "secured" && (e.Reason == controllers.EventCredentialsRotated || e.Reason == controllers.EventCredentialsRecreate) {
			t.Errorf("a CA change recorded %s: %s", e.Reason, e.Note)
		}
	}

	// The Secret's CA edited by hand: the reconcile its change brings writes the file's back.
	patch := []byte(`{"data":{"ca.crt":"` + base64.StdEncoding.EncodeToString([]byte("edited")) + `"}}`)
	if err := k8s.Patch(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secretKey.Name}}, client.RawPatch(types.MergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a reconcile restores the file's CA", func() error {
		s, err := getSecret(ns, secretKey.Name)
		if err != nil {
			return err
		}
		if !bytes.Equal(s.Data[identity.SecretKeyCA], second) {
			return fmt.Errorf("Secret %s has %s %q", s.Name, identity.SecretKeyCA, s.Data[identity.SecretKeyCA])
		}
		return nil
	})
	if pw := caRegistrar.passwords("acme/tls/secured"); len(pw) != 1 {
		t.Fatalf("the broker got %d passwords after the Secret's CA was restored, want the first one only", len(pw))
	}
}

// Without a workload broker CA no Secret carries ca.crt and no workload gets A2A_TLS_CA (the
// suite's two other managers run without one).
func TestNoWorkloadBrokerCAWithoutTheFlag(t *testing.T) {
	ctx := context.Background()
	for _, ns := range []string{newNamespace(t), brokeredNamespace} {
		if err := applyYAML(ns, agentManifest("plainca", "acme", "noca", nil, caWorkload)); err != nil {
			t.Fatalf("create agent: %v", err)
		}
		deploy := &appsv1.Deployment{}
		eventually(t, "the workload runs", func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "plainca-agent"}, deploy)
		})
		s, err := getSecret(ns, "plainca-mqtt-credentials")
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := s.Data[identity.SecretKeyCA]; ok {
			t.Errorf("%s: Secret %s has %s without a workload broker CA", ns, s.Name, identity.SecretKeyCA)
		}
		if v, ok := containerEnv(deploy, a2amqtt.EnvTLSCA); ok {
			t.Errorf("%s: the workload has %s=%q without a workload broker CA", ns, a2amqtt.EnvTLSCA, v)
		}
		if err := k8s.Delete(ctx, getAgent(t, ns, "plainca")); err != nil {
			t.Fatal(err)
		}
	}
}
