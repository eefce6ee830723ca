package controllers_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// The suite runs kube-controller-manager (testenv.Options.ControllerManager) so that what a
// cluster's controllers do happens here too.

// TestDeleteAndRecreateAnAgent: an Agent deleted and created again under the same name gets
// credentials again. The garbage collector removes the deleted Agent's Secret (owned by it); without
// it the Secret stayed, owned by an Agent that no longer exists, and the new Agent reported
// CredentialsConflict for ever (issue 23: make dev ran no kube-controller-manager).
func TestDeleteAndRecreateAnAgent(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	manifest := agentManifest("again", "acme", "sales", nil, "")
	if err := applyYAML(ns, manifest); err != nil {
		t.Fatal(err)
	}
	secret := client.ObjectKey{Namespace: ns, Name: "again-mqtt-credentials"}
	var firstUID types.UID
	eventually(t, "credentials of the first Agent", func() error {
		a := getAgent(t, ns, "again")
		s := &corev1.Secret{}
		if err := k8s.Get(ctx, secret, s); err != nil {
			return err
		}
		if !metav1.IsControlledBy(s, a) {
			return fmt.Errorf("Secret not the Agent's: %v", s.OwnerReferences)
		}
		firstUID = a.UID
		return nil
	})
	if err := k8s.Delete(ctx, getAgent(t, ns, "again")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Agent and its Secret gone", func() error {
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: "again"}, &a2av1.Agent{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("agent: %v", err)
		}
		if err := k8s.Get(ctx, secret, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the deleted Agent's Secret is still there (no garbage collection?): %v", err)
		}
		return nil
	})
	if err := applyYAML(ns, manifest); err != nil {
		t.Fatal(err)
	}
	eventually(t, "credentials of the new Agent", func() error {
		a := getAgent(t, ns, "again")
		if a.UID == firstUID {
			return fmt.Errorf("still the first Agent")
		}
		for _, c := range a.Status.Conditions {
			if c.Reason == a2av1.ReasonCredentialsConflict {
				return fmt.Errorf("%s: %s", c.Reason, c.Message)
			}
		}
		s := &corev1.Secret{}
		if err := k8s.Get(ctx, secret, s); err != nil {
			return err
		}
		if !metav1.IsControlledBy(s, a) || a.Status.CredentialsSecret != secret.Name {
			return fmt.Errorf("Secret owners %v, status.credentialsSecret %q", s.OwnerReferences, a.Status.CredentialsSecret)
		}
		return nil
	})
}

// TestNamespaceOwnerGetsTheProjectsRoles: a user bound to the built-in "edit" ClusterRole in a
// namespace may manage Agents and ConversationPolicies there, because the project's editor role
// (config/rbac/a2a_editor_role.yaml) aggregates into "edit", as on every cluster: kube-controller-
// manager's ClusterRole aggregation does it. Without it, "edit" never included them (issue 23).
func TestNamespaceOwnerGetsTheProjectsRoles(t *testing.T) {
	ctx := context.Background()
	for _, f := range []string{"../config/rbac/a2a_editor_role.yaml", "../config/rbac/a2a_viewer_role.yaml"} {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		role := &rbacv1.ClusterRole{}
		if err := yaml.Unmarshal(raw, role); err != nil {
			t.Fatal(err)
		}
		role.Name = "test-a2a-" + role.Name
		if err := k8s.Create(ctx, role); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), role) })
	}
	ns := newNamespace(t)
	if err := k8s.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "owner", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "namespace-owner"}},
	}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(restCfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "namespace-owner"}
	owner, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the namespace owner creates an Agent and lists policies", func() error {
		a := &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Name: "owned", Namespace: ns},
			Spec: a2av1.AgentSpec{OrgID: "acme", UnitID: "sales", Card: a2av1.AgentCardSpec{Name: "owned", Description: "by the namespace owner"}}}
		if err := owner.Create(ctx, a); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		return owner.List(ctx, &a2av1.ConversationPolicyList{}, client.InNamespace(ns))
	})
	if err := owner.List(ctx, &a2av1.AgentList{}, client.InNamespace("default")); !apierrors.IsForbidden(err) {
		t.Fatalf("the namespace owner lists Agents of another namespace: %v", err)
	}
}
