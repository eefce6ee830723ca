package render

import (
	"os"
	"path/filepath"
	"slices"
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
		"a2a-fleet/gateway:dev":              {"gateway", "GATEWAY_IMG"},
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
	for _, dir := range []string{"config/quickstart", "config/samples-workloads", "config/gateway"} {
		objs, err := Kustomize(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		rendered = append(rendered, objs...)
	}
	chart, err := Helm(root, "--set", "gateway.enabled=true")
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

// dynsec stays selectable: the chart with broker.backend=dynsec installs what config/quickstart
// with the component config/mosquitto/dynsec installs (TLS on and off), and the defaults are the
// decision table (the operator's flag, the broker's plugin and its admin password file).
func TestDynsecBackendMatchesBetweenChartAndComponent(t *testing.T) {
	root, err := RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name       string
		components []string
		values     string
	}{
		{"plain", []string{"config/mosquitto/dynsec"}, "broker.backend=dynsec"},
		{"tls", []string{"config/quickstart/tls", "config/mosquitto/dynsec"}, "broker.backend=dynsec,mosquitto.tls.enabled=true,broker.url=tls://a2a-fleet-mosquitto.a2a-fleet-system.svc:8883,broker.workloadURL=mqtt://a2a-fleet-mosquitto.a2a-fleet-system.svc:1883,broker.tls.caSecret=a2a-fleet-mosquitto-tls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kust, err := KustomizeOverlay(root, t.TempDir(), []string{"config/quickstart"}, tc.components)
			if err != nil {
				t.Fatal(err)
			}
			chart, err := Helm(root, "--set", tc.values)
			if err != nil {
				t.Fatal(err)
			}
			if d := Differences(kust, chart); len(d) > 0 {
				t.Fatalf("quickstart + %v and the chart with %s differ in %d objects:\n%s", tc.components, tc.values, len(d), strings.Join(d, "\n"))
			}
			checkBackend(t, kust, "dynsec")
		})
	}
	for name, render := range map[string]func() ([]*unstructured.Unstructured, error){
		"config/quickstart": func() ([]*unstructured.Unstructured, error) { return Kustomize(root, "config/quickstart") },
		"chart":             func() ([]*unstructured.Unstructured, error) { return Helm(root) },
	} {
		objs, err := render()
		if err != nil {
			t.Fatal(err)
		}
		t.Run(name+" default", func(t *testing.T) { checkBackend(t, objs, "table") })
	}
}

// checkBackend checks that the operator's flags, the broker's configuration and its pod agree on
// one backend.
func checkBackend(t *testing.T, objs []*unstructured.Unstructured, backend string) {
	t.Helper()
	manager := Find(objs, "Deployment", "a2a-fleet-controller-manager")
	broker := Find(objs, "Deployment", "a2a-fleet-mosquitto")
	if manager == nil || broker == nil {
		t.Fatalf("no operator or broker Deployment in %v", Kinds(objs))
	}
	containers, _, _ := unstructured.NestedSlice(manager.Object, "spec", "template", "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	hasTableFlag := slices.Contains(args, "--broker-backend=table")
	conf := ""
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && strings.HasPrefix(o.GetName(), "a2a-fleet-mosquitto-config") {
			conf, _, _ = unstructured.NestedString(o.Object, "data", "mosquitto.conf")
		}
	}
	inits, _, _ := unstructured.NestedSlice(broker.Object, "spec", "template", "spec", "initContainers")
	volumes, _, _ := unstructured.NestedSlice(broker.Object, "spec", "template", "spec", "volumes")
	hasAdminVolume := slices.ContainsFunc(volumes, func(v any) bool { return v.(map[string]any)["name"] == "admin" })
	switch backend {
	case "table":
		if !hasTableFlag || !strings.Contains(conf, "plugin /usr/lib/mosquitto_a2a_fleet_table.so\n") ||
			!strings.Contains(conf, "plugin_opt_admin_password_file /mosquitto/admin/password\n") ||
			strings.Contains(conf, "dynamic_security") || !hasAdminVolume || len(inits) != 0 {
			t.Errorf("want the table backend: operator flag %v, admin volume %v, %d init containers, configuration:\n%s", hasTableFlag, hasAdminVolume, len(inits), conf)
		}
	case "dynsec":
		if hasTableFlag || !strings.Contains(conf, "plugin /usr/lib/mosquitto_dynamic_security.so\n") ||
			strings.Contains(conf, "a2a_fleet_table") || hasAdminVolume || len(inits) != 1 {
			t.Errorf("want the dynsec backend: operator flag %v, admin volume %v, %d init containers, configuration:\n%s", hasTableFlag, hasAdminVolume, len(inits), conf)
		}
	}
}

// The conversation service's store is on a claim by default in both installs; the emptyDir is a
// choice that installs the same in both (the component config/conversation-service/ephemeral,
// conversationService.persistence.enabled=false).
func TestServiceStateOnAClaimUnlessChosenOtherwise(t *testing.T) {
	root, err := RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	kust, err := KustomizeOverlay(root, t.TempDir(), []string{"config/quickstart"}, []string{"config/conversation-service/ephemeral"})
	if err != nil {
		t.Fatal(err)
	}
	chart, err := Helm(root, "--set", "conversationService.persistence.enabled=false")
	if err != nil {
		t.Fatal(err)
	}
	if d := Differences(kust, chart); len(d) > 0 {
		t.Fatalf("quickstart + ephemeral and the chart without persistence differ in %d objects:\n%s", len(d), strings.Join(d, "\n"))
	}
	stateVolume := func(objs []*unstructured.Unstructured) map[string]any {
		d := Find(objs, "Deployment", "a2a-fleet-conversation-service")
		if d == nil {
			t.Fatalf("no service Deployment in %v", Kinds(objs))
		}
		volumes, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "volumes")
		for _, v := range volumes {
			if v.(map[string]any)["name"] == "state" {
				return v.(map[string]any)
			}
		}
		t.Fatal("the service has no state volume")
		return nil
	}
	if v := stateVolume(kust); v["emptyDir"] == nil || Find(kust, "PersistentVolumeClaim", "a2a-fleet-conversation-service-state") != nil {
		t.Errorf("ephemeral: want an emptyDir and no claim, got %v", v)
	}
	quickstart, err := Kustomize(root, "config/quickstart")
	if err != nil {
		t.Fatal(err)
	}
	defaults, err := Helm(root)
	if err != nil {
		t.Fatal(err)
	}
	for name, objs := range map[string][]*unstructured.Unstructured{"config/quickstart": quickstart, "chart": defaults} {
		v := stateVolume(objs)
		claim, _ := v["persistentVolumeClaim"].(map[string]any)
		if claim["claimName"] != "a2a-fleet-conversation-service-state" || Find(objs, "PersistentVolumeClaim", "a2a-fleet-conversation-service-state") == nil {
			t.Errorf("%s: want the state on the claim a2a-fleet-conversation-service-state, got %v", name, v)
		}
	}
}

// The gateway is off by default in both installs, and turned on (config/gateway beside the
// quickstart, gateway.enabled=true) installs the same objects in both.
func TestGatewayOffByDefaultAndTheSameWhenOn(t *testing.T) {
	root, err := RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	quickstart, err := Kustomize(root, "config/quickstart")
	if err != nil {
		t.Fatal(err)
	}
	defaults, err := Helm(root)
	if err != nil {
		t.Fatal(err)
	}
	for name, objs := range map[string][]*unstructured.Unstructured{"config/quickstart": quickstart, "chart": defaults} {
		if d := Find(objs, "Deployment", "a2a-fleet-gateway"); d != nil {
			t.Errorf("%s installs the gateway by default", name)
		}
	}
	kust, err := KustomizeOverlay(root, t.TempDir(), []string{"config/quickstart", "config/gateway"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	chart, err := Helm(root, "--set", "gateway.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	if d := Differences(kust, chart); len(d) > 0 {
		t.Fatalf("quickstart + config/gateway and the chart with gateway.enabled differ in %d objects:\n%s", len(d), strings.Join(d, "\n"))
	}
	if Find(kust, "Deployment", "a2a-fleet-gateway") == nil || Find(kust, "ClusterRole", "a2a-fleet-gateway") == nil {
		t.Fatalf("config/gateway installs no gateway Deployment or ClusterRole: %v", Kinds(kust))
	}
	if d := DanglingServiceAccounts(kust); len(d) > 0 {
		t.Errorf("%s", strings.Join(d, "\n"))
	}
}
