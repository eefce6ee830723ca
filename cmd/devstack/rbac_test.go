package main

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// TestNamespaceEditorMayCreateAgents: as on a cluster install, a ServiceAccount bound to the
// built-in edit role in a namespace may create an Agent there (the project's editor role is
// aggregated into edit), and not in a namespace where it has no binding. Without the roles
// installed, edit grants nothing on a2a.fleet.dev and the create is forbidden.
func TestNamespaceEditorMayCreateAgents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := startStack(t, t.TempDir())
	admin := s.kube(t)
	const ns, sa = "team-a", "deployer"
	for _, obj := range []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: sa}},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "deployer-edit"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: sa}},
		},
	} {
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatalf("create %T: %v", obj, err)
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(s.stateDir, "kubeconfig"))
	if err != nil {
		t.Fatal(err)
	}
	cfg = rest.CopyConfig(cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + sa}
	editor, err := client.New(cfg, client.Options{Scheme: admin.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	agent := func(namespace string) *a2av1.Agent {
		return &a2av1.Agent{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "team-agent"},
			Spec:       a2av1.AgentSpec{OrgID: "acme", UnitID: "team-a", Card: a2av1.AgentCardSpec{Name: "team-agent", Description: "d"}},
		}
	}
	// kube-controller-manager aggregates the roles into edit within seconds of the start.
	deadline := time.Now().Add(time.Minute)
	for {
		err = editor.Create(ctx, agent(ns))
		if err == nil {
			break
		}
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			t.Fatalf("a ServiceAccount bound to edit in %s cannot create an Agent there: %v", ns, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err := editor.Create(ctx, agent(metav1.NamespaceDefault)); !apierrors.IsForbidden(err) {
		t.Fatalf("create in a namespace without a binding: %v, want forbidden", fmt.Sprint(err))
	}
}
