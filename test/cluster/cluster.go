// Package cluster runs the project's install on a real cluster: pods on a real kubelet with a real
// container runtime, from the project's images. Its suite (the _test files here) installs
// config/quickstart and the Helm chart, runs the samples with their example agents as pods, chats
// through the conversation service from the host, rotates credentials, deletes an Agent and kills
// pods; the chaos suite (test/chaos) drives its faults through the same Env.
//
// Which cluster: the one in E2E_CLUSTER_KUBECONFIG. `make test` creates a kind cluster offline
// (hack/kind/up.sh) and loads the images the manifests name; on a machine with a registry, any
// cluster with those images works (`make test-e2e`). Nothing here starts a stand-in.
package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// KubeconfigEnv names the variable that points the suites at the cluster to install on.
const KubeconfigEnv = "E2E_CLUSTER_KUBECONFIG"

// Namespace is where the quickstart and the chart install the operator, service and broker.
const Namespace = "a2a-fleet-system"

// Env is a cluster and the tools to install on it.
type Env struct {
	Kubeconfig string
	Config     *rest.Config
	Client     client.Client
	Clientset  kubernetes.Interface
	// Root is the repository; Kubectl, Helm and A2actl are binaries the make targets built
	// before the tests (kubectl from KUBEBUILDER_ASSETS, bin/helm-*, bin/a2actl).
	Root, Kubectl, Helm, A2actl string
	// Images maps the manifests' image names to the ones to run instead (IMG, SERVICE_IMG,
	// EXAMPLES_IMG, MOSQUITTO_IMG): empty on kind, where the manifests' names are loaded.
	Images map[string]string
}

// imageVars are the variables that replace the manifests' images, as make docker-build names them.
var imageVars = map[string]string{
	"IMG":           "a2a-fleet/operator",
	"SERVICE_IMG":   "a2a-fleet/conversation-service",
	"EXAMPLES_IMG":  "a2a-fleet/example-agents",
	"MOSQUITTO_IMG": "a2a-fleet/mosquitto",
}

// FromEnv connects to the cluster in E2E_CLUSTER_KUBECONFIG. It fails, never skips, when the
// cluster or a tool is missing: `make test` provides both.
func FromEnv() (*Env, error) {
	kubeconfig := os.Getenv(KubeconfigEnv)
	if kubeconfig == "" {
		return nil, fmt.Errorf("%s is not set: run `make kind-up` (a kind cluster, offline) and set it to the kubeconfig it prints, or point it at a cluster that has the project's images (make test does both)", KubeconfigEnv)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(a2av1.AddToScheme(scheme))
	utilruntime.Must(apiextensionsv1.AddToScheme(scheme))
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	e := &Env{Kubeconfig: kubeconfig, Config: cfg, Client: c, Clientset: cs, Root: root, Images: map[string]string{}}
	e.Kubectl = os.Getenv("KUBECTL")
	if e.Kubectl == "" && os.Getenv("KUBEBUILDER_ASSETS") != "" {
		e.Kubectl = filepath.Join(os.Getenv("KUBEBUILDER_ASSETS"), "kubectl")
	}
	e.Helm = cmpOr(os.Getenv("HELM"), filepath.Join(root, "bin", "helm-v3.22.0"))
	e.A2actl = cmpOr(os.Getenv("A2ACTL"), filepath.Join(root, "bin", "a2actl"))
	for name, path := range map[string]string{"kubectl (KUBECTL or KUBEBUILDER_ASSETS)": e.Kubectl, "helm (HELM)": e.Helm, "a2actl (A2ACTL)": e.A2actl} {
		if st, err := os.Stat(path); err != nil || st.IsDir() {
			return nil, fmt.Errorf("%s not found at %q: build it first (make tools-test)", name, path)
		}
	}
	for env, name := range imageVars {
		if v := os.Getenv(env); v != "" {
			e.Images[name] = v
		}
	}
	return e, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// Command runs a command with the cluster's kubeconfig and returns its combined output.
func (e *Env) Command(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = e.Root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.Kubeconfig)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// KubectlRun runs kubectl against the cluster.
func (e *Env) KubectlRun(ctx context.Context, args ...string) (string, error) {
	return e.Command(ctx, e.Kubectl, args...)
}

// Kustomization is a folder of the repository as `kubectl apply -k` takes it: the folder itself,
// or, with image overrides, an overlay of it in dir that sets them.
func (e *Env) Kustomization(dir, folder string) (string, error) {
	path := filepath.Join(e.Root, folder)
	if len(e.Images) == 0 {
		return path, nil
	}
	var b strings.Builder
	fmt.Fprintf(&b, "resources:\n- %s\nimages:\n", path)
	for name, image := range e.Images {
		newName, tag, _ := strings.Cut(image, ":")
		fmt.Fprintf(&b, "- name: %s\n  newName: %s\n", name, newName)
		if tag != "" {
			fmt.Fprintf(&b, "  newTag: %q\n", tag)
		}
	}
	overlay := filepath.Join(dir, strings.ReplaceAll(folder, "/", "-"))
	if err := os.MkdirAll(overlay, 0o755); err != nil {
		return "", err
	}
	return overlay, os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(b.String()), 0o644)
}

// HelmImageArgs are the chart values that set the overridden images.
func (e *Env) HelmImageArgs() []string {
	values := map[string]string{
		"a2a-fleet/operator":             "controllerManager.image",
		"a2a-fleet/conversation-service": "conversationService.image",
		"a2a-fleet/mosquitto":            "mosquitto.image",
	}
	var args []string
	for name, image := range e.Images {
		key, ok := values[name]
		if !ok {
			continue
		}
		repo, tag, _ := strings.Cut(image, ":")
		args = append(args, "--set", key+".repository="+repo)
		if tag != "" {
			args = append(args, "--set", key+".tag="+tag)
		}
	}
	return args
}

// Poll calls cond every interval until it returns true or an error, or timeout passes; the error
// then says what was waited for and the last state cond reported.
func Poll(ctx context.Context, timeout time.Duration, what string, cond func(ctx context.Context) (bool, string, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		ok, state, err := cond(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if ok {
			return nil
		}
		last = state
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not within %s (last: %s)", what, timeout, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// WaitDeployments waits until every named Deployment of namespace has all its replicas updated,
// ready and available, and no old replica left.
func (e *Env) WaitDeployments(ctx context.Context, namespace string, timeout time.Duration, names ...string) error {
	return Poll(ctx, timeout, "Deployments "+strings.Join(names, ", ")+" available", func(ctx context.Context) (bool, string, error) {
		var pending []string
		for _, name := range names {
			d := &appsv1.Deployment{}
			if err := e.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, d); err != nil {
				if apierrors.IsNotFound(err) {
					pending = append(pending, name+": not found")
					continue
				}
				return false, "", err
			}
			if !deploymentDone(d) {
				pending = append(pending, fmt.Sprintf("%s: %d/%d ready, %d updated, %d total", name,
					d.Status.ReadyReplicas, ptrOr(d.Spec.Replicas, 1), d.Status.UpdatedReplicas, d.Status.Replicas))
			}
		}
		return len(pending) == 0, strings.Join(pending, "; "), nil
	})
}

func deploymentDone(d *appsv1.Deployment) bool {
	want := ptrOr(d.Spec.Replicas, 1)
	return d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == want &&
		d.Status.ReadyReplicas == want && d.Status.AvailableReplicas == want && d.Status.Replicas == want
}

func ptrOr(p *int32, def int32) int32 {
	if p == nil {
		return def
	}
	return *p
}

// WaitAgents waits until every Agent of namespace is Ready (and Connected, when connected is true:
// its process is online as the broker sees it) and returns them.
func (e *Env) WaitAgents(ctx context.Context, namespace string, timeout time.Duration, connected bool, names ...string) ([]a2av1.Agent, error) {
	var agents []a2av1.Agent
	err := Poll(ctx, timeout, fmt.Sprintf("Agents %v Ready (connected: %v)", names, connected), func(ctx context.Context) (bool, string, error) {
		list := &a2av1.AgentList{}
		if err := e.Client.List(ctx, list, client.InNamespace(namespace)); err != nil {
			return false, "", err
		}
		var pending []string
		agents = agents[:0]
		for _, name := range names {
			i := slices.IndexFunc(list.Items, func(a a2av1.Agent) bool { return a.Name == name })
			if i < 0 {
				pending = append(pending, name+": not found")
				continue
			}
			a := list.Items[i]
			agents = append(agents, a)
			ready := meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionReady)
			if ready == nil || ready.Status != metav1.ConditionTrue || ready.ObservedGeneration != a.Generation {
				pending = append(pending, name+": "+ConditionSummary(a.Status.Conditions))
				continue
			}
			if connected && !meta.IsStatusConditionTrue(a.Status.Conditions, a2av1.ConditionConnected) {
				pending = append(pending, name+": "+ConditionSummary(a.Status.Conditions))
			}
		}
		return len(pending) == 0, strings.Join(pending, "; "), nil
	})
	return agents, err
}

// ConditionSummary is Type=Status(Reason) for each condition.
func ConditionSummary(cs []metav1.Condition) string {
	parts := make([]string, 0, len(cs))
	for _, c := range cs {
		parts = append(parts, fmt.Sprintf("%s=%s(%s)", c.Type, c.Status, c.Reason))
	}
	return strings.Join(parts, " ")
}

// BrokerNodePort exposes the installed Mosquitto to this machine: a NodePort Service of the
// suite's own (the manifests' Service stays ClusterIP) on the first node's InternalIP, which is
// reachable from the host on kind (the node container's address on its Docker network). It
// returns the broker URL.
func (e *Env) BrokerNodePort(ctx context.Context) (string, error) {
	const name = "a2a-fleet-mosquitto-e2e"
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace}}
	svc.Spec = corev1.ServiceSpec{
		Type:     corev1.ServiceTypeNodePort,
		Selector: map[string]string{"app.kubernetes.io/name": "mosquitto"},
		Ports:    []corev1.ServicePort{{Name: "mqtt", Port: 1883, TargetPort: intstr.FromInt32(1883)}},
	}
	if err := e.Client.Create(ctx, svc); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("create Service %s: %w", name, err)
	}
	if err := e.Client.Get(ctx, client.ObjectKeyFromObject(svc), svc); err != nil {
		return "", err
	}
	nodes := &corev1.NodeList{}
	if err := e.Client.List(ctx, nodes); err != nil || len(nodes.Items) == 0 {
		return "", fmt.Errorf("list nodes: %v (%d)", err, len(nodes.Items))
	}
	for _, a := range nodes.Items[0].Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return fmt.Sprintf("mqtt://%s:%d", a.Address, svc.Spec.Ports[0].NodePort), nil
		}
	}
	return "", fmt.Errorf("node %s has no InternalIP", nodes.Items[0].Name)
}

// Dump writes what a failed test needs to see: every pod of the namespaces with its containers'
// restarts and last state, the events, and each container's log tail (the previous instance's
// too when it restarted).
func (e *Env) Dump(t testing.TB, namespaces ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, ns := range namespaces {
		out, _ := e.KubectlRun(ctx, "get", "pods,deployments,agents,conversationpolicies", "-n", ns, "-o", "wide")
		t.Logf("=== %s: objects\n%s", ns, out)
		out, _ = e.KubectlRun(ctx, "get", "events", "-n", ns, "--sort-by=.lastTimestamp")
		t.Logf("=== %s: events\n%s", ns, tail(out, 60))
		pods, err := e.Clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Logf("list pods in %s: %v", ns, err)
			continue
		}
		for _, p := range pods.Items {
			for _, cs := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
				args := []string{"logs", "-n", ns, p.Name, "-c", cs.Name, "--tail", "80"}
				out, _ := e.KubectlRun(ctx, args...)
				t.Logf("=== %s/%s [%s] (restarts %d)\n%s", ns, p.Name, cs.Name, cs.RestartCount, out)
				if cs.RestartCount > 0 {
					out, _ := e.KubectlRun(ctx, append(args, "--previous")...)
					t.Logf("=== %s/%s [%s] previous\n%s", ns, p.Name, cs.Name, out)
				}
			}
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Restarts counts the container restarts of the pods of namespace that match selector.
func (e *Env) Restarts(ctx context.Context, namespace, selector string) (map[string]int32, error) {
	pods, err := e.Clientset.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	out := map[string]int32{}
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			out[p.Name+"/"+cs.Name] = cs.RestartCount
		}
	}
	return out, nil
}

// Pods lists the running, ready pods of namespace that match selector.
func (e *Env) Pods(ctx context.Context, namespace, selector string) ([]corev1.Pod, error) {
	pods, err := e.Clientset.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	var ready []corev1.Pod
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && podReady(&p) {
			ready = append(ready, p)
		}
	}
	return ready, nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Kill deletes the pod at once (no grace period), as a node losing a process does: its
// Deployment starts a new one.
func (e *Env) Kill(ctx context.Context, pod *corev1.Pod) error {
	return e.Clientset.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
}
