package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// plainNamespace creates a namespace no Tenant of the suite binds.
func plainNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "tn-"}}
	if err := k8s.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func createTenant(t *testing.T, name, org string, namespaces ...string) {
	t.Helper()
	tn := &a2av1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: a2av1.TenantSpec{OrgID: org, Namespaces: namespaces}}
	if err := k8s.Create(context.Background(), tn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), tn) })
}

func tenantCondition(name, condType string, status metav1.ConditionStatus, reason, msg string) error {
	tn := &a2av1.Tenant{}
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: name}, tn); err != nil {
		return err
	}
	c := meta.FindStatusCondition(tn.Status.Conditions, condType)
	if c == nil || c.Status != status || c.Reason != reason || !strings.Contains(c.Message, msg) {
		return fmt.Errorf("tenant %s %s = %+v", name, condType, c)
	}
	return nil
}

// TestTenantPrecedenceAndConflicts: the oldest Tenant keeps its org and namespaces, newer ones
// report the conflict; Agents follow the bindings, and a Tenant's deletion hands them over.
func TestTenantPrecedenceAndConflicts(t *testing.T) {
	nsA, nsShared, nsC := plainNamespace(t), plainNamespace(t), plainNamespace(t)
	createTenant(t, "tn-first", "tn-org1", nsA, nsShared)
	time.Sleep(1100 * time.Millisecond) // creationTimestamp has one-second resolution
	createTenant(t, "tn-copy", "tn-org1", nsC)
	createTenant(t, "tn-second", "tn-org2", nsShared, nsC)

	eventually(t, "the older Tenant keeps the org", func() error {
		return tenantCondition("tn-copy", a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonOrgConflict, "belongs to the older Tenant tn-first")
	})
	eventually(t, "the newer Tenant loses the shared namespace", func() error {
		if err := tenantCondition("tn-second", a2av1.ConditionConflicted, metav1.ConditionTrue, a2av1.ReasonNamespaceConflict, nsShared); err != nil {
			return err
		}
		tn := &a2av1.Tenant{}
		if err := k8s.Get(context.Background(), client.ObjectKey{Name: "tn-second"}, tn); err != nil {
			return err
		}
		if tn.Status.BoundNamespaces != 1 || !slices.Equal(tn.Status.Namespaces, []string{nsC}) || !slices.Equal(tn.Status.ConflictingNamespaces, []string{nsShared}) {
			return fmt.Errorf("status %+v", tn.Status)
		}
		return tenantCondition("tn-first", a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonTenantBound, "binds 2 namespaces to org tn-org1")
	})

	if err := applyYAML(nsShared, agentManifest("late", "tn-org2", "u", nil, "")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the shared namespace belongs to the older Tenant", func() error {
		a := getAgent(t, nsShared, "late")
		if a.Status.CredentialsSecret != "" {
			return fmt.Errorf("credentials issued to a refused identity")
		}
		if c := meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionIdentityPermitted); c == nil || !strings.Contains(c.Message, "Tenant tn-first binds namespace "+nsShared+" to org tn-org1, not tn-org2") {
			return fmt.Errorf("IdentityPermitted = %+v", c)
		}
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionReady, metav1.ConditionFalse, a2av1.ReasonIdentityNotPermitted)
	})
	if err := k8s.Delete(context.Background(), &a2av1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: "tn-first"}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the next Tenant binds the namespace and the Agent follows", func() error {
		a := getAgent(t, nsShared, "late")
		if a.Status.Tenant != "tn-second" || a.Status.CredentialsSecret == "" {
			return fmt.Errorf("tenant %q credentials %q", a.Status.Tenant, a.Status.CredentialsSecret)
		}
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionIdentityPermitted, metav1.ConditionTrue, a2av1.ReasonIdentityPermitted)
	})
	eventually(t, "the copy takes over the free org", func() error {
		return tenantCondition("tn-copy", a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonTenantBound, "")
	})
}

// TestTenantNamespaceSelectorFollowsLabels: a Tenant that selects namespaces by label binds a
// namespace from the moment an administrator labels it, and its Agents follow.
func TestTenantNamespaceSelectorFollowsLabels(t *testing.T) {
	ctx := context.Background()
	ns := plainNamespace(t)
	tn := &a2av1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: "tn-gold"}, Spec: a2av1.TenantSpec{
		OrgID: "tn-gold", NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "gold"}}}}
	if err := k8s.Create(ctx, tn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), tn) })
	if err := applyYAML(ns, agentManifest("miner", "tn-gold", "u", nil, "")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "not bound yet", func() error {
		a := getAgent(t, ns, "miner")
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionIdentityPermitted, metav1.ConditionFalse, a2av1.ReasonIdentityNotPermitted)
	})
	patch := []byte(`{"metadata":{"labels":{"tier":"gold"}}}`)
	if err := k8s.Patch(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, client.RawPatch("application/merge-patch+json", patch)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "bound once labelled", func() error {
		a := getAgent(t, ns, "miner")
		if a.Status.Tenant != "tn-gold" {
			return fmt.Errorf("status.tenant = %q", a.Status.Tenant)
		}
		return conditionIs(a.Status.Conditions, a.Generation, a2av1.ConditionIdentityPermitted, metav1.ConditionTrue, a2av1.ReasonIdentityPermitted)
	})
	eventually(t, "the Tenant counts it", func() error {
		return tenantCondition("tn-gold", a2av1.ConditionReady, metav1.ConditionTrue, a2av1.ReasonTenantBound, "binds 1 namespaces")
	})
}
