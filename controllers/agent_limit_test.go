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
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
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
