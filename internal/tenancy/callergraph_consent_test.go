package tenancy

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// consentWorld is what the graph is compiled from, held plainly: the Agents, the Namespaces'
// labels and the AgentGrants. brute answers from it by CallerRule.Covers and CallerGranted over
// every pair, as a cache scan would.
type consentWorld struct {
	agents []*a2av1.Agent
	ns     map[string]map[string]string
	grants map[types.NamespacedName]*a2av1.AgentGrant
}

// answers are an Agent's relations: admitted callers, callers covered without consent, callees.
type answers [3][]string

func (w *consentWorld) brute() map[string]answers {
	out := map[string]answers{}
	for _, owner := range w.agents {
		rules, _ := CompileCallerRules(owner)
		for _, c := range w.agents {
			if c.UID == owner.UID {
				continue
			}
			nsLabels := func() (labels.Set, error) { return labels.Set(w.ns[c.Namespace]), nil }
			if !slices.ContainsFunc(rules, func(r CallerRule) bool { ok, _ := r.Covers(c, nsLabels); return ok }) {
				continue
			}
			var grants []a2av1.AgentGrant
			for _, g := range w.grants {
				grants = append(grants, *g)
			}
			a, b := out[owner.Name], out[c.Name]
			if CallerGranted(grants, owner.Namespace, c) {
				a[0] = append(a[0], c.Name)
				b[2] = append(b[2], owner.Name)
			} else {
				a[1] = append(a[1], c.Name)
			}
			out[owner.Name], out[c.Name] = a, b
		}
	}
	for k, a := range out {
		for i := range a {
			slices.Sort(a[i])
		}
		out[k] = a
	}
	return out
}

func (f *randomFleet) grant(name string) *a2av1.AgentGrant {
	g := &a2av1.AgentGrant{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.namespaces[f.rnd.IntN(len(f.namespaces))]}}
	for _, ns := range f.namespaces {
		if f.rnd.IntN(2) == 0 {
			g.Spec.From = append(g.Spec.From, a2av1.AgentGrantFrom{Namespace: ns})
		}
	}
	for range 1 + f.rnd.IntN(2) {
		to := a2av1.AgentGrantTo{Kind: a2av1.AgentGrantCallers}
		switch f.rnd.IntN(4) {
		case 0:
			to.Kind = a2av1.AgentGrantPools
		case 1:
			to.AgentSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": []string{"a", "b"}[f.rnd.IntN(2)]}}
		}
		g.Spec.To = append(g.Spec.To, to)
	}
	return g
}

func (f *randomFleet) nsLabels() map[string]string {
	if f.rnd.IntN(2) == 0 {
		return map[string]string{"team": "red"}
	}
	return map[string]string{"team": "blue"}
}

// step applies one random change to w and g and returns what it reports and the Agent it
// changed ("" for a Namespace or an AgentGrant).
func (f *randomFleet) step(w *consentWorld, g *CallerGraph) (touched []types.NamespacedName, changed string) {
	switch op := f.rnd.IntN(8); {
	case op == 0 && len(w.agents) > 0:
		i := f.rnd.IntN(len(w.agents))
		changed = w.agents[i].Name
		touched = g.Remove(w.agents[i])
		w.agents = slices.Delete(w.agents, i, i+1)
	case op == 1 && len(w.agents) > 0:
		i := f.rnd.IntN(len(w.agents))
		old, next := w.agents[i], w.agents[i].DeepCopy()
		next.Labels = f.labels()
		if f.rnd.IntN(2) == 0 {
			next.Generation++
			next.Spec.Callers.From = []a2av1.CallerSelector{f.rule()}
		}
		changed = next.Name
		touched = g.Upsert(old, next)
		w.agents[i] = next
	case op == 2 || op == 3:
		ns := f.namespaces[f.rnd.IntN(len(f.namespaces))]
		if f.rnd.IntN(4) == 0 {
			delete(w.ns, ns)
			return g.RemoveNamespace(ns), ""
		}
		w.ns[ns] = f.nsLabels()
		return g.UpsertNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: maps.Clone(w.ns[ns])}}), ""
	case op == 4 || op == 5:
		name := fmt.Sprintf("g%d", f.rnd.IntN(4))
		next := f.grant(name)
		// A grant keeps its namespace: one of the same name elsewhere is another object.
		key := types.NamespacedName{Namespace: next.Namespace, Name: name}
		if old, ok := w.grants[key]; ok && f.rnd.IntN(3) == 0 {
			delete(w.grants, key)
			return g.RemoveGrant(old), ""
		}
		w.grants[key] = next
		return g.UpsertGrant(next), ""
	default:
		a := f.agent()
		changed = a.Name
		touched = g.Upsert(nil, a)
		w.agents = append(w.agents, a)
	}
	return touched, changed
}

// The graph's Callers and Callees, with namespace labels and consent, equal the scan of every
// pair after every change of an Agent, a Namespace or an AgentGrant; and each change reports
// every Agent whose admitted callers, covered-without-consent callers or callees it changed.
func TestCallerGraphConsentIsTheScanOfEveryPair(t *testing.T) {
	reported := 0
	for seed := range uint64(30) {
		f := &randomFleet{rnd: rand.New(rand.NewPCG(seed, 5)), namespaces: []string{"ns0", "ns1", "ns2"}}
		w := &consentWorld{ns: map[string]map[string]string{}, grants: map[types.NamespacedName]*a2av1.AgentGrant{}}
		g := NewCallerGraph()
		before := w.brute()
		for step := range 80 {
			touched, changed := f.step(w, g)
			after := w.brute()
			for _, a := range w.agents {
				want := after[a.Name]
				admitted, covered := g.Callers(a)
				got := answers{names(admitted), names(covered), names(g.Callees(a))}
				for i, what := range []string{"admitted callers", "callers without consent", "callees"} {
					if !slices.Equal(got[i], want[i]) && len(got[i])+len(want[i]) > 0 {
						t.Fatalf("seed %d step %d: %s of %s = %v, the scan says %v", seed, step, what, a.Name, got[i], want[i])
					}
				}
				for _, c := range w.agents {
					if g.Admits(a, c) != slices.Contains(want[0], c.Name) {
						t.Fatalf("seed %d step %d: Admits(%s, %s) disagrees with the scan", seed, step, a.Name, c.Name)
					}
				}
				if a.Name == changed || equalAnswers(before[a.Name], want) {
					continue
				}
				if !slices.ContainsFunc(touched, func(k types.NamespacedName) bool { return k.Name == a.Name }) {
					t.Fatalf("seed %d step %d: the change (agent %q) changed %s's relations, which the graph did not report (%v)", seed, step, changed, a.Name, touched)
				}
				reported++
			}
			before = after
		}
	}
	if reported == 0 {
		t.Fatal("no change changed another Agent's relations: the fleet does not exercise the graph")
	}
}

func equalAnswers(a, b answers) bool {
	for i := range a {
		if !slices.Equal(a[i], b[i]) && len(a[i])+len(b[i]) > 0 {
			return false
		}
	}
	return true
}

// A Namespace or AgentGrant change reports only Agents whose relations it changed: a grant of
// Pools, or a relabelling no selector distinguishes, reports nobody.
func TestCallerGraphReportsNothingForIrrelevantChanges(t *testing.T) {
	g := NewCallerGraph()
	caller := &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns1", UID: "c", Labels: map[string]string{"app": "a"}}}
	owner := &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Name: "o", Namespace: "ns0", UID: "o"}, Spec: a2av1.AgentSpec{Callers: a2av1.CallersSpec{
		From: []a2av1.CallerSelector{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "red"}}}}}}}
	g.Upsert(nil, caller)
	g.Upsert(nil, owner)
	if got := g.UpsertNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns1", Labels: map[string]string{"other": "x"}}}); len(got) != 0 {
		t.Fatalf("a label no selector reads reported %v", got)
	}
	if got := g.UpsertNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns1", Labels: map[string]string{"team": "red"}}}); len(got) != 2 {
		t.Fatalf("the label the owner's namespace selector matches reported %v, want the owner and the caller", got)
	}
	pools := &a2av1.AgentGrant{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns1"}, Spec: a2av1.AgentGrantSpec{
		From: []a2av1.AgentGrantFrom{{Namespace: "ns0"}}, To: []a2av1.AgentGrantTo{{Kind: a2av1.AgentGrantPools}}}}
	if got := g.UpsertGrant(pools); len(got) != 0 {
		t.Fatalf("a grant of Pools reported %v", got)
	}
	if g.Admits(owner, caller) {
		t.Fatal("admitted without consent")
	}
	callers := pools.DeepCopy()
	callers.Name, callers.Spec.To = "c", []a2av1.AgentGrantTo{{Kind: a2av1.AgentGrantCallers}}
	if got := g.UpsertGrant(callers); len(got) != 2 || !g.Admits(owner, caller) {
		t.Fatalf("consent reported %v (admitted %v), want the owner and the caller", got, g.Admits(owner, caller))
	}
}

// The graph is read while Namespaces and AgentGrants change: each read sees one state (run with
// -race): the probe's callers are all of ns1's Agents or none.
func TestCallerGraphConsentReadsWhileItChanges(t *testing.T) {
	f := &randomFleet{rnd: rand.New(rand.NewPCG(13, 6)), namespaces: []string{"ns1"}}
	g := NewCallerGraph()
	var fleet []*a2av1.Agent
	for range 30 {
		a := f.agent()
		a.Spec.Callers.From = nil
		fleet = append(fleet, a)
		g.Upsert(nil, a)
	}
	probe := &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "ns0", UID: "probe"}, Spec: a2av1.AgentSpec{Callers: a2av1.CallersSpec{
		From: []a2av1.CallerSelector{{NamespaceSelector: &metav1.LabelSelector{}}}}}}
	g.Upsert(nil, probe)
	grant := &a2av1.AgentGrant{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns1"}, Spec: a2av1.AgentGrantSpec{
		From: []a2av1.AgentGrantFrom{{Namespace: "ns0"}}, To: []a2av1.AgentGrantTo{{Kind: a2av1.AgentGrantCallers}}}}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 200 {
			g.UpsertNamespace(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns1", Labels: map[string]string{"n": fmt.Sprint(i)}}})
			if i%2 == 0 {
				g.UpsertGrant(grant)
			} else {
				g.RemoveGrant(grant)
			}
		}
	})
	for range 4 {
		wg.Go(func() {
			for range 200 {
				admitted, covered := g.Callers(probe)
				if len(admitted)+len(covered) != len(fleet) || (len(admitted) != 0 && len(admitted) != len(fleet)) {
					t.Errorf("a read during changes saw %d admitted and %d without consent of %d", len(admitted), len(covered), len(fleet))
					return
				}
				_ = g.Callees(fleet[0])
			}
		})
	}
	wg.Wait()
}
