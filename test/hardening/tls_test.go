package hardening

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/a2a-fleet/a2a-fleet/test/deploy/render"
)

// tlsEverywhereValues are the chart's values for TLS to every party.
var tlsEverywhereValues = []string{"--set", "tls.everywhere=true"}

func renders(t *testing.T, components []string, values []string) (kust, chart []*unstructured.Unstructured) {
	t.Helper()
	root, err := render.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	kust, err = render.KustomizeOverlay(root, t.TempDir(), []string{"config/quickstart"}, components)
	if err != nil {
		t.Fatal(err)
	}
	chart, err = render.Helm(root, values...)
	if err != nil {
		t.Fatal(err)
	}
	return kust, chart
}

// The component and the chart value install the same objects.
func TestTLSEverywhereChartMatchesKustomize(t *testing.T) {
	kust, chart := renders(t, []string{"config/quickstart/tls-everywhere"}, tlsEverywhereValues)
	if d := render.Differences(kust, chart); len(d) > 0 {
		t.Fatalf("config/quickstart + tls-everywhere and the chart with tls.everywhere=true differ in %d objects:\n%s", len(d), strings.Join(d, "\n"))
	}
}

// With TLS everywhere no party is left on the plain listener, the plain listener is gone from the
// broker (configuration, container port, Service port, probes), and every party that connects
// (the operator, the conversation service, the agents through the operator's workload URL)
// verifies the broker with a mounted CA. The same checks find the plain parties of the
// operator-only TLS component, so they are not vacuous.
func TestTLSEverywhereLeavesNoPlainParty(t *testing.T) {
	kust, chart := renders(t, []string{"config/quickstart/tls-everywhere"}, tlsEverywhereValues)
	for name, objs := range map[string][]*unstructured.Unstructured{"kustomize": kust, "helm": chart} {
		t.Run(name, func(t *testing.T) {
			if problems := plainParties(objs); len(problems) > 0 {
				t.Fatalf("%d problems:\n%s", len(problems), strings.Join(problems, "\n"))
			}
		})
	}
	t.Run("control: the operator-only TLS component", func(t *testing.T) {
		kust, _ := renders(t, []string{"config/quickstart/tls"}, nil)
		problems := plainParties(kust)
		for _, want := range []string{"mqtt://", "listener 1883", "container port 1883", "Service port 1883", "conversation service has no CA", "workload broker URL"} {
			if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, want) }) {
				t.Errorf("the check does not report %q on config/quickstart/tls; it reported:\n%s", want, strings.Join(problems, "\n"))
			}
		}
	})
}

var plainListener = regexp.MustCompile(`(?m)^\s*listener\s+1883\b`)

// plainParties lists what in a render still uses or offers the plain listener, or connects
// over TLS without a CA of its own.
func plainParties(objs []*unstructured.Unstructured) []string {
	var problems []string
	for _, o := range objs {
		where := o.GetKind() + "/" + o.GetName()
		walkStrings(o.Object, func(p, s string) {
			if strings.Contains(s, "mqtt://") {
				problems = append(problems, fmt.Sprintf("%s %s: mqtt:// URL %q", where, p, s))
			}
		})
		switch o.GetKind() {
		case "ConfigMap":
			data, _, _ := unstructured.NestedStringMap(o.Object, "data")
			for key, conf := range data {
				if plainListener.MatchString(conf) {
					problems = append(problems, fmt.Sprintf("%s: %s opens listener 1883", where, key))
				}
			}
		case "Service":
			ports, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
			for _, p := range ports {
				if number(p.(map[string]any)["port"]) == 1883 {
					problems = append(problems, where+": Service port 1883")
				}
			}
		}
	}
	problems = append(problems, brokerPod(objs)...)
	problems = append(problems, operatorParty(objs)...)
	problems = append(problems, serviceParty(objs)...)
	return problems
}

// number is a decoded manifest's number (JSON decoding gives float64, YAML int64), or -1.
func number(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case float64:
		return int64(n)
	case int:
		return int64(n)
	}
	return -1
}

// walkStrings calls f with every string value in v and its path.
func walkStrings(v any, f func(path, s string)) {
	var walk func(p string, v any)
	walk = func(p string, v any) {
		switch x := v.(type) {
		case string:
			f(p, x)
		case map[string]any:
			for k, e := range x {
				walk(p+"."+k, e)
			}
		case []any:
			for i, e := range x {
				walk(fmt.Sprintf("%s[%d]", p, i), e)
			}
		}
	}
	walk("", v)
}

func deploymentContainer(objs []*unstructured.Unstructured, name, container string) (pod map[string]any, c map[string]any) {
	d := render.Find(objs, "Deployment", name)
	if d == nil {
		return nil, nil
	}
	pod, _, _ = unstructured.NestedMap(d.Object, "spec", "template", "spec")
	containers, _, _ := unstructured.NestedSlice(pod, "containers")
	for _, x := range containers {
		if x.(map[string]any)["name"] == container {
			return pod, x.(map[string]any)
		}
	}
	return pod, nil
}

func brokerPod(objs []*unstructured.Unstructured) []string {
	_, c := deploymentContainer(objs, "a2a-fleet-mosquitto", "mosquitto")
	if c == nil {
		return []string{"no Mosquitto container"}
	}
	var problems []string
	ports, _, _ := unstructured.NestedSlice(c, "ports")
	if slices.ContainsFunc(ports, func(p any) bool { return number(p.(map[string]any)["containerPort"]) == 1883 }) {
		problems = append(problems, "Mosquitto: container port 1883")
	}
	for _, probe := range []string{"readinessProbe", "livenessProbe"} {
		if port, _, _ := unstructured.NestedString(c, probe, "tcpSocket", "port"); port != "mqtts" {
			problems = append(problems, fmt.Sprintf("Mosquitto: %s checks port %q, not the TLS listener", probe, port))
		}
	}
	return problems
}

// caMounted reports whether file lies in a volume of pod mounted into c that is a Secret volume
// carrying the key ca.crt.
func caMounted(pod, c map[string]any, file string) bool {
	mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
	volumes, _, _ := unstructured.NestedSlice(pod, "volumes")
	for _, m := range mounts {
		mm := m.(map[string]any)
		if mm["mountPath"] != path.Dir(file) {
			continue
		}
		for _, v := range volumes {
			vv := v.(map[string]any)
			if vv["name"] != mm["name"] {
				continue
			}
			items, _, _ := unstructured.NestedSlice(vv, "secret", "items")
			for _, it := range items {
				if it.(map[string]any)["key"] == "ca.crt" && it.(map[string]any)["path"] == path.Base(file) {
					return true
				}
			}
		}
	}
	return false
}

func argValue(c map[string]any, flag string) (string, bool) {
	args, _, _ := unstructured.NestedStringSlice(c, "args")
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

func envValue(c map[string]any, name string) string {
	env, _, _ := unstructured.NestedSlice(c, "env")
	for _, e := range env {
		if e.(map[string]any)["name"] == name {
			v, _ := e.(map[string]any)["value"].(string)
			return v
		}
	}
	return ""
}

func operatorParty(objs []*unstructured.Unstructured) []string {
	pod, c := deploymentContainer(objs, "a2a-fleet-controller-manager", "manager")
	if c == nil {
		return []string{"no operator container"}
	}
	var problems []string
	url, _ := argValue(c, "--broker-url")
	if !strings.HasPrefix(url, "tls://") {
		problems = append(problems, "operator: --broker-url "+url)
	}
	// The agents' A2A_BROKER: --workload-broker-url, by default --broker-url.
	if w, ok := argValue(c, "--workload-broker-url"); ok && !strings.HasPrefix(w, "tls://") {
		problems = append(problems, "operator: workload broker URL (the agents') "+w)
	}
	if ca, ok := argValue(c, "--broker-ca-file"); !ok || !caMounted(pod, c, ca) {
		problems = append(problems, fmt.Sprintf("operator: --broker-ca-file %q is not the ca.crt of a mounted Secret", ca))
	}
	return problems
}

func serviceParty(objs []*unstructured.Unstructured) []string {
	pod, c := deploymentContainer(objs, "a2a-fleet-conversation-service", "conversation-service")
	if c == nil {
		return []string{"no conversation service container"}
	}
	var problems []string
	if url := envValue(c, "A2A_BROKER"); !strings.HasPrefix(url, "tls://") {
		problems = append(problems, "conversation service: A2A_BROKER "+url)
	}
	if ca := envValue(c, "A2A_TLS_CA_FILE"); ca == "" || !caMounted(pod, c, ca) {
		problems = append(problems, fmt.Sprintf("conversation service has no CA: A2A_TLS_CA_FILE %q is not the ca.crt of a mounted Secret", ca))
	}
	return problems
}

// With the operator's own broker, tls.everywhere puts every party on it with broker.tls.caSecret's
// CA, and refuses a plain broker URL.
func TestTLSEverywhereWithYourOwnBroker(t *testing.T) {
	root, err := render.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := render.Helm(root, "--set", "tls.everywhere=true,mosquitto.enabled=false,broker.url=tls://broker.example:8883,broker.tls.caSecret=example-ca")
	if err != nil {
		t.Fatal(err)
	}
	if render.Find(objs, "Deployment", "a2a-fleet-mosquitto") != nil {
		t.Fatal("mosquitto.enabled=false still renders the bundled Mosquitto")
	}
	var problems []string
	problems = append(problems, operatorParty(objs)...)
	problems = append(problems, serviceParty(objs)...)
	for _, name := range []string{"a2a-fleet-controller-manager", "a2a-fleet-conversation-service"} {
		d := render.Find(objs, "Deployment", name)
		volumes, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "volumes")
		if !slices.ContainsFunc(volumes, func(v any) bool {
			s, _, _ := unstructured.NestedString(v.(map[string]any), "secret", "secretName")
			return s == "example-ca"
		}) {
			problems = append(problems, name+" does not mount the Secret example-ca")
		}
	}
	if len(problems) > 0 {
		t.Fatalf("%d problems:\n%s", len(problems), strings.Join(problems, "\n"))
	}
	for _, plain := range []string{"broker.url=mqtt://broker.example:1883", "broker.url=tls://broker.example:8883,broker.workloadURL=mqtt://broker.example:1883"} {
		_, err := render.Helm(root, "--set", "tls.everywhere=true,mosquitto.enabled=false,broker.tls.caSecret=example-ca,"+plain)
		if err == nil || !strings.Contains(err.Error(), "is not a TLS URL") {
			t.Errorf("tls.everywhere with %s: want the chart to refuse it, got %v", plain, err)
		}
	}
}
