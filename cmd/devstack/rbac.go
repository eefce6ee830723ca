package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// namespaceOwnerRoles are the project's aggregated ClusterRoles in config/rbac: the editor role
// is aggregated into the built-in admin and edit roles, the viewer role into view, so a
// RoleBinding to edit in a namespace lets its subject manage Agents there, as on a cluster.
var namespaceOwnerRoles = []string{"a2a_editor_role.yaml", "a2a_viewer_role.yaml"}

// installNamePrefix is config/default's namePrefix: the roles get the names a cluster install
// gives them.
const installNamePrefix = "a2a-fleet-"

// installNamespaceOwnerRoles server-side applies the namespace owners' roles from dir (field
// manager devstack): kube-controller-manager's aggregation (internal/controlplane) then adds
// their rules to admin, edit and view.
func installNamespaceOwnerRoles(ctx context.Context, c client.Client, dir string) error {
	for _, name := range namespaceOwnerRoles {
		path := filepath.Join(dir, name)
		raw, err := os.ReadFile(path)
		if err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(raw, &u.Object); err != nil {
			return fmt.Errorf("parse %s: %w", path, err)
		}
		u.SetName(installNamePrefix + u.GetName())
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("devstack"), client.ForceOwnership); err != nil {
			return fmt.Errorf("apply %s: %w", path, err)
		}
	}
	return nil
}
