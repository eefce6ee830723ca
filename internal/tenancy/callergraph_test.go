package tenancy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
)

// randomFleet builds Agents over a few namespaces and a small label alphabet, so that rules
// often cover each other: own-namespace and namespace-selector rules, matchLabels and
// matchExpressions, empty selectors, invalid selectors, and identities claimed twice.
type randomFleet struct {
	rnd        *rand.Rand
	namespaces []string
	seq        int
}

func (f *randomFleet) labels() map[string]string {
	out := map[string]string{}
	for _, k := range []string{"app", "tier"} {
		if f.rnd.IntN(3) > 0 {
			out[k] = []string{"a", "b", "c"}[f.rnd.IntN(3)]
		}
	}
	return out
}

func (f *randomFleet) rule() a2av1.CallerSelector {
	var r a2av1.CallerSelector
	switch f.rnd.IntN(5) {
	case 0: // empty: every Agent (of the namespace rule)
	case 1:
		r.AgentSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}}
	case 2:
		r.AgentSelector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Bogus"}} // invalid: covers nobody
	default:
		r.AgentSelector.MatchLabels = f.labels()
	}
	switch f.rnd.IntN(4) {
	case 0:
		r.NamespaceSelector = &metav1.LabelSelector{}
	case 1:
		r.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "red"}}
	}
	return r
}

func (f *randomFleet) agent() *a2av1.Agent {
	f.seq++
	ns := f.namespaces[f.rnd.IntN(len(f.namespaces))]
	org := ns
	if f.rnd.IntN(8) == 0 {
		org = f.namespaces[f.rnd.IntN(len(f.namespaces))] // may claim another namespace's org: not permitted
	}
	a := &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{
		Name: fmt.Sprintf("a%d", f.seq), Namespace: ns, UID: types.UID(fmt.Sprintf("uid-%d", f.seq)), Labels: f.labels(),
		CreationTimestamp: metav1.NewTime(time.Unix(1_700_000_000+int64(f.seq), 0)), Generation: 1,
	}, Spec: a2av1.AgentSpec{OrgID: org, UnitID: "u", AgentID: fmt.Sprintf("x%d", f.rnd.IntN(40))}}
	for range f.rnd.IntN(3) {
		a.Spec.Callers.From = append(a.Spec.Callers.From, f.rule())
	}
	return a
}

// bruteCandidates is what Candidates must return: every other Agent a rule matches by labels.
func bruteCandidates(owner *a2av1.Agent, all []*a2av1.Agent) []string {
	rules, _ := CompileCallerRules(owner)
	var out []string
	for _, a := range all {
		if a.UID != owner.UID && slices.ContainsFunc(rules, func(r CallerRule) bool { return r.MatchesLabels(a) }) {
			out = append(out, a.Name)
		}
	}
	slices.Sort(out)
	return out
}

func bruteOwners(agent *a2av1.Agent, all []*a2av1.Agent) []string {
	var out []string
	for _, o := range all {
		if o.UID != agent.UID && slices.Contains(bruteCandidates(o, all), agent.Name) {
			out = append(out, o.Name)
		}
	}
	slices.Sort(out)
	return out
}

func names(agents []*a2av1.Agent) []string {
	out := make([]string, 0, len(agents))
	for _, a := range agents {
		out = append(out, a.Name)
	}
	slices.Sort(out)
	return out
}

// The graph's indexes answer what a scan of every rule against every Agent answers, after any
// sequence of creations, changes and deletions; and each change reports every Agent whose
// answers it changed.
func TestCallerGraphIsTheScanOfEveryRule(t *testing.T) {
	for seed := range uint64(40) {
		f := &randomFleet{rnd: rand.New(rand.NewPCG(seed, 1)), namespaces: []string{"ns0", "ns1", "ns2"}}
		g := NewCallerGraph()
		var all []*a2av1.Agent
		for step := range 60 {
			before := map[string][2][]string{}
			for _, a := range all {
				before[a.Name] = [2][]string{bruteCandidates(a, all), bruteOwners(a, all)}
			}
			var touched []types.NamespacedName
			var changed string
			switch op := f.rnd.IntN(4); {
			case op == 0 && len(all) > 0: // delete
				i := f.rnd.IntN(len(all))
				changed = all[i].Name
				touched = g.Remove(all[i])
				all = slices.Delete(all, i, i+1)
			case op == 1 && len(all) > 0: // change labels or rules
				i := f.rnd.IntN(len(all))
				old, next := all[i], all[i].DeepCopy()
				next.Labels = f.labels()
				if f.rnd.IntN(2) == 0 {
					next.Generation++
					next.Spec.Callers.From = []a2av1.CallerSelector{f.rule()}
				}
				changed = next.Name
				touched = g.Upsert(old, next)
				all[i] = next
			default:
				a := f.agent()
				changed = a.Name
				touched = g.Upsert(nil, a)
				all = append(all, a)
			}
			for _, a := range all {
				cands, owners := bruteCandidates(a, all), bruteOwners(a, all)
				if got := names(g.Candidates(a)); !slices.Equal(got, cands) {
					t.Fatalf("seed %d step %d: Candidates(%s) = %v, the scan says %v", seed, step, a.Name, got, cands)
				}
				if got := names(g.RulesCovering(a)); !slices.Equal(got, owners) {
					t.Fatalf("seed %d step %d: RulesCovering(%s) = %v, the scan says %v", seed, step, a.Name, got, owners)
				}
				b, known := before[a.Name]
				if a.Name == changed || !known || (slices.Equal(b[0], cands) && slices.Equal(b[1], owners)) {
					continue
				}
				if !slices.ContainsFunc(touched, func(k types.NamespacedName) bool { return k.Name == a.Name }) {
					t.Fatalf("seed %d step %d: changing %s changed %s's relations, which the graph did not report (%v)", seed, step, changed, a.Name, touched)
				}
			}
		}
	}
}

func fleetReader(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := a2av1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	b := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithIndex(&a2av1.Agent{}, identity.IndexAgentClientID, func(o client.Object) []string {
			return []string{identity.Of(o.(*a2av1.Agent)).ClientID()}
		}).
		WithIndex(&a2av1.Agent{}, identity.IndexAgentPool, func(o client.Object) []string {
			if a := o.(*a2av1.Agent); a.Spec.PoolID != "" {
				return []string{PoolKey(a)}
			}
			return nil
		}).
		WithIndex(&a2av1.Agent{}, identity.IndexAgentCallerRule, func(o client.Object) []string {
			a := o.(*a2av1.Agent)
			var out []string
			for i := range a.Spec.Callers.From {
				if k := RuleIndexKey(a.Namespace, &a.Spec.Callers.From[i]); !slices.Contains(out, k) {
					out = append(out, k)
				}
			}
			return out
		})
	return b.Build()
}

// Callers (the enumeration the ACLs are compiled from) and Callees are exactly the live Agents
// Selects (the predicate the conversation service admits by) relates, over random fleets with
// namespace labels and AgentGrants; with the caller graph and without it (the cache's index).
func TestCallersIsSelects(t *testing.T) {
	ctx := context.Background()
	for seed := range uint64(8) {
		f := &randomFleet{rnd: rand.New(rand.NewPCG(seed, 2)), namespaces: []string{"ns0", "ns1", "ns2", "ns3"}}
		var objs []client.Object
		for i, ns := range f.namespaces {
			l := map[string]string{}
			if i%2 == 0 {
				l["team"] = "red"
			}
			objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: l}})
		}
		for i, ns := range f.namespaces {
			if f.rnd.IntN(2) == 0 {
				to := a2av1.AgentGrantTo{Kind: a2av1.AgentGrantCallers}
				if f.rnd.IntN(2) == 0 {
					to.AgentSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "a"}}
				}
				objs = append(objs, &a2av1.AgentGrant{ObjectMeta: metav1.ObjectMeta{Name: "g", Namespace: ns}, Spec: a2av1.AgentGrantSpec{
					From: []a2av1.AgentGrantFrom{{Namespace: f.namespaces[(i+1)%len(f.namespaces)]}}, To: []a2av1.AgentGrantTo{to}}})
			}
		}
		graph := NewCallerGraph()
		for _, o := range objs {
			switch o := o.(type) {
			case *corev1.Namespace:
				graph.UpsertNamespace(o)
			case *a2av1.AgentGrant:
				graph.UpsertGrant(o)
			}
		}
		for range 40 {
			a := f.agent()
			objs = append(objs, a)
			graph.Upsert(nil, a)
		}
		reader := fleetReader(t, objs...)
		// The fake client sets resourceVersions: read the Agents back, as a cache holds them.
		var stored a2av1.AgentList
		if err := reader.List(ctx, &stored); err != nil {
			t.Fatal(err)
		}
		for _, withGraph := range []bool{true, false} {
			a := &Authorizer{Reader: reader}
			if withGraph {
				a.Graph = graph
			}
			v, err := a.View(ctx)
			if err != nil {
				t.Fatal(err)
			}
			checkCallersIsSelects(t, ctx, v, &stored, fmt.Sprintf("seed %d graph %v", seed, withGraph))
		}
	}
}

func checkCallersIsSelects(t *testing.T, ctx context.Context, v *View, fleet *a2av1.AgentList, what string) {
	t.Helper()
	related := 0
	for i := range fleet.Items {
		callee := &fleet.Items[i]
		if err := validCallers(callee); err != nil {
			continue // the controller refuses it before it asks
		}
		var want []string
		for j := range fleet.Items {
			c := &fleet.Items[j]
			live, err := v.Live(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			sel, err := v.Selects(ctx, callee, c)
			if err != nil {
				t.Fatal(err)
			}
			if live && sel {
				want = append(want, c.Name)
			}
		}
		slices.Sort(want)
		got, _, err := v.Callers(ctx, callee)
		if err != nil {
			t.Fatal(err)
		}
		if names(got) == nil && want == nil {
			continue
		}
		if !slices.Equal(names(got), want) {
			t.Fatalf("%s: Callers(%s) = %v, the live Agents Selects admits are %v", what, callee.Name, names(got), want)
		}
		related += len(want)
	}
	for i := range fleet.Items {
		agent := &fleet.Items[i]
		var want []string
		for j := range fleet.Items {
			callee := &fleet.Items[j]
			live, err := v.Live(ctx, callee)
			if err != nil {
				t.Fatal(err)
			}
			sel, err := v.Selects(ctx, callee, agent)
			if err != nil {
				t.Fatal(err)
			}
			if live && sel {
				want = append(want, callee.Name)
			}
		}
		slices.Sort(want)
		got, err := v.Callees(ctx, agent)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(names(got), want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("%s: Callees(%s) = %v, the live Agents whose rules Selects it are %v", what, agent.Name, names(got), want)
		}
	}
	if related == 0 {
		t.Fatalf("%s: no caller relation at all: the fleet does not exercise the rule", what)
	}
}

func validCallers(a *a2av1.Agent) error {
	_, err := CompileCallerRules(a)
	return err
}

// One View answers from many goroutines at once (the conversation service shares one per
// generation), with the same answers as one goroutine.
func TestViewIsSafeForConcurrentUse(t *testing.T) {
	ctx := context.Background()
	f := &randomFleet{rnd: rand.New(rand.NewPCG(7, 3)), namespaces: []string{"ns0", "ns1"}}
	var objs []client.Object
	for _, ns := range f.namespaces {
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}
	for range 30 {
		objs = append(objs, f.agent())
	}
	reader := fleetReader(t, objs...)
	var fleet a2av1.AgentList
	if err := reader.List(ctx, &fleet); err != nil {
		t.Fatal(err)
	}
	answers := func(v *View) []bool {
		var out []bool
		for i := range fleet.Items {
			for j := range fleet.Items {
				ok, err := v.AdmitsCaller(ctx, &fleet.Items[i], &fleet.Items[j])
				if err != nil {
					t.Error(err)
				}
				out = append(out, ok)
			}
		}
		return out
	}
	serial, err := (&Authorizer{Reader: reader}).View(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := answers(serial)
	shared, err := (&Authorizer{Reader: reader}).View(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if got := answers(shared); !slices.Equal(got, want) {
				t.Error("a View shared by goroutines answered differently from one used alone")
			}
		})
	}
	wg.Wait()
}

// The graph is read while the informer's handler changes it: readers see whole Agents, never a
// half-filed one (run with -race).
func TestCallerGraphReadsWhileItChanges(t *testing.T) {
	f := &randomFleet{rnd: rand.New(rand.NewPCG(11, 4)), namespaces: []string{"ns0", "ns1"}}
	g := NewCallerGraph()
	var fleet []*a2av1.Agent
	for range 50 {
		a := f.agent()
		fleet = append(fleet, a)
		g.Upsert(nil, a)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for round := range 20 {
			for i, a := range fleet {
				next := a.DeepCopy()
				next.Labels = map[string]string{"app": []string{"a", "b"}[(i+round)%2]}
				g.Upsert(a, next)
				fleet[i] = next
			}
		}
	})
	for range 4 {
		// An empty selector with an empty namespace selector covers every Agent.
		probe := f.agent()
		probe.Spec.Callers.From = []a2av1.CallerSelector{{NamespaceSelector: &metav1.LabelSelector{}}}
		wg.Go(func() {
			for range 200 {
				if got := len(g.Candidates(probe)); got != len(fleet) {
					t.Errorf("a read during changes saw %d Agents, want all %d", got, len(fleet))
					return
				}
				_ = g.RulesCovering(probe)
			}
		})
	}
	wg.Wait()
}
