package convservice

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// fleetOf is n Agents in a few namespaces and units, labelled by role, each
// admitting callers by scope and by a role selector (some across every
// namespace), with status as the operator writes it for a gated agent.
func fleetOf(n int, r *rand.Rand) []a2av1.Agent {
	roles := []string{"planner", "worker", "critic"}
	all := make([]a2av1.Agent, n)
	for i := range all {
		a := &all[i]
		a.Namespace, a.Name = fmt.Sprintf("team-%d", r.IntN(5)), fmt.Sprintf("agent-%d", i)
		a.Labels = map[string]string{"role": roles[r.IntN(len(roles))]}
		a.Spec.OrgID, a.Spec.UnitID = fmt.Sprintf("org%d", r.IntN(3)), fmt.Sprintf("unit%d", r.IntN(3))
		a.Spec.Callers.Scope = []a2av1.CallerScope{a2av1.CallerScopeNone, a2av1.CallerScopeSameUnit, a2av1.CallerScopeSameOrg}[r.IntN(3)]
		from := a2av1.CallerSelector{AgentSelector: metav1.LabelSelector{MatchLabels: map[string]string{"role": roles[r.IntN(len(roles))]}}}
		if r.IntN(10) == 0 {
			from.NamespaceSelector = &metav1.LabelSelector{}
		}
		if r.IntN(4) > 0 {
			a.Spec.Callers.From = []a2av1.CallerSelector{from}
		}
		if r.IntN(20) > 0 { // a few not registered yet
			a.Status.ClientID = a.Spec.OrgID + "/" + a.Spec.UnitID + "/" + a.Name
			a.Status.Topics = &a2av1.AgentTopics{Delivery: "$a2a/v1/delivery/" + a.Status.ClientID}
		}
	}
	return all
}

// referenceAdmits is the admission rule stated directly over the whole
// fleet: scope, then any registered Agent a callers.from entry selects.
func referenceAdmits(target *a2av1.Agent, self a2amqtt.AgentRef, all []a2av1.Agent, ref a2amqtt.AgentRef) bool {
	switch target.Spec.Callers.Scope {
	case a2av1.CallerScopeSameUnit:
		if ref.Org == self.Org && ref.Unit == self.Unit {
			return true
		}
	case a2av1.CallerScopeSameOrg:
		if ref.Org == self.Org {
			return true
		}
	}
	for _, from := range target.Spec.Callers.From {
		sel, err := metav1.LabelSelectorAsSelector(&from.AgentSelector)
		if err != nil {
			continue
		}
		for i := range all {
			o := &all[i]
			if o.Status.ClientID != ref.ClientID() || o.Status.ClientID == "" {
				continue
			}
			if from.NamespaceSelector != nil || (o.Namespace == target.Namespace && sel.Matches(labels.Set(o.Labels))) {
				return true
			}
		}
	}
	return false
}

// TestCallerSetMatchesReference: the shared directory admits exactly whom
// the rule stated over the whole fleet admits, for every pair of a random
// fleet (and for callers that are not registered).
func TestCallerSetMatchesReference(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 11))
		all := fleetOf(60, r)
		dir := newAgentDirectory(all)
		callers := []a2amqtt.AgentRef{{Org: "org0", Unit: "unit0", Agent: "ghost"}}
		for i := range all {
			callers = append(callers, a2amqtt.AgentRef{Org: all[i].Spec.OrgID, Unit: all[i].Spec.UnitID, Agent: all[i].Name})
		}
		admitted := 0
		for i := range all {
			target := &all[i]
			self := a2amqtt.AgentRef{Org: target.Spec.OrgID, Unit: target.Spec.UnitID, Agent: target.Name}
			cs := newCallerSet(target, self, dir)
			for _, ref := range callers {
				got, want := cs.admits(ref), referenceAdmits(target, self, all, ref)
				if got != want {
					t.Fatalf("seed %d: %s admits %v = %v, the rule says %v", seed, target.Name, ref, got, want)
				}
				if got {
					admitted++
				}
			}
		}
		if admitted == 0 || admitted == len(all)*len(callers) {
			t.Fatalf("seed %d: %d admitted pairs: the fleet does not exercise the rule", seed, admitted)
		}
	}
}

// BenchmarkGatedFrom: one resync's cost of turning the Agent cache into
// the gated set, by fleet size; it runs after every Agent change.
func BenchmarkGatedFrom(b *testing.B) {
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("agents=%d", n), func(b *testing.B) {
			all := fleetOf(n, rand.New(rand.NewPCG(1, 2)))
			r := &registry{s: &Service{log: logr.Discard()}}
			b.ReportAllocs()
			for b.Loop() {
				if got := r.gatedFrom(all, nil); len(got) == 0 {
					b.Fatal("no gated agents")
				}
			}
		})
	}
}
