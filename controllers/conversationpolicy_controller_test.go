package controllers_test

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
)

func policyManifest(name string, priority int, matchLabels string) string {
	return fmt.Sprintf(`apiVersion: a2a.fleet.dev/v1alpha1
kind: ConversationPolicy
metadata:
  name: %s
spec:
  priority: %d
  agentSelector:
    matchLabels: {%s}
`, name, priority, matchLabels)
}

func expectPolicyOf(t *testing.T, ns string, want map[string]string) {
	t.Helper()
	eventually(t, fmt.Sprintf("agents governed by %v", want), func() error {
		for agent, policy := range want {
			if got := getAgent(t, ns, agent).Status.ConversationPolicy; got != policy {
				return fmt.Errorf("agent %s: policy %q, want %q", agent, got, policy)
			}
		}
		return nil
	})
}

type policyView struct {
	matched, applied int32
	names            []string
	conflicted       metav1.ConditionStatus
	conflicts        []a2av1.PolicyConflict
}

func expectPolicyStatus(t *testing.T, ns, name string, want policyView) {
	t.Helper()
	eventually(t, "status of policy "+name, func() error {
		p := getPolicy(t, ns, name)
		if p.Status.ObservedGeneration != p.Generation {
			return fmt.Errorf("observedGeneration %d, generation %d", p.Status.ObservedGeneration, p.Generation)
		}
		got := policyView{p.Status.MatchedAgents, p.Status.AppliedAgents, p.Status.MatchedAgentNames, "", p.Status.Conflicts}
		reason := a2av1.ReasonNoOverlap
		if want.conflicted == metav1.ConditionTrue {
			reason = a2av1.ReasonOverlappingPolicies
		}
		if err := conditionIs(p.Status.Conditions, p.Generation, a2av1.ConditionConflicted, want.conflicted, reason); err != nil {
			return err
		}
		ready, readyReason := metav1.ConditionTrue, a2av1.ReasonSelectorResolved
		if want.matched == 0 {
			ready, readyReason = metav1.ConditionFalse, a2av1.ReasonNoAgentsSelected
		}
		if err := conditionIs(p.Status.Conditions, p.Generation, a2av1.ConditionReady, ready, readyReason); err != nil {
			return err
		}
		got.conflicted = want.conflicted
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("status %+v, want %+v", got, want)
		}
		return nil
	})
}

func TestPolicySelectionPrecedenceAndConflicts(t *testing.T) {
	ns := newNamespace(t)
	for name, labels := range map[string]map[string]string{
		"a1": {"tier": "gold"},
		"a2": {"tier": "silver"},
		"a3": {"tier": "gold", "team": "x"},
	} {
		if err := applyYAML(ns, agentManifest(name, "acme", "u", labels, "")); err != nil {
			t.Fatalf("create agent %s: %v", name, err)
		}
	}
	if err := applyYAML(ns, policyManifest("gold", 0, "tier: gold")); err != nil {
		t.Fatalf("create policy: %v", err)
	}
	expectPolicyOf(t, ns, map[string]string{"a1": "gold", "a2": "", "a3": "gold"})
	expectPolicyStatus(t, ns, "gold", policyView{2, 2, []string{"a1", "a3"}, metav1.ConditionFalse, nil})

	// A higher-priority policy takes a3; both policies report the conflict.
	if err := applyYAML(ns, policyManifest("team-x", 10, "team: x")); err != nil {
		t.Fatalf("create policy: %v", err)
	}
	conflict := []a2av1.PolicyConflict{{Agent: "a3", Policies: []string{"team-x", "gold"}, AppliedPolicy: "team-x"}}
	expectPolicyOf(t, ns, map[string]string{"a1": "gold", "a3": "team-x"})
	expectPolicyStatus(t, ns, "gold", policyView{2, 1, []string{"a1", "a3"}, metav1.ConditionTrue, conflict})
	expectPolicyStatus(t, ns, "team-x", policyView{1, 1, []string{"a3"}, metav1.ConditionTrue, conflict})
	eventually(t, "conflict event on the policy", func() error { return expectEvent(ns, "gold", controllers.EventPolicyConflict) })

	// Relabelling re-selects without any change to the policies.
	updateAgent(t, ns, "a3", func(a *a2av1.Agent) { delete(a.Labels, "team") })
	updateAgent(t, ns, "a2", func(a *a2av1.Agent) { a.Labels["tier"] = "gold" })
	expectPolicyOf(t, ns, map[string]string{"a1": "gold", "a2": "gold", "a3": "gold"})
	expectPolicyStatus(t, ns, "gold", policyView{3, 3, []string{"a1", "a2", "a3"}, metav1.ConditionFalse, nil})
	expectPolicyStatus(t, ns, "team-x", policyView{0, 0, nil, metav1.ConditionFalse, nil})

	// Changing a selector moves Agents out of the policy.
	updatePolicy(t, ns, "gold", func(p *a2av1.ConversationPolicy) {
		p.Spec.AgentSelector.MatchLabels = map[string]string{"tier": "platinum"}
	})
	expectPolicyOf(t, ns, map[string]string{"a1": "", "a2": "", "a3": ""})

	// Deleting a policy releases its Agents to the next one in line.
	updatePolicy(t, ns, "gold", func(p *a2av1.ConversationPolicy) {
		p.Spec.AgentSelector.MatchLabels = map[string]string{"tier": "gold"}
	})
	updateAgent(t, ns, "a1", func(a *a2av1.Agent) { a.Labels["team"] = "x" })
	expectPolicyOf(t, ns, map[string]string{"a1": "team-x"})
	if err := k8s.Delete(context.Background(), getPolicy(t, ns, "team-x")); err != nil {
		t.Fatalf("delete policy: %v", err)
	}
	expectPolicyOf(t, ns, map[string]string{"a1": "gold"})
	expectPolicyStatus(t, ns, "gold", policyView{3, 3, []string{"a1", "a2", "a3"}, metav1.ConditionFalse, nil})
}

func TestPolicyPrecedenceOlderWinsOnEqualPriority(t *testing.T) {
	ns := newNamespace(t)
	if err := applyYAML(ns, agentManifest("a", "acme", "u", map[string]string{"x": "1"}, "")); err != nil {
		t.Fatalf("create agent: %v", err)
	}
	// "zz-old" is created first: age beats the alphabetical order of names.
	if err := applyYAML(ns, policyManifest("zz-old", 5, "x: \"1\"")); err != nil {
		t.Fatalf("create policy: %v", err)
	}
	// creationTimestamp has one-second resolution: make the second policy strictly younger.
	time.Sleep(1100 * time.Millisecond)
	if err := applyYAML(ns, policyManifest("aa-new", 5, "x: \"1\"")); err != nil {
		t.Fatalf("create policy: %v", err)
	}
	expectPolicyOf(t, ns, map[string]string{"a": "zz-old"})
	conflict := []a2av1.PolicyConflict{{Agent: "a", Policies: []string{"zz-old", "aa-new"}, AppliedPolicy: "zz-old"}}
	expectPolicyStatus(t, ns, "aa-new", policyView{1, 0, []string{"a"}, metav1.ConditionTrue, conflict})
	eventually(t, "overlap event on the agent", func() error { return expectEvent(ns, "a", a2av1.ReasonOverlappingPolicies) })
}

// TestPolicyInvalidSelector: a selector that passes admission (operators and values are checked
// there) but cannot be evaluated, here by its label key, is reported.
func TestPolicyInvalidSelector(t *testing.T) {
	ns := newNamespace(t)
	manifest := `apiVersion: a2a.fleet.dev/v1alpha1
kind: ConversationPolicy
metadata:
  name: broken
spec:
  agentSelector:
    matchExpressions:
    - {key: 'not a label key!', operator: Exists}
`
	if err := applyYAML(ns, manifest); err != nil {
		t.Fatalf("create policy: %v", err)
	}
	eventually(t, "invalid selector reported", func() error {
		p := getPolicy(t, ns, "broken")
		return conditionIs(p.Status.Conditions, p.Generation, a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonInvalidSelector)
	})
}

func TestPolicyStatusListsAreBounded(t *testing.T) {
	ns := newNamespace(t)
	const n = controllers.MaxStatusListItems + 5
	for i := 0; i < n; i++ {
		if err := applyYAML(ns, agentManifest(fmt.Sprintf("bulk-%03d", i), "acme", "bulk", map[string]string{"bulk": "yes"}, "")); err != nil {
			t.Fatalf("create agent: %v", err)
		}
	}
	if err := applyYAML(ns, policyManifest("all", 0, "")); err != nil {
		t.Fatalf("create policy: %v", err)
	}
	eventually(t, "counts exact, names bounded", func() error {
		p := getPolicy(t, ns, "all")
		if p.Status.MatchedAgents != n || len(p.Status.MatchedAgentNames) != controllers.MaxStatusListItems {
			return fmt.Errorf("matched %d names %d", p.Status.MatchedAgents, len(p.Status.MatchedAgentNames))
		}
		return nil
	})
}
