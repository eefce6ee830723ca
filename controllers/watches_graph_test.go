package controllers

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache/informertest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllertest"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
)

// The Agent controller learns of caller relations changed by a Namespace's labels or an
// AgentGrant from the caller graph's reports (the Namespace and AgentGrant watches no longer map
// them): relabelling a namespace into the owner's namespace selector, consent and its withdrawal
// each enqueue the owner and the caller concerned; a relabelling no selector distinguishes, a
// resync and a Pools grant enqueue nobody.
func TestCallerGraphSourceEnqueuesNamespaceAndGrantChanges(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := a2av1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	// controller-runtime's informers for tests: the graph's handlers run as on the manager's.
	informers := &informertest.FakeInformers{Scheme: scheme}
	g := tenancy.NewCallerGraph()
	if err := g.Watch(ctx, informers); err != nil {
		t.Fatal(err)
	}
	inf := func(obj client.Object) *controllertest.FakeInformer {
		i, err := informers.FakeInformerFor(ctx, obj)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	agents, namespaces, grants := inf(&a2av1.Agent{}), inf(&corev1.Namespace{}), inf(&a2av1.AgentGrant{})
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	if err := callerGraphSource(g).Start(ctx, q); err != nil {
		t.Fatal(err)
	}
	owner := &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: "a", UID: "owner"}, Spec: a2av1.AgentSpec{Callers: a2av1.CallersSpec{
		From: []a2av1.CallerSelector{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "red"}}}}}}}
	caller := &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Name: "caller", Namespace: "b", UID: "caller"}}
	bystander := &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Name: "bystander", Namespace: "c", UID: "bystander"}}
	for _, a := range []*a2av1.Agent{owner, caller, bystander} {
		agents.Add(a)
	}
	drain := func() []string {
		var out []string
		for q.Len() > 0 {
			r, _ := q.Get()
			out = append(out, r.Namespace+"/"+r.Name)
			q.Forget(r)
			q.Done(r)
		}
		slices.Sort(out)
		return out
	}
	drain() // the Agents' own reports (rules that may cover by labels)
	nsB := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "b"}}
	namespaces.Add(nsB)
	if got := drain(); len(got) != 0 {
		t.Fatalf("a namespace no selector matches enqueued %v", got)
	}
	both := []string{"a/owner", "b/caller"}
	grant := &a2av1.AgentGrant{ObjectMeta: metav1.ObjectMeta{Name: "consent", Namespace: "b", Generation: 1}, Spec: a2av1.AgentGrantSpec{
		From: []a2av1.AgentGrantFrom{{Namespace: "a"}}, To: []a2av1.AgentGrantTo{{Kind: a2av1.AgentGrantCallers}}}}
	pools := &a2av1.AgentGrant{ObjectMeta: metav1.ObjectMeta{Name: "pools", Namespace: "b", Generation: 1}, Spec: a2av1.AgentGrantSpec{
		From: []a2av1.AgentGrantFrom{{Namespace: "a"}}, To: []a2av1.AgentGrantTo{{Kind: a2av1.AgentGrantPools}}}}
	for _, step := range []struct {
		what   string
		change func()
		want   []string
	}{
		{"the caller's namespace labelled into the selector", func() {
			namespaces.Update(nsB, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "b", Labels: map[string]string{"team": "red"}}})
		}, both},
		{"a namespace labelled outside every selector", func() {
			namespaces.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "c", Labels: map[string]string{"team": "blue"}}})
		}, nil},
		{"that namespace labelled into the selector (its Agent covered, without consent)", func() {
			namespaces.Update(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "c"}},
				&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "c", Labels: map[string]string{"team": "red"}}})
		}, []string{"a/owner", "c/bystander"}},
		{"consent", func() { grants.Add(grant) }, both},
		{"the same grant again (a resync)", func() { grants.Update(grant, grant.DeepCopy()) }, nil},
		{"a Pools grant", func() { grants.Add(pools) }, nil},
		{"consent withdrawn", func() { grants.Delete(grant) }, both},
	} {
		step.change()
		if got := drain(); !slices.Equal(got, step.want) {
			t.Fatalf("%s enqueued %v, want %v", step.what, got, step.want)
		}
	}
}
