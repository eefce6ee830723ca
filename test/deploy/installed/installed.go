// Package installed brings up a2a-fleet the way a user installs it, on a localcluster: the
// rendered manifests applied with server-side apply, every Deployment's pods running as local
// processes of the Dockerfile's binaries, the samples applied and the example agents running with
// the credentials the operator issued. The deployment e2e (test/deploy) and the chaos suite
// (test/chaos) run on it.
package installed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/policy"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/localcluster"
	"github.com/a2a-fleet/a2a-fleet/test/deploy/render"
)

// Binaries built once per test process: the images' two binaries and the clients.
var Binaries = []string{"./cmd/manager", "./cmd/conversation-service", "./cmd/a2actl", "./examples/echo", "./examples/confirm", "./examples/memory"}

var build struct {
	sync.Once
	dir string
	err error
}

// BuildBinaries compiles Binaries once per test process with the Dockerfile's flags into a folder
// every pod user can read.
func BuildBinaries(t testing.TB, root string) string {
	t.Helper()
	build.Do(func() {
		dir, err := os.MkdirTemp("", "a2a-fleet-bin-")
		if err == nil {
			err = os.Chmod(dir, 0o755)
		}
		if err == nil {
			start := time.Now()
			err = localcluster.Build(root, dir, Binaries...)
			fmt.Printf("installed: built %d binaries in %s\n", len(Binaries), time.Since(start).Round(100*time.Millisecond))
		}
		build.dir, build.err = dir, err
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.dir
}

// Stack is an installed a2a-fleet.
type Stack struct {
	Root    string
	Bin     string
	Cluster *localcluster.Cluster
	Objects []*unstructured.Unstructured
	// Pods by Deployment name (a2a-fleet-controller-manager, ...), one per replica.
	Pods map[string][]*localcluster.Pod
	// BrokerURL is the broker as the agents reach it (the operator's workload broker URL,
	// translated to the loopback port of the broker pod).
	BrokerURL string
	// Agents are the example agents' processes, by Agent name.
	Agents map[string]*localcluster.Proc

	t       testing.TB
	dir     string
	mu      sync.Mutex
	clients []*localcluster.Proc
}

// Namespace of the install (config/quickstart's, the chart's release namespace in the tests).
const Namespace = render.Namespace

// Deployment names of the install.
const (
	Operator = "a2a-fleet-controller-manager"
	Service  = "a2a-fleet-conversation-service"
	Broker   = "a2a-fleet-mosquitto"
)

// Install starts a control plane, applies objs and runs every Deployment's pods until they are
// ready. Everything stops when the test ends; the cluster's folder (logs) is kept when it failed.
func Install(ctx context.Context, t testing.TB, objs []*unstructured.Unstructured) *Stack {
	t.Helper()
	return InstallWith(ctx, t, objs, nil)
}

// InstallWith is Install with stand-ins for more images (what an overlay adds, e.g. redis).
func InstallWith(ctx context.Context, t testing.TB, objs []*unstructured.Unstructured, images map[string]localcluster.Image) *Stack {
	t.Helper()
	root, err := render.RepoRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	bin := BuildBinaries(t, root)
	dir, err := os.MkdirTemp("", "a2a-fleet-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	c, err := localcluster.Start(localcluster.Options{Assets: os.Getenv("KUBEBUILDER_ASSETS"), Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	c.Images = localcluster.DefaultImages(bin)
	for repo, img := range images {
		c.Images[repo] = img
	}
	s := &Stack{Root: root, Bin: bin, Cluster: c, Objects: objs, Pods: map[string][]*localcluster.Pod{}, Agents: map[string]*localcluster.Proc{}, t: t, dir: dir}
	t.Cleanup(func() {
		s.stopClients()
		if err := c.Stop(); err != nil {
			t.Logf("stop cluster: %v", err)
		}
		if t.Failed() {
			t.Logf("cluster folder kept for inspection: %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	start := time.Now()
	if err := c.Apply(ctx, objs, ""); err != nil {
		t.Fatal(err)
	}
	// Every Deployment's replicas start together, as a scheduler would place them: the broker and
	// the service wait (like the kubelet) for the Secrets the operator writes.
	type started struct {
		name string
		pod  *localcluster.Pod
		err  error
	}
	results := make(chan started)
	n := 0
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		d := &appsv1.Deployment{}
		if err := c.Client.Get(ctx, client.ObjectKey{Namespace: o.GetNamespace(), Name: o.GetName()}, d); err != nil {
			t.Fatal(err)
		}
		for r := range int(ptr.Deref(d.Spec.Replicas, 1)) {
			n++
			go func() {
				p, err := c.StartPod(ctx, o.GetNamespace(), o.GetName(), r)
				results <- started{o.GetName(), p, err}
			}()
		}
	}
	var errs []string
	for range n {
		r := <-results
		if r.err != nil {
			errs = append(errs, r.err.Error())
			continue
		}
		s.Pods[r.name] = append(s.Pods[r.name], r.pod)
	}
	if len(errs) > 0 {
		s.dumpOnFailure()
		t.Fatalf("start pods:\n%s", strings.Join(errs, "\n"))
	}
	for _, pods := range s.Pods {
		for _, p := range pods {
			if err := p.WaitReady(ctx, 3*time.Minute); err != nil {
				s.dumpOnFailure()
				t.Fatal(err)
			}
		}
	}
	t.Logf("installed %d objects, %d pods ready in %s", len(objs), n, time.Since(start).Round(100*time.Millisecond))
	for _, pods := range s.Pods {
		for _, tr := range pods[0].Translations {
			t.Logf("  %s: %s", pods[0].Deployment, tr)
		}
	}
	if s.BrokerURL, err = s.workloadBrokerURL(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

// workloadBrokerURL is what the operator gives agent workloads as A2A_BROKER, translated.
func (s *Stack) workloadBrokerURL(ctx context.Context) (string, error) {
	d := &appsv1.Deployment{}
	if err := s.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: Namespace, Name: Operator}, d); err != nil {
		return "", err
	}
	var url string
	for _, a := range d.Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--broker-url="); ok && url == "" {
			url = v
		}
		if v, ok := strings.CutPrefix(a, "--workload-broker-url="); ok {
			url = v
		}
	}
	if url == "" {
		return "", fmt.Errorf("operator deployment has no --broker-url: %v", d.Spec.Template.Spec.Containers[0].Args)
	}
	return s.Cluster.LocalURL(ctx, url)
}

// dumpOnFailure logs every pod's and client's output.
func (s *Stack) dumpOnFailure() {
	for _, p := range s.Cluster.Pods() {
		s.t.Logf("%s", tail(p.Logs(), 12000))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, a := range s.Agents {
		s.t.Logf("----- agent %s\n%s", name, tail(a.Output(), 4000))
	}
}

// DumpOnFailure registers a cleanup that logs every process's output when the test failed.
func (s *Stack) DumpOnFailure() {
	s.t.Cleanup(func() {
		if s.t.Failed() {
			s.dumpOnFailure()
		}
	})
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// ApplySamples applies config/samples in namespace (server-side apply, as `kubectl apply
// --server-side -f config/samples/`).
func (s *Stack) ApplySamples(ctx context.Context, namespace string) []*unstructured.Unstructured {
	s.t.Helper()
	files, err := filepath.Glob(filepath.Join(s.Root, "config", "samples", "*.yaml"))
	if err != nil || len(files) == 0 {
		s.t.Fatalf("no samples: %v", err)
	}
	var objs []*unstructured.Unstructured
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			s.t.Fatal(err)
		}
		o, err := render.Decode(data)
		if err != nil {
			s.t.Fatalf("%s: %v", f, err)
		}
		objs = append(objs, o...)
	}
	if err := s.Cluster.Apply(ctx, objs, namespace); err != nil {
		s.t.Fatal(err)
	}
	return objs
}

// WaitAgentsReady waits until every Agent of namespace is Ready under the policy that governs it
// (so a governed Agent has its delivery topic) and returns them.
func (s *Stack) WaitAgentsReady(ctx context.Context, namespace string, timeout time.Duration) []a2av1.Agent {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var agents a2av1.AgentList
		var policies a2av1.ConversationPolicyList
		err := s.Cluster.Client.List(ctx, &agents, client.InNamespace(namespace))
		if err == nil {
			err = s.Cluster.Client.List(ctx, &policies, client.InNamespace(namespace))
		}
		var notReady []string
		for _, a := range agents.Items {
			want := ""
			if m := policy.Matching(policies.Items, a.Labels); len(m) > 0 {
				want = m[0].Name
			}
			gated := a.Status.Topics != nil && a.Status.Topics.Delivery != ""
			if !meta.IsStatusConditionTrue(a.Status.Conditions, a2av1.ConditionReady) || a.Status.ConversationPolicy != want || gated != (want != "") {
				notReady = append(notReady, fmt.Sprintf("%s (policy %q, delivery %v): %v", a.Name, a.Status.ConversationPolicy, gated, conditions(a.Status.Conditions)))
			}
		}
		if err == nil && len(agents.Items) > 0 && len(notReady) == 0 {
			return agents.Items
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("agents not ready after %s: %v %s", timeout, err, strings.Join(notReady, "; "))
		}
		select {
		case <-ctx.Done():
			s.t.Fatal(ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func conditions(cs []metav1.Condition) string {
	var out []string
	for _, c := range cs {
		out = append(out, fmt.Sprintf("%s=%s/%s", c.Type, c.Status, c.Reason))
	}
	return strings.Join(out, ",")
}

// exampleLabel names the example agent (examples/) that serves a sample Agent.
const exampleLabel = "a2a.fleet.dev/example"

// Credentials reads an Agent's broker credentials from its Secret.
func (s *Stack) Credentials(ctx context.Context, namespace, agent string) (username, password string) {
	s.t.Helper()
	a := &a2av1.Agent{}
	if err := s.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: agent}, a); err != nil {
		s.t.Fatal(err)
	}
	sec := &corev1.Secret{}
	if err := s.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: a.Status.CredentialsSecret}, sec); err != nil {
		s.t.Fatal(err)
	}
	return string(sec.Data[identity.SecretKeyUsername]), string(sec.Data[identity.SecretKeyPassword])
}

// StartExampleAgent runs the example binary that serves Agent a (its example label), with the
// variables the operator gives a workload: broker, identity, credentials, request topic.
func (s *Stack) StartExampleAgent(ctx context.Context, a *a2av1.Agent) *localcluster.Proc {
	s.t.Helper()
	kind := a.Labels[exampleLabel]
	if kind == "" {
		s.t.Fatalf("agent %s has no %s label", a.Name, exampleLabel)
	}
	user, pass := s.Credentials(ctx, a.Namespace, a.Name)
	id := identity.Of(a)
	delivery := ""
	if a.Status.Topics != nil {
		delivery = a.Status.Topics.Delivery
	}
	env := []string{"A2A_BROKER=" + s.BrokerURL, "A2A_ORG=" + id.Org, "A2A_UNIT=" + id.Unit, "A2A_AGENT=" + id.Agent,
		"A2A_USERNAME=" + user, "A2A_PASSWORD=" + pass, "A2A_REQUEST_TOPIC=" + delivery}
	p, err := localcluster.StartProcess(filepath.Join(s.dir, "agent-"+a.Name+".log"), []string{filepath.Join(s.Bin, kind)}, env, nil)
	if err != nil {
		s.t.Fatal(err)
	}
	s.mu.Lock()
	s.Agents[a.Name] = p
	s.clients = append(s.clients, p)
	s.mu.Unlock()
	return p
}

// StartExampleAgents starts the example agent of every labelled Agent in agents.
func (s *Stack) StartExampleAgents(ctx context.Context, agents []a2av1.Agent) {
	s.t.Helper()
	for i := range agents {
		if agents[i].Labels[exampleLabel] != "" {
			s.StartExampleAgent(ctx, &agents[i])
		}
	}
}

func (s *Stack) stopClients() {
	s.mu.Lock()
	clients := s.clients
	s.clients = nil
	s.mu.Unlock()
	for _, p := range clients {
		p.Kill()
	}
}

// A2actl runs the a2actl binary as the given Agent's identity (its Secret) against the broker and
// returns its output.
func (s *Stack) A2actl(ctx context.Context, namespace, as string, args ...string) (string, error) {
	s.t.Helper()
	a := &a2av1.Agent{}
	if err := s.Cluster.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: as}, a); err != nil {
		s.t.Fatal(err)
	}
	user, pass := s.Credentials(ctx, namespace, as)
	cmd := exec.CommandContext(ctx, filepath.Join(s.Bin, "a2actl"), args...)
	cmd.Env = []string{"A2A_BROKER=" + s.BrokerURL, "A2A_AS=" + identity.Of(a).String(), "A2A_USERNAME=" + user, "A2A_PASSWORD=" + pass}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// taskLine is a2actl's summary of a task: "task ID (context ID): state".
var taskLine = regexp.MustCompile(`(?m)^task (\S+) \(context ([^)]+)\): (\S+)$`)

// ParseTask reads a2actl's task line.
func ParseTask(out string) (task, contextID, state string, ok bool) {
	m := taskLine.FindStringSubmatch(out)
	if m == nil {
		return "", "", "", false
	}
	return m[1], m[2], m[3], true
}
