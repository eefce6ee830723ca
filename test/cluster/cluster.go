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
	"io"
	"net/http"
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
	// Chart is what TestHelmChartOnARealCluster installs: the release bundle's packaged chart
	// (A2A_FLEET_DIST) or charts/a2a-fleet.
	Chart string
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
	// The chart from the release bundle (make release) when A2A_FLEET_DIST names it, as a user of
	// the bundle installs it; the working tree's otherwise.
	e.Chart = filepath.Join(root, "charts", "a2a-fleet")
	if dist := os.Getenv("A2A_FLEET_DIST"); dist != "" {
		version, err := os.ReadFile(filepath.Join(root, "VERSION"))
		if err != nil {
			return nil, err
		}
		e.Chart = filepath.Join(dist, "a2a-fleet-"+strings.TrimSpace(string(version))+".tgz")
		if _, err := os.Stat(e.Chart); err != nil {
			return nil, fmt.Errorf("A2A_FLEET_DIST: no packaged chart: %w (make release)", err)
		}
	}
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
// or, with image overrides or components, an overlay of it in dir that sets them (a component is
// used as a user's overlay uses it, e.g. config/quickstart/tls).
func (e *Env) Kustomization(dir, folder string, components ...string) (string, error) {
	path := filepath.Join(e.Root, folder)
	if len(e.Images) == 0 && len(components) == 0 {
		return path, nil
	}
	overlay := filepath.Join(dir, strings.ReplaceAll(folder, "/", "-"))
	// kustomize takes only relative paths, from the overlay's folder.
	rel := func(p string) (string, error) { return filepath.Rel(overlay, filepath.Join(e.Root, p)) }
	var b strings.Builder
	r, err := rel(folder)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(&b, "resources:\n- %s\n", r)
	if len(components) > 0 {
		b.WriteString("components:\n")
		for _, c := range components {
			r, err := rel(c)
			if err != nil {
				return "", err
			}
			fmt.Fprintf(&b, "- %s\n", r)
		}
	}
	if len(e.Images) > 0 {
		b.WriteString("images:\n")
	}
	for name, image := range e.Images {
		newName, tag, _ := strings.Cut(image, ":")
		fmt.Fprintf(&b, "- name: %s\n  newName: %s\n", name, newName)
		if tag != "" {
			fmt.Fprintf(&b, "  newTag: %q\n", tag)
		}
	}
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

// Image is the image the cluster runs for one of the manifests' image names (imageVars): its
// override, or the manifests' own (tag dev).
func (e *Env) Image(name string) string {
	if image, ok := e.Images[name]; ok {
		return image
	}
	return name + ":dev"
}

// PodGet sends GET path to a pod's port through the API server's pod proxy (the host cannot reach
// pod addresses) and returns the status and body the pod answered. An error means no answer from
// the pod: the API server's own (a Status object: the pod unreachable, not found) or the request's.
// (client-go's REST client drops the status and body of a plain-text error answer, which is what
// a failing /readyz says; hence the plain HTTP client of the cluster's config.)
func (e *Env) PodGet(ctx context.Context, namespace, pod, port, path string) (int, []byte, error) {
	httpClient, err := rest.HTTPClientFor(e.Config)
	if err != nil {
		return 0, nil, err
	}
	url := fmt.Sprintf("%s/api/v1/namespaces/%s/pods/%s:%s/proxy%s", strings.TrimSuffix(e.Config.Host, "/"), namespace, pod, port, path)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	res, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: %w", url, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if res.StatusCode >= 300 && strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") && bytes.Contains(body, []byte(`"kind":"Status"`)) {
		return res.StatusCode, body, fmt.Errorf("GET %s: the API server answered %d: %s", url, res.StatusCode, body)
	}
	return res.StatusCode, body, nil
}

// Exec runs a command in a pod's container (kubectl exec) and returns its output.
func (e *Env) Exec(ctx context.Context, namespace, pod, container string, command ...string) (string, error) {
	return e.KubectlRun(ctx, append([]string{"exec", "-n", namespace, pod, "-c", container, "--"}, command...)...)
}

// Scale sets a Deployment's replicas (its scale subresource, as `kubectl scale` does).
func (e *Env) Scale(ctx context.Context, namespace, name string, replicas int32) error {
	deployments := e.Clientset.AppsV1().Deployments(namespace)
	scale, err := deployments.GetScale(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("scale of %s/%s: %w", namespace, name, err)
	}
	scale.Spec.Replicas = replicas
	if _, err := deployments.UpdateScale(ctx, name, scale, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("scale %s/%s to %d: %w", namespace, name, replicas, err)
	}
	return nil
}

// nodeToolsNamespace holds the pods that act on nodes (Signal): not the install's namespace,
// which enforces the restricted Pod Security level.
const nodeToolsNamespace = "a2a-fleet-e2e-node"

// signalScript signals every process whose cgroup names container ID $1 with signal $2, and
// prints their process IDs: run in the node's process namespace, it finds a container's
// processes as the kubelet's runtime placed them (the cgroup path holds the container's ID under
// either cgroup driver).
const signalScript = `set -eu
pids=""
for f in /proc/[0-9]*/cgroup; do
	if grep -qF "$1" "$f" 2>/dev/null; then p="${f#/proc/}"; pids="$pids ${p%/cgroup}"; fi
done
[ -n "$pids" ] || { echo "no process of container $1 on this node" >&2; exit 1; }
kill -s "$2" $pids
echo $pids`

// Signal sends signal (a name: KILL, TERM, ...) to the processes of a pod's container, as a
// process crash or a kill on the node would: the pod stays and its kubelet restarts the container
// (unlike Kill, which deletes the pod; a deletion with grace 0 still lets the kubelet stop the
// containers with SIGTERM first). It runs the kill from a pod on the pod's node in the node's
// process namespace (hostPID), on the broker image (a Debian with a shell), and returns once the
// signal was sent; the caller waits for the outcome it expects (a restart, an exit).
func (e *Env) Signal(ctx context.Context, pod *corev1.Pod, container, signal string) error {
	id := ""
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == container && cs.State.Running != nil {
			_, id, _ = strings.Cut(cs.ContainerID, "://")
		}
	}
	if id == "" {
		return fmt.Errorf("pod %s/%s: container %s is not running", pod.Namespace, pod.Name, container)
	}
	tools, err := e.nodeTools(ctx, pod.Spec.NodeName)
	if err != nil {
		return err
	}
	if _, err := e.Exec(ctx, nodeToolsNamespace, tools, "signal", "sh", "-c", signalScript, "signal", id, signal); err != nil {
		return fmt.Errorf("SIG%s to %s/%s [%s]: %w", signal, pod.Namespace, pod.Name, container, err)
	}
	return nil
}

// nodeTools starts (once) the pod that signals containers on node, and returns its name.
func (e *Env) nodeTools(ctx context.Context, node string) (string, error) {
	name := "signal-" + node
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nodeToolsNamespace}}
	if err := e.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("create namespace %s: %w", nodeToolsNamespace, err)
	}
	root := int64(0)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: nodeToolsNamespace}, Spec: corev1.PodSpec{
		NodeName:                      node,
		HostPID:                       true,
		AutomountServiceAccountToken:  new(bool),
		TerminationGracePeriodSeconds: new(int64),
		Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		Containers: []corev1.Container{{
			Name: "signal", Image: e.Image("a2a-fleet/mosquitto"), ImagePullPolicy: corev1.PullIfNotPresent,
			Command:         []string{"sleep", "infinity"},
			SecurityContext: &corev1.SecurityContext{RunAsUser: &root, RunAsGroup: &root},
		}},
	}}
	if err := e.Client.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("create pod %s/%s: %w", nodeToolsNamespace, name, err)
	}
	err := Poll(ctx, 2*time.Minute, "pod "+nodeToolsNamespace+"/"+name+" running", func(ctx context.Context) (bool, string, error) {
		if err := e.Client.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return false, "", err
		}
		return pod.DeletionTimestamp == nil && pod.Status.Phase == corev1.PodRunning && podReady(pod), string(pod.Status.Phase), nil
	})
	return name, err
}

// Uninstall removes a2a-fleet from the cluster, so that an install starts from a cluster without
// it: every Agent first, while the operator still runs to remove its finalizers (the finalizers
// of those it did not remove are dropped), a Helm release, config/quickstart, and the
// a2a.fleet.dev CRDs (the chart keeps them); it waits until the namespace and the CRDs are gone.
func (e *Env) Uninstall(ctx context.Context, logf func(format string, args ...any)) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	agents := &a2av1.AgentList{}
	if err := e.Client.List(ctx, agents); err == nil && len(agents.Items) > 0 {
		logf("deleting the %d Agents of an earlier run", len(agents.Items))
		for i := range agents.Items {
			if err := e.Client.Delete(ctx, &agents.Items[i]); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete Agent %s/%s: %w", agents.Items[i].Namespace, agents.Items[i].Name, err)
			}
		}
		err := Poll(ctx, 2*time.Minute, "Agents finalized", func(ctx context.Context) (bool, string, error) {
			if err := e.Client.List(ctx, agents); err != nil {
				return false, "", err
			}
			return len(agents.Items) == 0, fmt.Sprintf("%d left", len(agents.Items)), nil
		})
		if err != nil {
			logf("%v: their finalizers are removed", err)
		}
		for i := range agents.Items {
			a := &agents.Items[i]
			patch := client.MergeFrom(a.DeepCopy())
			a.Finalizers = nil
			if err := e.Client.Patch(ctx, a, patch); err != nil && !apierrors.IsNotFound(err) {
				logf("remove finalizers of %s/%s: %v", a.Namespace, a.Name, err)
			}
		}
	}
	if out, _ := e.Command(ctx, e.Helm, "list", "-n", Namespace, "-q"); strings.Contains(out, "a2a-fleet") {
		if _, err := e.Command(ctx, e.Helm, "uninstall", "a2a-fleet", "-n", Namespace, "--wait"); err != nil {
			return err
		}
	}
	if _, err := e.KubectlRun(ctx, "delete", "-k", filepath.Join(e.Root, "config/quickstart"), "--ignore-not-found", "--wait=true", "--timeout=3m"); err != nil {
		return err
	}
	crds := &apiextensionsv1.CustomResourceDefinitionList{}
	if err := e.Client.List(ctx, crds); err == nil {
		for i := range crds.Items {
			if crds.Items[i].Spec.Group == a2av1.GroupVersion.Group {
				_ = e.Client.Delete(ctx, &crds.Items[i])
			}
		}
	}
	return Poll(ctx, 3*time.Minute, "namespace "+Namespace+" and the a2a.fleet.dev CRDs gone", func(ctx context.Context) (bool, string, error) {
		err := e.Client.Get(ctx, client.ObjectKey{Name: Namespace}, &corev1.Namespace{})
		if err == nil {
			return false, "namespace terminating", nil
		}
		if !apierrors.IsNotFound(err) {
			return false, "", err
		}
		if err := e.Client.List(ctx, crds); err != nil {
			return false, "", err
		}
		for _, crd := range crds.Items {
			if crd.Spec.Group == a2av1.GroupVersion.Group {
				return false, "CRD " + crd.Name + " terminating", nil
			}
		}
		return true, "", nil
	})
}
