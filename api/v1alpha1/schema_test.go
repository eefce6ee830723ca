package v1alpha1_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// TestEveryFieldIsDescribed keeps `kubectl explain` useful: every property of every generated CRD
// schema has a description.
func TestEveryFieldIsDescribed(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("..", "..", "config", "crd", "bases", "*.yaml"))
	if err != nil || len(files) != 4 {
		t.Fatalf("want 4 generated CRDs, found %v (err %v)", files, err)
	}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(raw, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, v := range crd.Spec.Versions {
			var missing []string
			walk(v.Schema.OpenAPIV3Schema, crd.Spec.Names.Kind, &missing)
			if len(missing) > 0 {
				t.Errorf("%s %s: fields without a description:\n  %s", crd.Spec.Names.Kind, v.Name, strings.Join(missing, "\n  "))
			}
		}
	}
}

func walk(s *apiextensionsv1.JSONSchemaProps, path string, missing *[]string) {
	if s == nil {
		return
	}
	for name, prop := range s.Properties {
		p := path + "." + name
		// The root's metadata is ObjectMeta, which kubectl explain describes from Kubernetes itself.
		isRootMetadata := name == "metadata" && !strings.Contains(path, ".")
		if prop.Description == "" && !isRootMetadata {
			*missing = append(*missing, p)
		}
		walk(&prop, p, missing)
	}
	if s.Items != nil && s.Items.Schema != nil {
		walk(s.Items.Schema, path+"[]", missing)
	}
}
