package hardening

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/a2a-fleet/a2a-fleet/test/deploy/render"
)

// egressPolicy reports whether a policy restricts egress: policyTypes names Egress, or (no
// policyTypes) it has egress rules, as the NetworkPolicy API defaults the field.
func egressPolicy(p networkingv1.NetworkPolicy) bool {
	if len(p.Spec.PolicyTypes) == 0 {
		return len(p.Spec.Egress) > 0
	}
	return slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
}

// egressAdmits reports whether the policies of from's namespace let it open a connection to
// port/proto of to: a pod no Egress policy selects may go anywhere; a selected pod only where one
// rule of one selecting policy admits (its ports, its peers: the same peer rules as ingress, the
// peer being the destination; a rule without peers admits any destination on its ports).
func egressAdmits(policies []networkingv1.NetworkPolicy, namespaces map[string]map[string]string, from, to pod, port int32, proto corev1.Protocol) (bool, error) {
	selected := false
	for _, p := range policies {
		if p.Namespace != from.namespace || !egressPolicy(p) {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
		if err != nil {
			return false, fmt.Errorf("policy %s: %w", p.Name, err)
		}
		if !sel.Matches(labels.Set(from.labels)) {
			continue
		}
		selected = true
		for _, rule := range p.Spec.Egress {
			if len(rule.Ports) > 0 && !slices.ContainsFunc(rule.Ports, func(rp networkingv1.NetworkPolicyPort) bool { return portMatches(rp, to, port, proto) }) {
				continue
			}
			ok := len(rule.To) == 0
			for _, peer := range rule.To {
				m, err := peerMatches(peer, p.Namespace, namespaces, to)
				if err != nil {
					return false, fmt.Errorf("policy %s: %w", p.Name, err)
				}
				ok = ok || m
			}
			if ok {
				return true, nil
			}
		}
	}
	return !selected, nil
}

// reaches: a connection needs both the sender's egress and, when the destination is a pod, its
// ingress.
func reaches(policies []networkingv1.NetworkPolicy, namespaces map[string]map[string]string, from, to pod, port int32, proto corev1.Protocol) (bool, error) {
	ok, err := egressAdmits(policies, namespaces, from, to, port, proto)
	if err != nil || !ok || to.namespace == "" {
		return ok, err
	}
	return ingressAdmits(policies, namespaces, from, to, port, proto)
}

// ipBlockMatches: the address is in the block's CIDR and in none of its exceptions.
func ipBlockMatches(b *networkingv1.IPBlock, ip string) (bool, error) {
	if ip == "" {
		return false, nil
	}
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return false, err
	}
	in := func(cidr string) (bool, error) {
		prefix, err := netip.ParsePrefix(cidr)
		return err == nil && prefix.Contains(addr), err
	}
	ok, err := in(b.CIDR)
	if err != nil || !ok {
		return false, err
	}
	for _, except := range b.Except {
		if out, err := in(except); err != nil || out {
			return false, err
		}
	}
	return true, nil
}

// destination is a port of a party the install's pods might call.
type destination struct {
	to    pod
	port  int32
	proto corev1.Protocol
}

func (d destination) String() string {
	return fmt.Sprintf("%s:%d/%s", d.to.name, d.port, d.proto)
}

// destinations are what the install's pods need (the cluster's DNS, the API server at its
// Service's port and at the control plane's, the broker) and what they do not (a Redis they
// have no store on, another team's pod, the internet).
func destinations(t *testing.T, objs []*unstructured.Unstructured) []destination {
	dns := pod{name: "kube-dns", namespace: "kube-system", labels: map[string]string{"k8s-app": "kube-dns"}}
	apiServer := pod{name: "apiserver", ip: "172.18.0.2"}
	redis := pod{name: "redis", namespace: "data", labels: map[string]string{"app.kubernetes.io/name": "redis"}}
	stranger := pod{name: "stranger", namespace: "team-a", labels: map[string]string{"app": "web"}}
	internet := pod{name: "internet", ip: "198.51.100.7"}
	out := []destination{
		{dns, 53, corev1.ProtocolUDP}, {dns, 53, corev1.ProtocolTCP},
		{apiServer, 443, corev1.ProtocolTCP}, {apiServer, 6443, corev1.ProtocolTCP},
		{redis, 6379, corev1.ProtocolTCP}, {redis, 26379, corev1.ProtocolTCP},
		{stranger, 80, corev1.ProtocolTCP}, {internet, 80, corev1.ProtocolTCP},
	}
	for _, p := range installParties(t, objs) {
		if p.labels["app.kubernetes.io/name"] == "mosquitto" {
			p.name = "mosquitto"
			out = append(out, destination{p, 1883, corev1.ProtocolTCP}, destination{p, 8883, corev1.ProtocolTCP})
		}
	}
	return out
}

// defaultDeny is what a namespace owner adds to lock a namespace down: no pod sends or takes
// anything a policy of its own does not admit.
func defaultDeny(namespace string) networkingv1.NetworkPolicy {
	return networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "default-deny", Namespace: namespace},
		Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}},
	}
}

// egressMatrix lists, for each install pod, the destinations it reaches ("pod -> a, b").
func egressMatrix(t *testing.T, objs []*unstructured.Unstructured, policies []networkingv1.NetworkPolicy) map[string]string {
	t.Helper()
	namespaces := namespaceLabels(render.Namespace, "kube-system", "data", "team-a")
	out := map[string]string{}
	for _, from := range installParties(t, objs) {
		var where []string
		for _, d := range destinations(t, objs) {
			ok, err := reaches(policies, namespaces, from, d.to, d.port, d.proto)
			if err != nil {
				t.Fatal(err)
			}
			if ok {
				where = append(where, d.String())
			}
		}
		out[from.name] = strings.Join(where, ", ")
	}
	return out
}

const (
	clusterAndBroker = "kube-dns:53/UDP, kube-dns:53/TCP, apiserver:443/TCP, apiserver:6443/TCP, mosquitto:1883/TCP, mosquitto:8883/TCP"
	withRedis        = "kube-dns:53/UDP, kube-dns:53/TCP, apiserver:443/TCP, apiserver:6443/TCP, redis:6379/TCP, redis:26379/TCP, mosquitto:1883/TCP, mosquitto:8883/TCP"
)

// In a namespace whose owner denies all traffic by default, the install still works: the
// operator and the conversation service reach DNS, the API server and the broker (and Redis when
// the service's store is there), the broker takes them, and nothing else goes out (the broker
// opens no connection at all). Both installs render the same policies (plain and TLS everywhere).
func TestEgressPoliciesKeepADefaultDenyNamespaceWorking(t *testing.T) {
	cases := []struct {
		name       string
		components []string
		values     []string
	}{
		{"plain", []string{"config/networkpolicy"}, []string{"--set", "networkPolicy.enabled=true"}},
		{"tls-everywhere", []string{"config/quickstart/tls-everywhere", "config/networkpolicy"}, []string{"--set", "networkPolicy.enabled=true,tls.everywhere=true"}},
	}
	want := map[string]string{
		"a2a-fleet-controller-manager":   clusterAndBroker,
		"a2a-fleet-conversation-service": clusterAndBroker,
		"a2a-fleet-mosquitto":            "",
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			kust, chart := renders(t, tc.components, tc.values)
			for name, objs := range map[string][]*unstructured.Unstructured{"kustomize": kust, "helm": chart} {
				policies := append(networkPolicies(t, objs), defaultDeny(render.Namespace))
				got := egressMatrix(t, objs, policies)
				for from, w := range want {
					if got[from] != w {
						t.Errorf("%s: %s reaches [%s], want [%s]", name, from, got[from], w)
					}
				}
				// The same default deny without the set's egress rules cuts the install off:
				// the rules above are what lets it work.
				stripped := append(ingressOnly(networkPolicies(t, objs)), defaultDeny(render.Namespace))
				for from, where := range egressMatrix(t, objs, stripped) {
					if where != "" {
						t.Errorf("%s: without the egress rules %s still reaches [%s] under a default deny", name, from, where)
					}
				}
			}
		})
	}
}

func ingressOnly(policies []networkingv1.NetworkPolicy) []networkingv1.NetworkPolicy {
	out := make([]networkingv1.NetworkPolicy, 0, len(policies))
	for _, p := range policies {
		p = *p.DeepCopy()
		p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		p.Spec.Egress = nil
		out = append(out, p)
	}
	return out
}

// The chart's options: a Redis store opens Redis's ports for the service only; apiServerTo and
// redisTo narrow those rules to the addresses given (the internet on 443 is then refused).
func TestEgressPolicyChartOptions(t *testing.T) {
	root, err := render.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := render.Helm(root, "--set", "networkPolicy.enabled=true,conversationService.store=redis://redis.data:6379/0,conversationService.persistence.enabled=false")
	if err != nil {
		t.Fatal(err)
	}
	got := egressMatrix(t, objs, append(networkPolicies(t, objs), defaultDeny(render.Namespace)))
	if got["a2a-fleet-conversation-service"] != withRedis || got["a2a-fleet-controller-manager"] != clusterAndBroker {
		t.Errorf("with a Redis store: the service reaches [%s], want [%s]; the operator [%s], want [%s]",
			got["a2a-fleet-conversation-service"], withRedis, got["a2a-fleet-controller-manager"], clusterAndBroker)
	}

	objs, err = render.Helm(root, "--set", "networkPolicy.enabled=true", "--set-json", `networkPolicy.apiServerTo=[{"ipBlock":{"cidr":"172.18.0.0/16"}}]`)
	if err != nil {
		t.Fatal(err)
	}
	policies := append(networkPolicies(t, objs), defaultDeny(render.Namespace))
	namespaces := namespaceLabels(render.Namespace)
	operator := installParties(t, objs)[slices.IndexFunc(installParties(t, objs), func(p pod) bool { return p.name == "a2a-fleet-controller-manager" })]
	for _, c := range []struct {
		to   pod
		want bool
	}{{pod{name: "apiserver", ip: "172.18.0.2"}, true}, {pod{name: "internet", ip: "198.51.100.7"}, false}} {
		ok, err := reaches(policies, namespaces, operator, c.to, 443, corev1.ProtocolTCP)
		if err != nil {
			t.Fatal(err)
		}
		if ok != c.want {
			t.Errorf("apiServerTo=172.18.0.0/16: the operator reaches %s:443 %v, want %v", c.to.ip, ok, c.want)
		}
	}
}
