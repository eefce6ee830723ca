package render

import (
	"strings"
	"testing"
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
