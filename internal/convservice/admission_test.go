package convservice

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// The service's admission is tenancy's rule, and the ACL matrix of
// test/registration holds it to the broker's decisions pair by pair on
// real brokers. These unit tests pin the cases the security review found,
// over an in-memory reader with the cache's own indexes.

// builderIndexer registers tenancy.IndexFields on a fake client builder.
type builderIndexer struct{ b *fake.ClientBuilder }

func (i builderIndexer) IndexField(_ context.Context, obj client.Object, field string, fn client.IndexerFunc) error {
	i.b.WithIndex(obj, field, fn)
	return nil
}

func readerOf(t testing.TB, objs ...client.Object) client.Reader {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := a2av1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...)
	if err := tenancy.IndexFields(context.Background(), builderIndexer{b}); err != nil {
		t.Fatal(err)
	}
	return b.Build()
}

var epoch = time.Unix(1_700_000_000, 0)

func testAgent(ns, name, org, unit string, age int, lbl map[string]string, callers a2av1.CallersSpec) *a2av1.Agent {
	a := &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl, UID: types.UID(ns + "/" + name),
		CreationTimestamp: metav1.NewTime(epoch.Add(time.Duration(age) * time.Minute))}}
	a.Spec.OrgID, a.Spec.UnitID, a.Spec.Callers = org, unit, callers
	id := identity.Of(a)
	a.Status.ClientID = id.ClientID()
	a.Status.Topics = &a2av1.AgentTopics{Delivery: identity.DeliveryTopic(id)}
	return a
}

func nsObj(name string, lbl map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbl}}
}

func TestAdmitsCaller(t *testing.T) {
	ctx := context.Background()
	acme := &a2av1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: "acme", CreationTimestamp: metav1.NewTime(epoch)},
		Spec: a2av1.TenantSpec{OrgID: "acme", Namespaces: []string{"acme"}}}
	all := a2av1.CallersSpec{From: []a2av1.CallerSelector{{NamespaceSelector: &metav1.LabelSelector{}}}}
	gatedEvil := testAgent("evil", "gated", "evil", "x", 0, nil, all) // H1: selects every namespace, no grant anywhere
	console := testAgent("acme", "console", "acme", "demo", 1, nil, a2av1.CallersSpec{})
	governed := testAgent("acme", "governed", "acme", "demo", 2, nil, a2av1.CallersSpec{Scope: a2av1.CallerScopeSameUnit})
	insider := testAgent("evil", "insider", "evil", "x", 3, nil, a2av1.CallersSpec{})
	// M1: a refused squatter in evil claims acme/demo/console, newer and older than the holder.
	squatter := testAgent("evil", "squatter", "acme", "demo", -5, nil, a2av1.CallersSpec{})
	squatter.Spec.AgentID = "console"
	objs := []client.Object{acme, nsObj("acme", nil), nsObj("evil", nil), gatedEvil, console, governed, insider, squatter}

	cases := []struct {
		callee *a2av1.Agent
		caller a2amqtt.AgentRef
		want   bool
		why    string
	}{
		{gatedEvil, identity.Of(insider), true, "its own namespace's agents: selected"},
		{gatedEvil, identity.Of(console), false, "another namespace's agent without its AgentGrant"},
		{governed, identity.Of(console), true, "same unit, scope SameUnit, although an older refused squatter claims the id"},
		{governed, identity.Of(insider), false, "another org"},
		{governed, a2amqtt.AgentRef{Org: "acme", Unit: "demo", Agent: "ghost"}, false, "nobody holds the identity"},
	}
	for _, c := range cases {
		v, err := (&tenancy.Authorizer{Reader: readerOf(t, objs...)}).View(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got, err := admitsCaller(ctx, v, c.callee, c.caller)
		if err != nil || got != c.want {
			t.Errorf("%s admits %s = %v (%v), want %v: %s", identity.Of(c.callee), c.caller, got, err, c.want, c.why)
		}
	}

	// With acme's consent, the selector admits the console.
	grant := &a2av1.AgentGrant{ObjectMeta: metav1.ObjectMeta{Namespace: "acme", Name: "evil-may-select"},
		Spec: a2av1.AgentGrantSpec{From: []a2av1.AgentGrantFrom{{Namespace: "evil"}}, To: []a2av1.AgentGrantTo{{Kind: a2av1.AgentGrantCallers}}}}
	if ok, err := AdmitsCaller(ctx, readerOf(t, append(objs, grant)...), identity.Of(gatedEvil), identity.Of(console)); err != nil || !ok {
		t.Errorf("with acme's AgentGrant: admits = %v (%v), want true", ok, err)
	}
}

// The directory and the gated set key on the holder: a refused squatter's
// status (it claims the gated agent's identity) neither adds nor replaces a
// gated agent.
func TestGatedSetKeysOnHolders(t *testing.T) {
	ctx := context.Background()
	holder := testAgent("acme", "governed", "acme", "demo", 0, nil, a2av1.CallersSpec{})
	squatter := testAgent("evil", "squat", "acme", "demo", -1, nil, a2av1.CallersSpec{})
	squatter.Spec.AgentID = "governed"
	stranger := testAgent("evil", "stranger", "acme", "other", 0, nil, a2av1.CallersSpec{}) // refused: not its org
	reader := readerOf(t, nsObj("acme", nil), nsObj("evil", nil), holder, squatter, stranger)
	v, err := (&tenancy.Authorizer{Reader: reader}).View(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := &registry{log: logr.Discard()}
	got, err := r.gatedFrom(ctx, v, []a2av1.Agent{*squatter, *holder, *stranger}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[identity.Of(holder).RequestTopic()] == nil || got[identity.Of(holder).RequestTopic()].agent.Namespace != "acme" {
		t.Fatalf("gated set %v, want only acme/demo/governed held by namespace acme", got)
	}
}

// BenchmarkGatedFrom: one resync's cost of turning the Agent cache into
// the gated set, by fleet size; it runs after every Agent change.
func BenchmarkGatedFrom(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("agents=%d", n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(1, 2))
			all := make([]a2av1.Agent, n)
			objs := []client.Object{}
			for i := range all {
				org := fmt.Sprintf("team-%d", r.IntN(5))
				all[i] = *testAgent(org, fmt.Sprintf("agent-%d", i), org, fmt.Sprintf("unit%d", r.IntN(3)), i, nil, a2av1.CallersSpec{})
				objs = append(objs, &all[i])
			}
			reader := readerOf(b, objs...)
			reg := &registry{log: logr.Discard()}
			b.ReportAllocs()
			for b.Loop() {
				v, err := (&tenancy.Authorizer{Reader: reader}).View(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				if got, err := reg.gatedFrom(context.Background(), v, all, nil); err != nil || len(got) != n {
					b.Fatalf("%d gated agents (%v), want %d", len(got), err, n)
				}
			}
		})
	}
}
