package hardening

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/a2a-fleet/a2a-fleet/test/deploy/render"
)

// The decision service's install: config/quickstart with the component
// config/quickstart/decision-service, and the chart with decisionService.enabled=true.
var (
	decisionComponent = []string{"config/quickstart/decision-service"}
	decisionValues    = []string{"--set", "decisionService.enabled=true"}
)

const (
	decisionDeployment = "a2a-fleet-decision-service"
	decisionServiceObj = "a2a-fleet-decision"
)

// The component and the chart value install the same objects, and those include the decision
// service (so the comparison is not of two installs without it).
func TestDecisionServiceChartMatchesKustomize(t *testing.T) {
	kust, chart := renders(t, decisionComponent, decisionValues)
	if d := render.Differences(kust, chart); len(d) > 0 {
		t.Fatalf("config/quickstart + decision-service and the chart with decisionService.enabled=true differ in %d objects:\n%s", len(d), strings.Join(d, "\n"))
	}
	for _, kind := range []string{"Deployment", "PodDisruptionBudget", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"} {
		if render.Find(kust, kind, decisionDeployment) == nil {
			t.Errorf("the render has no %s %s", kind, decisionDeployment)
		}
	}
	if render.Find(kust, "Service", decisionServiceObj) == nil {
		t.Errorf("the render has no Service %s", decisionServiceObj)
	}
}

// The default installs (config/quickstart, the chart's defaults) do not run the decision service:
// their Mosquitto decides with its own plugin.
func TestDecisionServiceOffByDefault(t *testing.T) {
	kust, chart := renders(t, nil, nil)
	for name, objs := range map[string][]*unstructured.Unstructured{"config/quickstart": kust, "chart defaults": chart} {
		for _, o := range objs {
			if strings.Contains(o.GetName(), "decision") {
				t.Errorf("%s renders %s %s", name, o.GetKind(), o.GetName())
			}
		}
	}
}

// Both renders: several replicas on different nodes preferably, a disruption budget over the
// same pods, a Service that selects them on the decision port, read-only RBAC covering what the
// service watches, readiness on /readyz, the restricted security context, the admin password from
// the operator's broker admin Secret, and flags the binary defines and the operator agrees with.
func TestDecisionServiceInstall(t *testing.T) {
	kust, chart := renders(t, decisionComponent, decisionValues)
	for name, objs := range map[string][]*unstructured.Unstructured{"kustomize": kust, "helm": chart} {
		t.Run(name, func(t *testing.T) {
			problems := append(decisionInstallProblems(t, objs), render.DanglingServiceAccounts(objs)...)
			if len(problems) > 0 {
				t.Fatalf("%d problems:\n%s", len(problems), strings.Join(problems, "\n"))
			}
		})
	}
	// The same checks find each fault planted in a copy, so they are not vacuous.
	t.Run("control: planted faults", func(t *testing.T) {
		faults := map[string]func(objs []*unstructured.Unstructured){
			"replicas 1": func(objs []*unstructured.Unstructured) {
				_ = unstructured.SetNestedField(render.Find(objs, "Deployment", decisionDeployment).Object, int64(1), "spec", "replicas")
			},
			"writes": func(objs []*unstructured.Unstructured) {
				r := render.Find(objs, "ClusterRole", decisionDeployment)
				rules, _, _ := unstructured.NestedSlice(r.Object, "rules")
				rules[0].(map[string]any)["verbs"] = []any{"get", "list", "watch", "patch"}
				_ = unstructured.SetNestedSlice(r.Object, rules, "rules")
			},
			"selects no pod": func(objs []*unstructured.Unstructured) {
				_ = unstructured.SetNestedStringMap(render.Find(objs, "Service", decisionServiceObj).Object, map[string]string{"app.kubernetes.io/name": "other"}, "spec", "selector")
			},
			"no disruption budget": func(objs []*unstructured.Unstructured) {
				render.Find(objs, "PodDisruptionBudget", decisionDeployment).SetKind("ConfigMap")
			},
			"unknown flag": func(objs []*unstructured.Unstructured) {
				d := render.Find(objs, "Deployment", decisionDeployment)
				cs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
				c := cs[0].(map[string]any)
				c["args"] = append(c["args"].([]any), "--cache-max-age=1m")
				_ = unstructured.SetNestedSlice(d.Object, cs, "spec", "template", "spec", "containers")
			},
		}
		for fault, plant := range faults {
			objs := make([]*unstructured.Unstructured, len(kust))
			for i, o := range kust {
				objs[i] = o.DeepCopy()
			}
			plant(objs)
			if problems := decisionInstallProblems(t, objs); len(problems) == 0 {
				t.Errorf("the checks miss the fault %q", fault)
			}
		}
	})
}

// The image the install runs is a Dockerfile target that make docker-build and
// hack/kind/images.sh build under that name.
func TestDecisionServiceImageIsBuilt(t *testing.T) {
	kust, chart := renders(t, decisionComponent, decisionValues)
	root, err := render.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		data, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	const image = "a2a-fleet/decision-service:dev"
	for name, objs := range map[string][]*unstructured.Unstructured{"kustomize": kust, "helm": chart} {
		d := decisionDeploymentOf(t, objs)
		if d == nil || d.Spec.Template.Spec.Containers[0].Image != image {
			t.Errorf("%s: the decision service does not run %s", name, image)
		}
	}
	dockerfile, makefile, images := read("Dockerfile"), read("Makefile"), read("hack/kind/images.sh")
	if !strings.Contains(dockerfile, " AS decision-service\n") || !strings.Contains(dockerfile, "./cmd/decision-service") {
		t.Error("the Dockerfile has no decision-service target building ./cmd/decision-service")
	}
	if !strings.Contains(makefile, "DECISION_IMG ?= "+image+"\n") || !strings.Contains(makefile, "--target decision-service -t $(DECISION_IMG)") {
		t.Error("make docker-build does not build the target decision-service as DECISION_IMG")
	}
	if !strings.Contains(images, `"decision-service $DECISION_IMG"`) || !strings.Contains(images, `DECISION_IMG="${DECISION_IMG:-`+image+`}"`) {
		t.Error("hack/kind/images.sh does not build the target decision-service")
	}
}

func decisionDeploymentOf(t *testing.T, objs []*unstructured.Unstructured) *appsv1.Deployment {
	t.Helper()
	d := &appsv1.Deployment{}
	if !typed(t, objs, "Deployment", decisionDeployment, d) || len(d.Spec.Template.Spec.Containers) == 0 {
		return nil
	}
	return d
}

// typed converts the object of kind and name into out; false when the render has none.
func typed(t *testing.T, objs []*unstructured.Unstructured, kind, name string, out any) bool {
	t.Helper()
	o := render.Find(objs, kind, name)
	if o == nil {
		return false
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, out); err != nil {
		t.Fatalf("%s %s: %v", kind, name, err)
	}
	return true
}

func decisionInstallProblems(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	d := decisionDeploymentOf(t, objs)
	if d == nil {
		return []string{"no Deployment " + decisionDeployment}
	}
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	pod := d.Spec.Template
	c := pod.Spec.Containers[0]
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		add("Deployment: fewer than 2 replicas")
	}
	if s := d.Spec.Strategy.RollingUpdate; s == nil || s.MaxUnavailable == nil || s.MaxUnavailable.IntValue() != 0 {
		add("Deployment: a rollout may drop a ready replica (maxUnavailable is not 0)")
	}
	if a := pod.Spec.Affinity; a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) == 0 ||
		!selects(t, a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.LabelSelector, pod.Labels) {
		add("Deployment: no preferred anti-affinity between its own pods")
	}
	pdb := &policyv1.PodDisruptionBudget{}
	switch {
	case !typed(t, objs, "PodDisruptionBudget", decisionDeployment, pdb):
		add("no PodDisruptionBudget %s", decisionDeployment)
	case !selects(t, pdb.Spec.Selector, pod.Labels):
		add("PodDisruptionBudget: does not select the pods")
	case pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() >= int(*d.Spec.Replicas):
		add("PodDisruptionBudget: lets every replica go at once")
	}
	problems = append(problems, decisionServiceProblems(t, objs, pod.Labels, c)...)
	problems = append(problems, decisionRBACProblems(t, objs, d)...)
	problems = append(problems, decisionPodProblems(objs, pod.Spec, c)...)
	return problems
}

func selects(t *testing.T, s *metav1.LabelSelector, podLabels map[string]string) bool {
	t.Helper()
	if s == nil {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		t.Fatal(err)
	}
	return !sel.Empty() && sel.Matches(labels.Set(podLabels))
}

// decisionServiceProblems: the Service selects the pods and reaches the container's decision
// endpoint (the --listen port) on 8090.
func decisionServiceProblems(t *testing.T, objs []*unstructured.Unstructured, podLabels map[string]string, c corev1.Container) []string {
	svc := &corev1.Service{}
	if !typed(t, objs, "Service", decisionServiceObj, svc) {
		return []string{"no Service " + decisionServiceObj}
	}
	var problems []string
	if !selects(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, podLabels) {
		problems = append(problems, "Service: selects no decision-service pod")
	}
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 8090 {
		return append(problems, "Service: not one port 8090")
	}
	target := svc.Spec.Ports[0].TargetPort
	i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == target.StrVal })
	listen, _ := argValueOf(c.Args, "--listen")
	if i < 0 || fmt.Sprintf(":%d", c.Ports[i].ContainerPort) != listen {
		problems = append(problems, fmt.Sprintf("Service: targetPort %q is not the container's --listen port %q", target.String(), listen))
	}
	return problems
}

// decisionRBACProblems: the pods' ServiceAccount is bound to a ClusterRole that only reads, and
// reads what the service watches.
func decisionRBACProblems(t *testing.T, objs []*unstructured.Unstructured, d *appsv1.Deployment) []string {
	binding := &rbacv1.ClusterRoleBinding{}
	if !typed(t, objs, "ClusterRoleBinding", decisionDeployment, binding) {
		return []string{"no ClusterRoleBinding " + decisionDeployment}
	}
	var problems []string
	sa := d.Spec.Template.Spec.ServiceAccountName
	if !slices.ContainsFunc(binding.Subjects, func(s rbacv1.Subject) bool {
		return s.Kind == "ServiceAccount" && s.Name == sa && s.Namespace == d.Namespace
	}) {
		problems = append(problems, fmt.Sprintf("ClusterRoleBinding: does not bind the pods' ServiceAccount %s/%s", d.Namespace, sa))
	}
	if render.Find(objs, "ServiceAccount", sa) == nil {
		problems = append(problems, "no ServiceAccount "+sa)
	}
	role := &rbacv1.ClusterRole{}
	if binding.RoleRef.Kind != "ClusterRole" || !typed(t, objs, "ClusterRole", binding.RoleRef.Name, role) {
		return append(problems, "ClusterRoleBinding: its ClusterRole is not in the render")
	}
	readable := map[string]bool{}
	for _, r := range role.Rules {
		for _, v := range r.Verbs {
			if !slices.Contains([]string{"get", "list", "watch"}, v) {
				problems = append(problems, fmt.Sprintf("ClusterRole: verb %q on %v", v, r.Resources))
			}
		}
		if len(r.Verbs) == 3 {
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					readable[g+"/"+res] = true
				}
			}
		}
	}
	for _, want := range []string{"a2a.fleet.dev/agents", "a2a.fleet.dev/tenants", "a2a.fleet.dev/agentgrants", "/namespaces", "/secrets"} {
		if !readable[want] {
			problems = append(problems, "ClusterRole: cannot get, list and watch "+want)
		}
	}
	return problems
}

// decisionFlag is a flag definition of cmd/decision-service's main.go.
var decisionFlag = regexp.MustCompile(`flag\.\w+Var\(&o\.\w+, "([a-z-]+)"`)

// decisionPodProblems: readiness, the restricted security context, the admin password file from
// the operator's broker admin Secret, flags the binary defines, gating as the operator's.
func decisionPodProblems(objs []*unstructured.Unstructured, spec corev1.PodSpec, c corev1.Container) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
		add("container: readiness is not /readyz")
	} else if probe, _ := argValueOf(c.Args, "--health-probe-bind-address"); !slices.ContainsFunc(c.Ports, func(cp corev1.ContainerPort) bool {
		return cp.Name == p.HTTPGet.Port.StrVal && fmt.Sprintf(":%d", cp.ContainerPort) == probe
	}) {
		add("container: readiness port %q is not --health-probe-bind-address %q", p.HTTPGet.Port.String(), probe)
	}
	ps, cs := spec.SecurityContext, c.SecurityContext
	if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.SeccompProfile == nil || ps.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		add("pod: not runAsNonRoot with the RuntimeDefault seccomp profile")
	}
	if cs == nil || cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation || cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem ||
		cs.Capabilities == nil || !slices.Equal(cs.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		add("container: not restricted (privilege escalation, writable root, capabilities)")
	}
	// The admin: the operator's --broker-admin-secret, its password mounted, its username as env.
	_, manager := deploymentContainer(objs, "a2a-fleet-controller-manager", "manager")
	managerArgs, _, _ := unstructured.NestedStringSlice(manager, "args")
	adminSecret, _ := argValueOf(managerArgs, "--broker-admin-secret")
	_, adminName, _ := strings.Cut(adminSecret, "/")
	file, _ := argValueOf(c.Args, "--admin-password-file")
	if adminName == "" || !secretFileMounted(spec, c, file, adminName, "password") {
		add("container: --admin-password-file %q is not the key password of the operator's broker admin Secret %q", file, adminSecret)
	}
	if user, _ := argValueOf(c.Args, "--admin-username"); user != "$(A2A_ADMIN_USERNAME)" || !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "A2A_ADMIN_USERNAME" && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil &&
			e.ValueFrom.SecretKeyRef.Name == adminName && e.ValueFrom.SecretKeyRef.Key == "username"
	}) {
		add("container: --admin-username is not the username of the broker admin Secret %q", adminSecret)
	}
	// As the operator: the gate and the conversation service's identity decide the table.
	for _, flag := range []string{"--gate-governed-agents", "--conversation-service-secret"} {
		mine, okMine := argValueOf(c.Args, flag)
		theirs, okTheirs := argValueOf(managerArgs, flag)
		if mine != theirs || okMine != okTheirs {
			add("container: %s %q (%v), the operator's %q (%v)", flag, mine, okMine, theirs, okTheirs)
		}
	}
	problems = append(problems, undefinedFlags(c.Args)...)
	return problems
}

// undefinedFlags lists the arguments that name no flag of cmd/decision-service (the binary
// would exit at start).
func undefinedFlags(args []string) []string {
	root, err := render.RepoRoot(".")
	if err != nil {
		return []string{err.Error()}
	}
	src, err := os.ReadFile(filepath.Join(root, "cmd/decision-service/main.go"))
	if err != nil {
		return []string{err.Error()}
	}
	defined := map[string]bool{}
	for _, m := range decisionFlag.FindAllStringSubmatch(string(src), -1) {
		defined[m[1]] = true
	}
	var problems []string
	for _, a := range args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !defined[name] {
			problems = append(problems, fmt.Sprintf("container: %q names no flag of cmd/decision-service", a))
		}
	}
	return problems
}

// argValueOf is the value of --flag=value, or "" and true for a bare --flag.
func argValueOf(args []string, flag string) (string, bool) {
	for _, a := range args {
		if a == flag {
			return "", true
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, true
		}
	}
	return "", false
}

// secretFileMounted reports whether file is key of Secret secret, mounted into c.
func secretFileMounted(spec corev1.PodSpec, c corev1.Container, file, secret, key string) bool {
	for _, m := range c.VolumeMounts {
		if m.MountPath != path.Dir(file) {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name != m.Name || v.Secret == nil || v.Secret.SecretName != secret {
				continue
			}
			if slices.ContainsFunc(v.Secret.Items, func(it corev1.KeyToPath) bool { return it.Key == key && it.Path == path.Base(file) }) {
				return true
			}
		}
	}
	return false
}
