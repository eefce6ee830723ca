package hardening

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/render"
)

// pod is a party: where it runs, its labels and its containers' ports (for named ports); ip is
// set for a party outside the pod network (the API server, an address on the internet), which
// only an ipBlock or a rule without peers matches.
type pod struct {
	name, namespace string
	labels          map[string]string
	ports           []corev1.ContainerPort
	ip              string
}

// admitted reports whether the policies let from reach port/TCP of to, by the NetworkPolicy API's
// ingress rules: a pod no Ingress policy of its namespace selects takes everything; a selected
// pod takes what one rule of one selecting policy admits (any of its ports, any of its peers: a
// podSelector alone means the policy's namespace, a namespaceSelector alone every pod there,
// both together both; an ipBlock matches no pod by label). Selectors are matched with
// apimachinery's label selectors, as the API server and the CNIs do.
func admitted(policies []networkingv1.NetworkPolicy, namespaces map[string]map[string]string, from, to pod, port int32) (bool, error) {
	return ingressAdmits(policies, namespaces, from, to, port, corev1.ProtocolTCP)
}

func ingressAdmits(policies []networkingv1.NetworkPolicy, namespaces map[string]map[string]string, from, to pod, port int32, proto corev1.Protocol) (bool, error) {
	selected := false
	for _, p := range policies {
		if p.Namespace != to.namespace || !ingressPolicy(p) {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil {
			return false, fmt.Errorf("policy %s: %w", p.Name, err)
		}
		if !sel.Matches(labels.Set(to.labels)) {
			continue
		}
		selected = true
		for _, rule := range p.Spec.Ingress {
			okPort := len(rule.Ports) == 0 || slices.ContainsFunc(rule.Ports, func(rp networkingv1.NetworkPolicyPort) bool { return portMatches(rp, to, port, proto) })
			if !okPort {
				continue
			}
			okPeer := len(rule.From) == 0
			for _, peer := range rule.From {
				m, err := peerMatches(peer, p.Namespace, namespaces, from)
				if err != nil {
					return false, fmt.Errorf("policy %s: %w", p.Name, err)
				}
				okPeer = okPeer || m
			}
			if okPeer {
				return true, nil
			}
		}
	}
	return !selected, nil
}

func ingressPolicy(p networkingv1.NetworkPolicy) bool {
	return len(p.Spec.PolicyTypes) == 0 || slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
}

// portMatches: a rule's port without a protocol is TCP, as the API defaults it.
func portMatches(rp networkingv1.NetworkPolicyPort, to pod, port int32, proto corev1.Protocol) bool {
	if want := corev1.ProtocolTCP; rp.Protocol != nil {
		if *rp.Protocol != proto {
			return false
		}
	} else if proto != want {
		return false
	}
	if rp.Port == nil {
		return true
	}
	want := rp.Port.IntValue()
	if rp.Port.Type != 0 { // a named port: the target container's port of that name
		i := slices.IndexFunc(to.ports, func(cp corev1.ContainerPort) bool { return cp.Name == rp.Port.StrVal })
		if i < 0 {
			return false
		}
		want = int(to.ports[i].ContainerPort)
	}
	if rp.EndPort != nil {
		return int(port) >= want && port <= *rp.EndPort
	}
	return int(port) == want
}

func peerMatches(peer networkingv1.NetworkPolicyPeer, policyNS string, namespaces map[string]map[string]string, from pod) (bool, error) {
	if peer.IPBlock != nil {
		return ipBlockMatches(peer.IPBlock, from.ip)
	}
	if from.namespace == "" { // not a pod: no selector names it
		return false, nil
	}
	if peer.NamespaceSelector == nil && from.namespace != policyNS {
		return false, nil
	}
	if peer.NamespaceSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
		if err != nil {
			return false, err
		}
		if !sel.Matches(labels.Set(namespaces[from.namespace])) {
			return false, nil
		}
	}
	if peer.PodSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
		if err != nil {
			return false, err
		}
		return sel.Matches(labels.Set(from.labels)), nil
	}
	return true, nil
}

// installParties are the pods of the render's Deployments, with their pod templates' labels.
func installParties(t *testing.T, objs []*unstructured.Unstructured) []pod {
	t.Helper()
	var out []pod
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		tmpl := corev1.PodTemplateSpec{}
		raw, _, _ := unstructured.NestedMap(o.Object, "spec", "template")
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &tmpl); err != nil {
			t.Fatalf("%s: %v", o.GetName(), err)
		}
		p := pod{name: o.GetName(), namespace: o.GetNamespace(), labels: tmpl.Labels}
		for _, c := range tmpl.Spec.Containers {
			p.ports = append(p.ports, c.Ports...)
		}
		out = append(out, p)
	}
	return out
}

func networkPolicies(t *testing.T, objs []*unstructured.Unstructured) []networkingv1.NetworkPolicy {
	t.Helper()
	var out []networkingv1.NetworkPolicy
	for _, o := range objs {
		if o.GetKind() != "NetworkPolicy" {
			continue
		}
		p := networkingv1.NetworkPolicy{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &p); err != nil {
			t.Fatalf("NetworkPolicy %s: %v", o.GetName(), err)
		}
		out = append(out, p)
	}
	return out
}

// The parties that are not Deployments of the install: an agent workload's pod as the operator
// labels it (in a namespace of its own), the gateway, Prometheus, and pods that must be kept out.
func otherParties() []pod {
	return []pod{
		{name: "agent", namespace: "team-a", labels: map[string]string{identity.LabelAgent: "echo", "app.kubernetes.io/component": "agent", "app.kubernetes.io/name": "example-agent"}},
		{name: "gateway", namespace: render.Namespace, labels: map[string]string{"app.kubernetes.io/part-of": "a2a-fleet", "app.kubernetes.io/component": "gateway"}},
		{name: "prometheus", namespace: "monitoring", labels: map[string]string{"app.kubernetes.io/name": "prometheus"}},
		{name: "stranger-in-system", namespace: render.Namespace, labels: map[string]string{"app": "stranger"}},
		{name: "stranger", namespace: "team-a", labels: map[string]string{"app": "web"}},
		// Claims the agents' component label without being an Agent's workload.
		{name: "not-an-agent", namespace: "team-a", labels: map[string]string{"app.kubernetes.io/component": "agent"}},
	}
}

// Namespaces' labels: the API server sets kubernetes.io/metadata.name on every namespace.
func namespaceLabels(names ...string) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, n := range names {
		out[n] = map[string]string{"kubernetes.io/metadata.name": n}
	}
	return out
}

// admissionMatrix lists, for each install pod and port, the parties admitted ("target:port <-
// a, b").
func admissionMatrix(t *testing.T, objs []*unstructured.Unstructured, ports map[string][]int32) map[string]string {
	t.Helper()
	policies := networkPolicies(t, objs)
	install := installParties(t, objs)
	parties := append(append([]pod{}, install...), otherParties()...)
	namespaces := namespaceLabels(render.Namespace, "team-a", "monitoring")
	out := map[string]string{}
	for _, to := range install {
		for _, port := range ports[to.name] {
			var who []string
			for _, from := range parties {
				ok, err := admitted(policies, namespaces, from, to, port)
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					who = append(who, from.name)
				}
			}
			sort.Strings(who)
			out[fmt.Sprintf("%s:%d", to.name, port)] = strings.Join(who, ", ")
		}
	}
	return out
}

// Each port of the install and who may reach it: the broker only its clients (never a stranger
// or a pod that merely claims the agents' label), the metrics only Prometheus, the probes
// anyone (the kubelet), and no other port.
var wantAdmissions = map[string]string{
	"a2a-fleet-mosquitto:1883":            "a2a-fleet-controller-manager, a2a-fleet-conversation-service, agent, gateway",
	"a2a-fleet-mosquitto:8883":            "a2a-fleet-controller-manager, a2a-fleet-conversation-service, agent, gateway",
	"a2a-fleet-mosquitto:9000":            "",
	"a2a-fleet-controller-manager:8080":   "prometheus",
	"a2a-fleet-controller-manager:8081":   "a2a-fleet-controller-manager, a2a-fleet-conversation-service, a2a-fleet-mosquitto, agent, gateway, not-an-agent, prometheus, stranger, stranger-in-system",
	"a2a-fleet-controller-manager:9443":   "",
	"a2a-fleet-conversation-service:8080": "prometheus",
	"a2a-fleet-conversation-service:8081": "a2a-fleet-controller-manager, a2a-fleet-conversation-service, a2a-fleet-mosquitto, agent, gateway, not-an-agent, prometheus, stranger, stranger-in-system",
	"a2a-fleet-conversation-service:9000": "",
}

var probedPorts = map[string][]int32{
	"a2a-fleet-mosquitto":            {1883, 8883, 9000},
	"a2a-fleet-controller-manager":   {8080, 8081, 9443},
	"a2a-fleet-conversation-service": {8080, 8081, 9000},
}

// The NetworkPolicy set admits exactly the parties that need each port, in both installs, with
// and without TLS everywhere; the chart and the component render the same policies; and every
// pod of the install is selected by a policy.
func TestNetworkPolicyAdmitsOnlyTheParties(t *testing.T) {
	cases := []struct {
		name       string
		components []string
		values     []string
	}{
		{"plain", []string{"config/networkpolicy"}, []string{"--set", "networkPolicy.enabled=true"}},
		{"tls-everywhere", []string{"config/quickstart/tls-everywhere", "config/networkpolicy"}, []string{"--set", "networkPolicy.enabled=true,tls.everywhere=true"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kust, chart := renders(t, tc.components, tc.values)
			if d := render.Differences(kust, chart); len(d) > 0 {
				t.Fatalf("the component and the chart differ in %d objects:\n%s", len(d), strings.Join(d, "\n"))
			}
			for name, objs := range map[string][]*unstructured.Unstructured{"kustomize": kust, "helm": chart} {
				if n := len(networkPolicies(t, objs)); n != 3 {
					t.Fatalf("%s: %d NetworkPolicies, want 3", name, n)
				}
				got := admissionMatrix(t, objs, probedPorts)
				for key, want := range wantAdmissions {
					if got[key] != want {
						t.Errorf("%s: %s admits [%s], want [%s]", name, key, got[key], want)
					}
				}
				if len(got) != len(wantAdmissions) {
					t.Errorf("%s: the install's pods are %v, want the operator, the service and Mosquitto", name, installParties(t, objs))
				}
			}
		})
	}
}

// Without the policies every party reaches every port: the evaluator does not deny by itself, so
// the denials above are the policies'.
func TestWithoutNetworkPolicyEverythingIsAdmitted(t *testing.T) {
	root, err := render.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := render.Helm(root)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(networkPolicies(t, objs)); n != 0 {
		t.Fatalf("the chart's defaults render %d NetworkPolicies; networkPolicy.enabled is off by default", n)
	}
	all := "a2a-fleet-controller-manager, a2a-fleet-conversation-service, a2a-fleet-mosquitto, agent, gateway, not-an-agent, prometheus, stranger, stranger-in-system"
	for key, who := range admissionMatrix(t, objs, probedPorts) {
		if who != all {
			t.Errorf("without policies %s admits [%s], want everyone", key, who)
		}
	}
}
