package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/tenancy"
)

// TestAgentLimitAtTheLimit: a Tenant over two namespaces holding more Agents than its maxAgents,
// its places decided by the operator's ordered index of Agents. Deleting two of the oldest lets
// exactly the next two in (reconciled once the index has applied the deletions), a raised limit
// lets the next one in, and a namespace leaving the Tenant frees the place its Agent held.
func TestAgentLimitAtTheLimit(t *testing.T) {
	ctx := context.Background()
	// nsB sorts first: Agents created in the same second are ordered by namespace, then name.
	nsB, nsA := plainNamespace(t), plainNamespace(t)
	if nsA < nsB {
		nsA, nsB = nsB, nsA
	}
	three := int32(3)
	org := "lim2-" + nsA
	member := map[string]string{"limit-test": org}
	tn := &a2av1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: org}, Spec: a2av1.TenantSpec{OrgID: org, Namespaces: []string{nsA},
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: member}, Limits: &a2av1.TenantLimits{MaxAgents: &three}}}
	if err := k8s.Create(ctx, tn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), tn) })
	relabel := func(ns string, labels map[string]string) {
		t.Helper()
		var n corev1.Namespace
		if err := k8s.Get(ctx, client.ObjectKey{Name: ns}, &n); err != nil {
			t.Fatal(err)
		}
		n.Labels = labels
		if err := k8s.Update(ctx, &n); err != nil {
			t.Fatal(err)
		}
	}
	relabel(nsB, member)

	// Created one after another, so that creation time (then namespace and name, within a
	// second) orders them as listed.
	fleet := []client.ObjectKey{{Namespace: nsB, Name: "b1"}, {Namespace: nsB, Name: "b2"}}
	for i := range 5 {
		fleet = append(fleet, client.ObjectKey{Namespace: nsA, Name: fmt.Sprintf("a%d", i+1)})
	}
	for _, k := range fleet {
		if err := applyYAML(k.Namespace, agentManifest(k.Name, org, "u", nil, "")); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(what string, within ...string) {
		t.Helper()
		eventually(t, what, func() error {
			for _, k := range fleet {
				var a a2av1.Agent
				want := slices.Contains(within, k.Name)
				if err := k8s.Get(ctx, k, &a); err != nil {
					if apierrors.IsNotFound(err) && !want {
						continue // deleted
					}
					return err
				}
				if k.Namespace == nsB && !want {
					continue // the Agents of nsB: only their places matter
				}
				c := meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionIdentityPermitted)
				switch {
				case c == nil:
					return fmt.Errorf("%s: no IdentityPermitted yet", k)
				case want && c.Status != metav1.ConditionTrue:
					return fmt.Errorf("%s: IdentityPermitted = %+v, want True", k, c)
				case !want && (c.Status != metav1.ConditionFalse || c.Reason != a2av1.ReasonAgentLimitExceeded ||
					!strings.Contains(c.Message, "limits.maxAgents")):
					return fmt.Errorf("%s: IdentityPermitted = %+v, want AgentLimitExceeded", k, c)
				}
			}
			return nil
		})
	}
	expect("the three oldest within the limit", "b1", "b2", "a1")

	for _, k := range []client.ObjectKey{fleet[0], fleet[2]} {
		if err := k8s.Delete(ctx, &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}); err != nil {
			t.Fatal(err)
		}
	}
	expect("two deletions let exactly the next two in", "b2", "a2", "a3")

	four := int32(4)
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(tn), tn); err != nil {
		t.Fatal(err)
	}
	tn.Spec.Limits.MaxAgents = &four
	if err := k8s.Update(ctx, tn); err != nil {
		t.Fatal(err)
	}
	expect("a raised limit lets the next one in", "b2", "a2", "a3", "a4")

	relabel(nsB, nil)
	expect("the namespace leaving the Tenant frees the place of its Agent", "a2", "a3", "a4", "a5")
}

// TestAgentOrderFollowsTheCache: the ordered index the limit decides from (tenancy.AgentCounts on
// a real informer) places every Agent where a list and sort of the same cache does, as Agents
// come and go over two namespaces.
func TestAgentOrderFollowsTheCache(t *testing.T) {
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
	scope := []string{nsA, nsB}
	agree := func(what string) {
		t.Helper()
		eventually(t, what, func() error {
			var all []*a2av1.Agent
			for _, ns := range scope {
				var l a2av1.AgentList
				if err := c.List(ctx, &l, client.InNamespace(ns)); err != nil {
					return err
				}
				for i := range l.Items {
					all = append(all, &l.Items[i])
				}
			}
			slices.SortFunc(all, func(a, b *a2av1.Agent) int {
				if tenancy.AgentPrecedes(a, b) {
					return -1
				}
				return 1
			})
			for i, a := range all {
				before, total, ok := counts.AgentStanding(a, scope)
				if !ok || before != i || total != len(all) {
					return fmt.Errorf("%s/%s: placed %d of %d (ok %v), the cache sorts it %d of %d", a.Namespace, a.Name, before, total, ok, i, len(all))
				}
			}
			return nil
		})
	}
	for i := range 8 {
		ns := []string{nsA, nsB}[i%2]
		if err := applyYAML(ns, agentManifest(fmt.Sprintf("o%d", i), "ord-"+nsA, "u", nil, "")); err != nil {
			t.Fatal(err)
		}
	}
	agree("places after creates")
	for _, k := range []client.ObjectKey{{Namespace: nsA, Name: "o0"}, {Namespace: nsB, Name: "o3"}} {
		if err := k8s.Delete(ctx, &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: k.Namespace, Name: k.Name}}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the deleted Agents are gone", func() error {
		var l a2av1.AgentList
		if err := c.List(ctx, &l, client.InNamespace(nsA)); err != nil {
			return err
		}
		if len(l.Items) != 3 {
			return fmt.Errorf("%d Agents in %s", len(l.Items), nsA)
		}
		return nil
	})
	agree("places after deletes")
}
