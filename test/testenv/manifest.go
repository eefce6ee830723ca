package testenv

import (
	"context"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// Create creates the object a YAML manifest describes, as kubectl create would, in namespace ns
// ("" keeps the manifest's own, or none for a cluster-scoped kind), and returns the API server's
// error: the suites' one way of applying a manifest.
func Create(ctx context.Context, c client.Client, ns, manifest string) error {
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(manifest), &u.Object); err != nil {
		return fmt.Errorf("bad test manifest: %w\n%s", err, manifest)
	}
	if ns != "" {
		u.SetNamespace(ns)
	}
	// The API server's error as it is: tests compare admission messages word for word.
	return c.Create(ctx, u)
}

// MustCreate is Create that fails the test on an error.
func MustCreate(t testing.TB, ctx context.Context, c client.Client, ns, manifest string) {
	t.Helper()
	if err := Create(ctx, c, ns, manifest); err != nil {
		t.Fatalf("create: %v\n%s", err, manifest)
	}
}
