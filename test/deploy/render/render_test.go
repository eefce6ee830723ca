package render

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The Helm chart with its default values installs the same objects as config/quickstart: same
// CRDs, RBAC, images, flags, environment, probes, volumes and broker configuration.
func TestChartInstallsWhatQuickstartInstalls(t *testing.T) {
	root, err := RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	kust, err := Kustomize(root, "config/quickstart")
	if err != nil {
		t.Fatal(err)
	}
	chart, err := Helm(root)
	if err != nil {
		t.Fatal(err)
	}
	if d := Differences(kust, chart); len(d) > 0 {
		t.Fatalf("config/quickstart and charts/a2a-fleet differ in %d objects:\n%s", len(d), strings.Join(d, "\n"))
	}
	t.Logf("chart and quickstart agree on %d objects: %s", len(Comparable(kust)), strings.Join(Kinds(chart), ", "))
}

// The TLS component of the quickstart and the chart's TLS values install the same broker
// listener, Service port and operator flags.
func TestChartTLSMatchesQuickstartTLSComponent(t *testing.T) {
	root, err := RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	kust, err := KustomizeOverlay(root, t.TempDir(), []string{"config/quickstart"}, []string{"config/quickstart/tls"})
	if err != nil {
		t.Fatal(err)
	}
	chart, err := Helm(root, "--set", "mosquitto.tls.enabled=true,broker.url=tls://a2a-fleet-mosquitto.a2a-fleet-system.svc:8883,broker.workloadURL=mqtt://a2a-fleet-mosquitto.a2a-fleet-system.svc:1883,broker.tls.caSecret=a2a-fleet-mosquitto-tls")
	if err != nil {
		t.Fatal(err)
	}
	if d := Differences(kust, chart); len(d) > 0 {
		t.Fatalf("config/quickstart + tls and the chart with TLS differ in %d objects:\n%s", len(d), strings.Join(d, "\n"))
	}
}

// Every ServiceAccount a binding or a pod names exists: in the quickstart, in the chart, and in a
// user's overlay of the quickstart that adds its own objects to the namespace (which once turned
// the service's binding subject back into the unprefixed "conversation-service").
func TestServiceAccountReferencesResolve(t *testing.T) {
	root, err := RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	extra := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: mine, namespace: a2a-fleet-system}\ndata: {a: b}\n"
	if err := os.WriteFile(filepath.Join(dir, "mine.yaml"), []byte(extra), 0o644); err != nil {
		t.Fatal(err)
	}
	renders := map[string]func() ([]*unstructured.Unstructured, error){
		"config/quickstart": func() ([]*unstructured.Unstructured, error) { return Kustomize(root, "config/quickstart") },
		"chart":             func() ([]*unstructured.Unstructured, error) { return Helm(root) },
		"overlay of config/quickstart with an object of its own": func() ([]*unstructured.Unstructured, error) {
			// The overlay's own file sits beside its kustomization.yaml, as a user's would.
			if _, err := KustomizeOverlay(root, dir, []string{"config/quickstart"}, nil); err != nil {
				return nil, err
			}
			k, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
			if err != nil {
				return nil, err
			}
			if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), append(k, []byte("- mine.yaml\n")...), 0o644); err != nil {
				return nil, err
			}
			return Kustomize(root, dir)
		},
	}
	for name, build := range renders {
		objs, err := build()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if d := DanglingServiceAccounts(objs); len(d) > 0 {
			t.Errorf("%s:\n%s", name, strings.Join(d, "\n"))
		}
	}
}
