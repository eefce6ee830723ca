package controllers_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
)

// TestTenantLimits: a Tenant's maxAgents refuses its newest Agents beyond the limit (no client ID,
// no topics, no credentials: a refused identity leaves no trace in status), a deletion lets the
// next one in at once; its policy ceilings bound what a namespace's ConversationPolicy asks for,
// and the policy says so.
func TestTenantLimits(t *testing.T) {
	ctx := context.Background()
	ns := plainNamespace(t)
	two, fifty := int32(2), int32(50)
	tn := &a2av1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: "lim-" + ns}, Spec: a2av1.TenantSpec{OrgID: "lim-" + ns, Namespaces: []string{ns},
		Limits: &a2av1.TenantLimits{MaxAgents: &two, ConversationPolicy: &a2av1.PolicyCeilings{MaxActiveContextsPerAgent: &fifty}}}}
	if err := k8s.Create(ctx, tn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), tn) })
	for _, name := range []string{"a1", "a2", "a3"} {
		if err := applyYAML(ns, agentManifest(name, tn.Spec.OrgID, "u", nil, "")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(1100 * time.Millisecond) // creationTimestamp has one-second resolution: a3 is the newest
	}
	permitted := func(name string, want bool) func() error {
		return func() error {
			a := getAgent(t, ns, name)
			c := meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionIdentityPermitted)
			switch {
			case c == nil:
				return fmt.Errorf("%s: no IdentityPermitted yet", name)
			case want && c.Status != metav1.ConditionTrue:
				return fmt.Errorf("%s: IdentityPermitted = %+v", name, c)
			case want && a.Status.ClientID == "":
				return fmt.Errorf("%s: permitted without a client ID in status", name)
			case !want && (c.Status != metav1.ConditionFalse || c.Reason != a2av1.ReasonAgentLimitExceeded ||
				!strings.Contains(c.Message, "allows 2 (limits.maxAgents)")):
				return fmt.Errorf("%s: IdentityPermitted = %+v, want AgentLimitExceeded", name, c)
			case !want && (a.Status.ClientID != "" || a.Status.Topics != nil || a.Status.CredentialsSecret != ""):
				return fmt.Errorf("%s: refused, yet status shows client ID %q, topics %+v, credentials %q", name, a.Status.ClientID, a.Status.Topics, a.Status.CredentialsSecret)
			}
			return nil
		}
	}
	eventually(t, "the two oldest are permitted", func() error {
		if err := permitted("a1", true)(); err != nil {
			return err
		}
		return permitted("a2", true)()
	})
	eventually(t, "the newest is refused", permitted("a3", false))

	if err := k8s.Delete(ctx, &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "a1"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a deletion lets the newest in", permitted("a3", true))

	// The namespace's policy asks for a million active contexts: the Tenant's 50 applies.
	for name, contexts := range map[string]int{"greedy": 1000000, "modest": 10} {
		if err := applyYAML(ns, policyManifest(name, 0, "")+fmt.Sprintf("  maxActiveContextsPerAgent: %d\n", contexts)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "WithinLimits reported", func() error {
		for name, want := range map[string]struct {
			status metav1.ConditionStatus
			reason string
			msg    string
		}{
			"greedy": {metav1.ConditionFalse, a2av1.ReasonTenantLimitExceeded, "maxActiveContextsPerAgent 1000000 exceeds the ceiling 50"},
			"modest": {metav1.ConditionTrue, a2av1.ReasonWithinLimits, "within Tenant " + tn.Name},
		} {
			p := getPolicy(t, ns, name)
			c := meta.FindStatusCondition(p.Status.Conditions, a2av1.ConditionWithinLimits)
			if c == nil || c.Status != want.status || c.Reason != want.reason || !strings.Contains(c.Message, want.msg) {
				return fmt.Errorf("%s: WithinLimits = %+v", name, c)
			}
		}
		return nil
	})
}

// TestAgentCountsFollowTheCache: the Tenant limit's count (tenancy.AgentCounts, kept by an Agent
// informer's event handler instead of listing every Agent of a Tenant in every reconcile) says
// what a list of the same cache says, as Agents come and go.
func TestAgentCountsFollowTheCache(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nsA, nsB := plainNamespace(t), plainNamespace(t)
	c, err := cache.New(restCfg, cache.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		t.Fatal("cache did not sync")
	}
	counts := tenancy.NewAgentCounts(c)
	listed := func(ns string) int {
		var l a2av1.AgentList
		if err := c.List(ctx, &l, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		return len(l.Items)
	}
	agree := func(what string) {
		t.Helper()
		eventually(t, what, func() error {
			for _, ns := range []string{nsA, nsB} {
				n, ok := counts.AgentCount(ns)
				if !ok || n != listed(ns) {
					return fmt.Errorf("%s: counted %d (ok %v), the cache lists %d", ns, n, ok, listed(ns))
				}
			}
			return nil
		})
	}
	for i := range 7 {
		ns := nsA
		if i%3 == 0 {
			ns = nsB
		}
		if err := applyYAML(ns, agentManifest(fmt.Sprintf("c%d", i), "cnt-"+nsA, "u", nil, "")); err != nil {
			t.Fatal(err)
		}
	}
	agree("counts after creates")
	if n, _ := counts.AgentCount(nsA); n != 4 {
		t.Fatalf("%s holds %d Agents by the count, want 4", nsA, n)
	}
	for _, name := range []string{"c1", "c2"} {
		a := getAgent(t, nsA, name)
		if err := k8s.Delete(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	// Deleted Agents count until they are gone from the cache (their finalizer removed), as a
	// list of the cache would.
	eventually(t, "the deleted Agents are gone", func() error {
		if n := listed(nsA); n != 2 {
			return fmt.Errorf("%d listed", n)
		}
		return nil
	})
	agree("counts after deletes")
}
