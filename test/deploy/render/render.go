// Package render produces the install manifests exactly as users get them, with the pinned tools
// from bin/: `kustomize build` of an overlay and `helm template` of the chart. A missing tool
// fails with the make target that builds it; nothing falls back to a second copy of the
// manifests.
package render

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// Pinned tool versions: the Makefile's KUSTOMIZE_VERSION and HELM_VERSION.
const (
	KustomizeVersion = "v5.8.1"
	HelmVersion      = "v3.22.0"
	// KubeVersion is the control plane the tests run (hack/build-control-plane.sh).
	KubeVersion = "1.37.2"
	// Namespace is where config/quickstart installs and where the chart is installed in the tests.
	Namespace = "a2a-fleet-system"
)

// RepoRoot finds the repository root (the folder with go.mod) above dir.
func RepoRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("render: no go.mod above the working directory")
		}
		dir = parent
	}
}

func tool(root, name, version, target string) (string, error) {
	path := filepath.Join(root, "bin", name+"-"+version)
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("render: %s %s not found at %s: run `make %s` (or `make tools`)", name, version, path, target)
	}
	return path, nil
}

// Kustomize runs `kustomize build dir` (dir relative to the repository root).
func Kustomize(root, dir string) ([]*unstructured.Unstructured, error) {
	bin, err := tool(root, "kustomize", KustomizeVersion, "bin/kustomize-"+KustomizeVersion)
	if err != nil {
		return nil, err
	}
	return run(root, bin, "build", dir)
}

// Helm runs `helm template` of charts/a2a-fleet as release a2a-fleet in Namespace, with extra
// arguments (--set ...).
func Helm(root string, extra ...string) ([]*unstructured.Unstructured, error) {
	bin, err := tool(root, "helm", HelmVersion, "bin/helm-"+HelmVersion)
	if err != nil {
		return nil, err
	}
	args := append([]string{"template", "a2a-fleet", "charts/a2a-fleet", "--namespace", Namespace, "--kube-version", KubeVersion, "--include-crds"}, extra...)
	return run(root, bin, args...)
}

func run(root, bin string, args ...string) ([]*unstructured.Unstructured, error) {
	cmd := exec.Command(bin, args...)
	cmd.Dir = root
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("render: %s %v: %w\n%s", filepath.Base(bin), args, err, errOut.String())
	}
	return Decode(out.Bytes())
}

// Decode splits a multi-document YAML stream into objects (empty documents are dropped).
func Decode(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("render: decode manifests: %w", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}

// Find returns the object of kind and name, or nil.
func Find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

// Kinds lists "Kind/name" of every object, sorted (for messages).
func Kinds(objs []*unstructured.Unstructured) []string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	sort.Strings(out)
	return out
}

// KustomizeOverlay builds an overlay of the repository's kustomizations, as a user's own overlay
// would: resources and components are folders relative to the repository root; dir (outside or
// inside the repository) receives the kustomization.yaml.
func KustomizeOverlay(root, dir string, resources, components []string) ([]*unstructured.Unstructured, error) {
	rel := func(in []string) ([]string, error) {
		out := make([]string, 0, len(in))
		for _, p := range in {
			r, err := filepath.Rel(dir, filepath.Join(root, p))
			if err != nil {
				return nil, err
			}
			out = append(out, r)
		}
		return out, nil
	}
	res, err := rel(resources)
	if err != nil {
		return nil, err
	}
	comp, err := rel(components)
	if err != nil {
		return nil, err
	}
	k := "resources:\n"
	for _, r := range res {
		k += "- " + r + "\n"
	}
	if len(comp) > 0 {
		k += "components:\n"
		for _, c := range comp {
			k += "- " + c + "\n"
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		return nil, fmt.Errorf("render: write overlay: %w", err)
	}
	return Kustomize(root, dir)
}
