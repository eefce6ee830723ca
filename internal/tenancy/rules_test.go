package tenancy

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

func tenant(name, org string, age int, spec func(*a2av1.TenantSpec)) a2av1.Tenant {
	t := a2av1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: name,
		CreationTimestamp: metav1.NewTime(time.Unix(1_700_000_000, 0).Add(time.Duration(age) * time.Hour))},
		Spec: a2av1.TenantSpec{OrgID: org}}
	if spec != nil {
		spec(&t.Spec)
	}
	return t
}

func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func TestAuthorize(t *testing.T) {
	tenants := []a2av1.Tenant{
		tenant("acme", "acme", 0, func(s *a2av1.TenantSpec) {
			s.Namespaces = []string{"team-a"}
			s.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"tenant": "acme"}}
			s.Units = []string{"sales", "support"}
			s.Pools = []string{"workers"}
		}),
		tenant("globex", "globex", 1, func(s *a2av1.TenantSpec) { s.Namespaces = []string{"team-b"} }),
		// Newer Tenants: one wants acme's org, one wants team-b.
		tenant("acme-copy", "acme", 2, func(s *a2av1.TenantSpec) { s.Namespaces = []string{"copycat"} }),
		tenant("initech", "initech", 3, func(s *a2av1.TenantSpec) { s.Namespaces = []string{"team-b", "team-c"} }),
	}
	b := NewBindings(tenants)
	cases := []struct {
		name      string
		ns        *corev1.Namespace
		claim     Claim
		permitted bool
		tenant    string
		message   string
	}{
		{"bound by list", namespace("team-a", nil), Claim{"acme", "sales", ""}, true, "acme", "Tenant acme binds namespace team-a"},
		{"bound by selector", namespace("anything", map[string]string{"tenant": "acme"}), Claim{"acme", "support", "workers"}, true, "acme", ""},
		{"wrong org for the binding", namespace("team-a", nil), Claim{"globex", "sales", ""}, false, "acme", "binds namespace team-a to org acme, not globex"},
		{"unit not allowed", namespace("team-a", nil), Claim{"acme", "ops", ""}, false, "acme", "allows units sales, support, not ops"},
		{"pool not allowed", namespace("team-a", nil), Claim{"acme", "sales", "other"}, false, "acme", "allows pools workers, not other"},
		{"squatter namespace claims a tenant's org", namespace("evil", nil), Claim{"acme", "sales", ""}, false, "", "org acme belongs to Tenant acme"},
		{"namespace named like a tenant's org", namespace("acme", nil), Claim{"acme", "sales", ""}, false, "", "org acme belongs to Tenant acme"},
		{"zero-config: the org named like the namespace", namespace("solo", nil), Claim{"solo", "any", "p"}, true, "", "may claim the org named like itself"},
		{"zero-config: another org", namespace("solo", nil), Claim{"other", "u", ""}, false, "", "may only claim orgID solo"},
		{"reserved org, even by zero-config", namespace("a2a-fleet", nil), Claim{"a2a-fleet", "system", ""}, false, "", "reserved"},
		{"older tenant keeps a contested namespace", namespace("team-b", nil), Claim{"initech", "u", ""}, false, "globex", "binds namespace team-b to org globex"},
		{"newer tenant binds its uncontested namespace", namespace("team-c", nil), Claim{"initech", "u", ""}, true, "initech", ""},
		{"a tenant that lost its org binds nothing", namespace("copycat", nil), Claim{"acme", "sales", ""}, false, "", "org acme belongs to Tenant acme"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := b.Authorize(tc.ns, tc.claim)
			if d.Permitted != tc.permitted || d.Tenant != tc.tenant || !strings.Contains(d.Message, tc.message) {
				t.Fatalf("Authorize = %+v, want permitted=%v tenant=%q message containing %q", d, tc.permitted, tc.tenant, tc.message)
			}
		})
	}
}

func TestReport(t *testing.T) {
	tenants := []a2av1.Tenant{
		tenant("old", "acme", 0, func(s *a2av1.TenantSpec) { s.Namespaces = []string{"a", "shared"} }),
		tenant("new", "globex", 1, func(s *a2av1.TenantSpec) { s.Namespaces = []string{"b", "shared"} }),
		tenant("dup", "acme", 2, func(s *a2av1.TenantSpec) { s.Namespaces = []string{"c"} }),
		tenant("bad", "bad", 3, func(s *a2av1.TenantSpec) {
			s.Namespaces = []string{"d"}
			s.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "x", Operator: "In"}}}
		}),
	}
	nss := []corev1.Namespace{*namespace("a", nil), *namespace("b", nil), *namespace("c", nil), *namespace("d", nil), *namespace("shared", nil)}
	b := NewBindings(tenants)
	if r := b.ReportFor(&tenants[1], nss); !r.Effective || strings.Join(r.Bound, ",") != "b" || strings.Join(r.Conflicting, ",") != "shared" || strings.Join(r.ConflictsWith, ",") != "old" {
		t.Fatalf("new: %+v", r)
	}
	if r := b.ReportFor(&tenants[0], nss); strings.Join(r.Bound, ",") != "a,shared" || len(r.Conflicting) != 0 {
		t.Fatalf("old: %+v", r)
	}
	if r := b.ReportFor(&tenants[2], nss); r.Effective || r.OrgHolder != "old" || len(r.Bound) != 0 {
		t.Fatalf("dup: %+v", r)
	}
	if b.SelectorError(&tenants[3]) == nil {
		t.Fatal("invalid selector not reported")
	}
	if r := b.ReportFor(&tenants[3], nss); strings.Join(r.Bound, ",") != "d" {
		t.Fatalf("an invalid selector must leave the listed namespaces bound: %+v", r)
	}
}

func TestGrants(t *testing.T) {
	caller := &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: "b", Name: "x", Labels: map[string]string{"role": "auditor"}}}
	grant := func(ns string, from []string, to ...a2av1.AgentGrantTo) a2av1.AgentGrant {
		g := a2av1.AgentGrant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "g"}, Spec: a2av1.AgentGrantSpec{To: to}}
		for _, f := range from {
			g.Spec.From = append(g.Spec.From, a2av1.AgentGrantFrom{Namespace: f})
		}
		return g
	}
	auditors := &metav1.LabelSelector{MatchLabels: map[string]string{"role": "auditor"}}
	others := &metav1.LabelSelector{MatchLabels: map[string]string{"role": "other"}}
	cases := []struct {
		name   string
		grants []a2av1.AgentGrant
		from   string
		want   bool
	}{
		{"own namespace needs no grant", nil, "b", true},
		{"no grant", nil, "a", false},
		{"grant for all agents", []a2av1.AgentGrant{grant("b", []string{"a"}, a2av1.AgentGrantTo{Kind: a2av1.AgentGrantCallers})}, "a", true},
		{"grant narrowed to the caller's label", []a2av1.AgentGrant{grant("b", []string{"a"}, a2av1.AgentGrantTo{Kind: a2av1.AgentGrantCallers, AgentSelector: auditors})}, "a", true},
		{"grant narrowed to other agents", []a2av1.AgentGrant{grant("b", []string{"a"}, a2av1.AgentGrantTo{Kind: a2av1.AgentGrantCallers, AgentSelector: others})}, "a", false},
		{"grant to another namespace", []a2av1.AgentGrant{grant("b", []string{"c"}, a2av1.AgentGrantTo{Kind: a2av1.AgentGrantCallers})}, "a", false},
		{"grant in the wrong namespace", []a2av1.AgentGrant{grant("a", []string{"a"}, a2av1.AgentGrantTo{Kind: a2av1.AgentGrantCallers})}, "a", false},
		{"pools grant is not a callers grant", []a2av1.AgentGrant{grant("b", []string{"a"}, a2av1.AgentGrantTo{Kind: a2av1.AgentGrantPools})}, "a", false},
	}
	for _, tc := range cases {
		if got := CallerGranted(tc.grants, tc.from, caller); got != tc.want {
			t.Errorf("%s: CallerGranted = %v, want %v", tc.name, got, tc.want)
		}
	}
	pools := []a2av1.AgentGrant{grant("owner", []string{"member"}, a2av1.AgentGrantTo{Kind: a2av1.AgentGrantPools, PoolID: "workers"})}
	for _, tc := range []struct {
		memberNS, pool string
		want           bool
	}{{"owner", "any", true}, {"member", "workers", true}, {"member", "other", false}, {"stranger", "workers", false}} {
		if got := PoolGranted(pools, "owner", tc.memberNS, tc.pool); got != tc.want {
			t.Errorf("PoolGranted(%s, %s) = %v, want %v", tc.memberNS, tc.pool, got, tc.want)
		}
	}
}
