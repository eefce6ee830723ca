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

// Every image the manifests run (the quickstart, the chart, the samples' workloads) is a target of
// the one Dockerfile that `make docker-build` builds under that name and hack/kind/images.sh builds
// for the kind suite, which then runs them (test/cluster).
func TestEveryImageIsADockerfileTarget(t *testing.T) {
	root, err := RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		data, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	dockerfile, makefile, images := read("Dockerfile"), read("Makefile"), read("hack/kind/images.sh")
	targets := map[string]struct{ target, makeVar string }{
		"a2a-fleet/operator:dev":             {"manager", "IMG"},
		"a2a-fleet/conversation-service:dev": {"conversation-service", "SERVICE_IMG"},
		"a2a-fleet/example-agents:dev":       {"example-agents", "EXAMPLES_IMG"},
		"a2a-fleet/mosquitto:dev":            {"mosquitto", "MOSQUITTO_IMG"},
	}
	for image, tg := range targets {
		if !strings.Contains(dockerfile, " AS "+tg.target+"\n") {
			t.Errorf("the Dockerfile has no target %s (image %s)", tg.target, image)
		}
		if !strings.Contains(makefile, tg.makeVar+" ?= "+image+"\n") || !strings.Contains(makefile, "--target "+tg.target+" -t $("+tg.makeVar+")") {
			t.Errorf("make docker-build does not build target %s as %s=%s", tg.target, tg.makeVar, image)
		}
		if !strings.Contains(images, `"`+tg.target+" $"+tg.makeVar+`"`) || !strings.Contains(images, tg.makeVar+`="${`+tg.makeVar+":-"+image+`}"`) {
			t.Errorf("hack/kind/images.sh does not build target %s as %s", tg.target, image)
		}
	}
	var rendered []*unstructured.Unstructured
	for _, dir := range []string{"config/quickstart", "config/samples-workloads"} {
		objs, err := Kustomize(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		rendered = append(rendered, objs...)
	}
	chart, err := Helm(root)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, o := range append(rendered, chart...) {
		for _, path := range [][]string{{"spec", "template", "spec"}, {"spec", "workload", "template", "spec"}} {
			podSpec, found, _ := unstructured.NestedMap(o.Object, path...)
			if !found {
				continue
			}
			for _, key := range []string{"initContainers", "containers"} {
				list, _, _ := unstructured.NestedSlice(podSpec, key)
				for _, c := range list {
					image, _ := c.(map[string]any)["image"].(string)
					if _, ok := targets[image]; !ok {
						t.Errorf("%s %s runs image %q, which is no Dockerfile target", o.GetKind(), o.GetName(), image)
					}
					used[image] = true
				}
			}
		}
	}
	if len(used) != len(targets) {
		t.Errorf("the manifests run %d of the %d images: %v", len(used), len(targets), used)
	}
}
