package render

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/diff"
)

// kustomizeHash is the suffix configMapGenerator adds to a ConfigMap's name.
var kustomizeHash = regexp.MustCompile(`-[bcdfghkmt2-9]{10}$`)

// Comparable reduces a render to what decides how the install behaves, so that a kustomize
// render and a helm render can be compared object by object:
//   - Namespace objects go (helm installs into a namespace it does not own);
//   - metadata labels and annotations go, and so do the pod templates' annotations (helm adds its
//     own labels and a config checksum; kustomize rolls pods by ConfigMap name hash instead);
//   - generated ConfigMap names lose kustomize's hash suffix, also where volumes refer to them;
//   - lists whose order means nothing (ports, volumes, volume mounts: merged by name, a kustomize
//     patch prepends) are sorted by name.
//
// Everything else (CRDs, RBAC rules, container images, args, env, ports, probes, volumes, the
// Mosquitto configuration, Services, claims) stays and must match.
func Comparable(objs []*unstructured.Unstructured) map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			continue
		}
		c := o.DeepCopy()
		unstructured.RemoveNestedField(c.Object, "metadata", "labels")
		unstructured.RemoveNestedField(c.Object, "metadata", "annotations")
		unstructured.RemoveNestedField(c.Object, "metadata", "creationTimestamp")
		unstructured.RemoveNestedField(c.Object, "spec", "template", "metadata", "annotations")
		name := c.GetName()
		if c.GetKind() == "ConfigMap" {
			name = kustomizeHash.ReplaceAllString(name, "")
			c.SetName(name)
		}
		if c.GetKind() == "Deployment" {
			volumes, _, _ := unstructured.NestedSlice(c.Object, "spec", "template", "spec", "volumes")
			for _, v := range volumes {
				if cm, ok := v.(map[string]any)["configMap"].(map[string]any); ok {
					cm["name"] = kustomizeHash.ReplaceAllString(cm["name"].(string), "")
				}
			}
			_ = unstructured.SetNestedSlice(c.Object, volumes, "spec", "template", "spec", "volumes")
		}
		sortNamedLists(c.Object)
		out[c.GetKind()+"/"+c.GetNamespace()+"/"+name] = c.Object
	}
	return out
}

// Differences lists how two renders differ, object by object (empty: they install the same).
func Differences(want, got []*unstructured.Unstructured) []string {
	a, b := Comparable(want), Comparable(got)
	var keys []string
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var out []string
	for _, k := range keys {
		x, inA := a[k]
		y, inB := b[k]
		switch {
		case !inB:
			out = append(out, k+": only in the first render")
		case !inA:
			out = append(out, k+": only in the second render")
		default:
			if d := diff.Diff(x, y); strings.TrimSpace(d) != "" {
				out = append(out, fmt.Sprintf("%s differs (-first +second):\n%s", k, d))
			}
		}
	}
	return out
}

// sortNamedLists sorts, anywhere in obj, the lists whose items are merged by name.
func sortNamedLists(obj any) {
	switch v := obj.(type) {
	case map[string]any:
		for k, child := range v {
			if list, ok := child.([]any); ok && (k == "ports" || k == "volumes" || k == "volumeMounts") {
				sort.SliceStable(list, func(i, j int) bool { return itemKey(list[i]) < itemKey(list[j]) })
			}
			sortNamedLists(child)
		}
	case []any:
		for _, child := range v {
			sortNamedLists(child)
		}
	}
}

func itemKey(item any) string {
	m, ok := item.(map[string]any)
	if !ok {
		return ""
	}
	return fmt.Sprint(m["name"], "/", m["mountPath"], "/", m["containerPort"], m["port"])
}

// DanglingServiceAccounts lists the ServiceAccount references of a render that name no
// ServiceAccount in it: binding subjects and pods' serviceAccountName (a typo or a kustomize name
// reference that an overlay broke leaves a pod without its rights).
func DanglingServiceAccounts(objs []*unstructured.Unstructured) []string {
	have := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() == "ServiceAccount" {
			have[o.GetNamespace()+"/"+o.GetName()] = true
		}
	}
	var out []string
	for _, o := range objs {
		switch o.GetKind() {
		case "RoleBinding", "ClusterRoleBinding":
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			for _, s := range subjects {
				m, _ := s.(map[string]any)
				if m["kind"] != "ServiceAccount" {
					continue
				}
				ref := fmt.Sprint(m["namespace"], "/", m["name"])
				if !have[ref] {
					out = append(out, fmt.Sprintf("%s %s: subject ServiceAccount %s does not exist", o.GetKind(), o.GetName(), ref))
				}
			}
		case "Deployment":
			sa, _, _ := unstructured.NestedString(o.Object, "spec", "template", "spec", "serviceAccountName")
			if sa != "" && !have[o.GetNamespace()+"/"+sa] {
				out = append(out, fmt.Sprintf("Deployment %s: serviceAccountName %s does not exist in %s", o.GetName(), sa, o.GetNamespace()))
			}
		}
	}
	return out
}
