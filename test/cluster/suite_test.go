package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

var env *Env

func TestMain(m *testing.M) {
	var err error
	if env, err = FromEnv(); err != nil {
		fmt.Fprintln(os.Stderr, "test/cluster:", err)
		os.Exit(1)
	}
	version, err := env.Clientset.Discovery().ServerVersion()
	if err != nil {
		fmt.Fprintln(os.Stderr, "test/cluster: the cluster does not answer:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	nodes, _ := env.Clientset.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	cancel()
	runtimes := []string{}
	if nodes != nil {
		for _, n := range nodes.Items {
			runtimes = append(runtimes, n.Name+" "+n.Status.NodeInfo.KubeletVersion+" "+n.Status.NodeInfo.ContainerRuntimeVersion)
		}
	}
	fmt.Printf("cluster: kube-apiserver %s, nodes: %s\n", version.GitVersion, strings.Join(runtimes, "; "))
	os.Exit(m.Run())
}

const samplesNamespace = "default"

// sampleAgents are config/samples-workloads' Agents whose example agent runs as a pod.
var sampleAgents = []string{"echo", "confirm", "memory"}

// The quickstart, installed as the README says (kubectl apply --server-side -k), with the
// samples' example agents as pods; then what an operator of the cluster does to it.
func TestQuickstartOnARealCluster(t *testing.T) {
	ctx := context.Background()
	t.Cleanup(func() {
		if t.Failed() {
			env.Dump(t, Namespace, samplesNamespace)
		}
	})
	uninstall(ctx, t)
	start := time.Now()
	quickstart, err := env.Kustomization(t.TempDir(), "config/quickstart")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := env.KubectlRun(ctx, "apply", "--server-side", "-k", quickstart); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("kubectl apply --server-side -k config/quickstart:\n%s", tail(out, 8))
	}
	if err := env.WaitDeployments(ctx, Namespace, 5*time.Minute, "a2a-fleet-controller-manager", "a2a-fleet-conversation-service", "a2a-fleet-mosquitto"); err != nil {
		t.Fatal(err)
	}
	t.Logf("operator, conversation service and Mosquitto available %.1fs after the apply", time.Since(start).Seconds())
	b := runSamples(ctx, t)
	if !t.Run("no restarts, no RBAC refusals, one leader", func(t *testing.T) { healthy(ctx, t) }) {
		return
	}
	if !t.Run("a never-connected Agent is not connected", func(t *testing.T) { neverConnected(ctx, t) }) {
		return
	}
	if !t.Run("chat through the conversation service", func(t *testing.T) { b.chatConfirm(ctx, t) }) {
		return
	}
	if !t.Run("history from the conversation service", func(t *testing.T) { b.chatMemory(ctx, t) }) {
		return
	}
	if !t.Run("user story 08: an agent on plain paho answers SendMessage with a stream", func(t *testing.T) { b.userStory08(ctx, t) }) {
		return
	}
	if !t.Run("the decision table on the broker's claim", func(t *testing.T) { brokerStateOnVolume(ctx, t, "table/a2a-fleet-table.db") }) {
		return
	}
	if !t.Run("every card signed, verified with the retained JWKS", func(t *testing.T) { b.signedCards(ctx, t) }) {
		return
	}
	if !t.Run("the broker enforces with the operator scaled to 0", func(t *testing.T) { b.operatorScaledToZero(ctx, t) }) {
		return
	}
	if !t.Run("credential rotation rolls the pod", func(t *testing.T) { b.rotate(ctx, t, "echo") }) {
		return
	}
	if !t.Run("deleting an Agent leaves nothing behind", func(t *testing.T) { b.deleteAgent(ctx, t, "echo") }) {
		return
	}
	if !t.Run("the service takes a new password without a restart", func(t *testing.T) { b.newServicePassword(ctx, t) }) {
		return
	}
	if !t.Run("conversations outlive the service's pod (its claim holds them)", func(t *testing.T) { b.serviceStateSurvivesItsPod(ctx, t) }) {
		return
	}
	if !t.Run("an HTTP client calls an agent through the optional gateway", func(t *testing.T) { b.gatewayCallsAnAgent(ctx, t) }) {
		return
	}
	if !t.Run("the broker's identities outlive its pod (its claim holds them)", func(t *testing.T) { b.brokerStateSurvivesItsPod(ctx, t) }) {
		return
	}
	if !t.Run("the operator's and the service's metrics agree with the cluster", func(t *testing.T) { b.installedMetrics(ctx, t) }) {
		return
	}
	t.Run("killed operator and broker pods recover", func(t *testing.T) { b.killAndRecover(ctx, t) })
}

// The Helm chart with Mosquitto's dynsec, installed on the same cluster after the quickstart is
// removed.
func TestHelmChartOnARealCluster(t *testing.T) {
	ctx := context.Background()
	t.Cleanup(func() {
		if t.Failed() {
			env.Dump(t, Namespace, samplesNamespace)
		}
	})
	uninstall(ctx, t)
	start := time.Now()
	// On dynsec (broker.backend=dynsec), the backend the quickstart's default no longer runs, so
	// that both backends are proven on a real kubelet.
	t.Logf("installing %s", env.Chart)
	args := append([]string{"install", "a2a-fleet", env.Chart,
		"--namespace", Namespace, "--create-namespace", "--set", "broker.backend=dynsec"}, env.HelmImageArgs()...)
	if out, err := env.Command(ctx, env.Helm, args...); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("helm install:\n%s", tail(out, 6))
	}
	if err := env.WaitDeployments(ctx, Namespace, 5*time.Minute, "a2a-fleet-controller-manager", "a2a-fleet-conversation-service", "a2a-fleet-mosquitto"); err != nil {
		t.Fatal(err)
	}
	t.Logf("operator, conversation service and Mosquitto available %.1fs after helm install", time.Since(start).Seconds())
	b := runSamples(ctx, t)
	t.Run("no restarts, no RBAC refusals, one leader", func(t *testing.T) { healthy(ctx, t) })
	t.Run("chat through the conversation service", func(t *testing.T) { b.chatConfirm(ctx, t) })
	t.Run("dynsec's state on the broker's claim", func(t *testing.T) { brokerStateOnVolume(ctx, t, "dynamic-security.json") })
}

// healthy checks what the install must not do on its own: restart a container, be refused by the
// API server (RBAC the manifests forgot) or run without a leader.
func healthy(ctx context.Context, t *testing.T) {
	for _, ns := range []string{Namespace, samplesNamespace} {
		restarts, err := env.Restarts(ctx, ns, "")
		if err != nil {
			t.Fatal(err)
		}
		for container, n := range restarts {
			if n > 0 {
				t.Errorf("%s/%s restarted %d times", ns, container, n)
			}
		}
	}
	for _, deploy := range []string{"a2a-fleet-controller-manager", "a2a-fleet-conversation-service"} {
		out, err := env.KubectlRun(ctx, "logs", "-n", Namespace, "deploy/"+deploy, "--all-containers", "--tail", "-1")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(strings.ToLower(line), "forbidden") {
				t.Errorf("%s was refused by the API server: %s", deploy, line)
			}
		}
	}
	lease, err := env.Clientset.CoordinationV1().Leases(Namespace).Get(ctx, "a2a-fleet-operator.a2a.fleet.dev", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the operator's leader election Lease: %v", err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		t.Fatal("the leader election Lease has no holder")
	}
	t.Logf("no restarts, no refusals; leader %s", *lease.Spec.HolderIdentity)
}

// bus is the installed stack as the host sees it: the broker through the suite's NodePort, with
// the console's credentials for a2actl.
type bus struct {
	broker  string
	console string // folder with the console Agent's username and password files
}

// runSamples applies config/samples-workloads, waits until every Agent is Ready and its example
// agent's pod is connected, and returns the host's way onto the bus.
func runSamples(ctx context.Context, t *testing.T) *bus {
	t.Helper()
	samples, err := env.Kustomization(t.TempDir(), "config/samples-workloads")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := env.KubectlRun(ctx, "apply", "--server-side", "-n", samplesNamespace, "-k", samples); err != nil {
		t.Fatal(err)
	}
	if _, err := env.WaitAgents(ctx, samplesNamespace, 4*time.Minute, true, sampleAgents...); err != nil {
		t.Fatal(err)
	}
	if _, err := env.WaitAgents(ctx, samplesNamespace, time.Minute, false, "console"); err != nil {
		t.Fatal(err)
	}
	for _, name := range sampleAgents {
		pods, err := env.Pods(ctx, samplesNamespace, "a2a.fleet.dev/agent="+name)
		if err != nil || len(pods) != 1 {
			t.Fatalf("Agent %s: want 1 ready pod, got %d (%v)", name, len(pods), err)
		}
	}
	t.Logf("samples: %d example agents Ready, Connected, in ready pods %.1fs after the apply", len(sampleAgents), time.Since(start).Seconds())
	return consoleBus(ctx, t)
}

// consoleBus is the bus as the console sample sees it: the broker's NodePort and the console's
// credentials from its Secret; the samples' cards are checked on it before it is handed out.
func consoleBus(ctx context.Context, t *testing.T) *bus {
	t.Helper()
	broker, err := env.BrokerNodePort(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b := &bus{broker: broker, console: t.TempDir()}
	secret := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: samplesNamespace, Name: "console-mqtt-credentials"}, secret); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"username", "password"} {
		if err := os.WriteFile(filepath.Join(b.console, key), secret.Data[key], 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b.checkCards(ctx, t)
	return b
}

// checkCards checks that the cards on the broker are the manifests' (the pods publish the card
// the operator gives them, docs/api.md) and that a2actl sees every example agent online.
func (b *bus) checkCards(ctx context.Context, t *testing.T) {
	t.Helper()
	want := map[string]string{"acme/demo/echo": "", "acme/demo/confirm": "", "acme/demo/memory-agent": ""}
	for _, name := range sampleAgents {
		a := &a2av1.Agent{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: samplesNamespace, Name: name}, a); err != nil {
			t.Fatal(err)
		}
		want["acme/demo/"+cmpOr(a.Spec.AgentID, a.Name)] = a.Spec.Card.Name
	}
	var out string
	err := Poll(ctx, time.Minute, "a2actl agents shows every example agent online with its manifest's card", func(ctx context.Context) (bool, string, error) {
		var err error
		if out, err = b.a2actl(ctx, "agents"); err != nil {
			return false, err.Error(), nil
		}
		for ref, name := range want {
			ok := false
			for _, line := range strings.Split(out, "\n") {
				f := strings.Fields(line)
				if len(f) >= 3 && f[0] == ref && f[1] == "online" && strings.Contains(line, " "+name+" ") {
					ok = true
				}
			}
			if !ok {
				return false, fmt.Sprintf("%s not online as %q:\n%s", ref, name, out), nil
			}
		}
		return true, "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a2actl agents:\n%s", out)
}

// a2actl runs the CLI from this machine as the console; one call may take 30 s (its own
// timeouts are shorter), so that a wait retries a call that hangs.
func (b *bus) a2actl(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	args = append(args, "--broker", b.broker, "--credentials-dir", b.console, "--as", "acme/demo/console")
	return env.Command(ctx, env.A2actl, args...)
}

var taskLine = regexp.MustCompile(`(?m)^task (\S+) \(context (\S+)\): (\S+)$`)

// send sends one message with a2actl, retrying while the bus is still settling (a clear error
// such as responder_unavailable right after a restart), and returns task, context and state.
func (b *bus) send(ctx context.Context, t *testing.T, within time.Duration, args ...string) (task, contextID, state, out string) {
	t.Helper()
	err := Poll(ctx, within, "a2actl send "+strings.Join(args, " "), func(ctx context.Context) (bool, string, error) {
		var err error
		out, err = b.a2actl(ctx, append([]string{"send"}, args...)...)
		if err != nil {
			return false, err.Error(), nil
		}
		m := taskLine.FindStringSubmatch(out)
		if m == nil {
			return false, "", fmt.Errorf("no task line in %q", out)
		}
		task, contextID, state = m[1], m[2], m[3]
		return true, "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return task, contextID, state, out
}

// chatConfirm holds the confirm sample's two-turn conversation through the conversation service:
// input-required, then "go ahead" in the same task, then completed.
func (b *bus) chatConfirm(ctx context.Context, t *testing.T) {
	task, contextID, state, out := b.send(ctx, t, 2*time.Minute, "acme/demo/confirm", "rename the staging bucket")
	t.Logf("turn 1:\n%s", out)
	if state != "input-required" {
		t.Fatalf("turn 1: want input-required, got %s", state)
	}
	task2, context2, state, out := b.send(ctx, t, time.Minute, "acme/demo/confirm", "go ahead", "--approve", "--task-id", task, "--context-id", contextID)
	t.Logf("turn 2:\n%s", out)
	if task2 != task || context2 != contextID || state != "completed" {
		t.Fatalf("turn 2: want task %s (context %s) completed, got %s (%s) %s", task, contextID, task2, context2, state)
	}
	if !strings.Contains(out, "rename the staging bucket") {
		t.Fatalf("turn 2 does not act on the plan of turn 1: %q", out)
	}
}

// chatMemory checks that the governed memory agent's pod reads a context's earlier turns from the
// conversation service: turn 2 recalls turn 1.
func (b *bus) chatMemory(ctx context.Context, t *testing.T) {
	word := fmt.Sprintf("pelican-%d", time.Now().UnixNano()%100000)
	_, contextID, state, out := b.send(ctx, t, time.Minute, "acme/demo/memory-agent", "remember the word "+word)
	if state != "completed" {
		t.Fatalf("turn 1: want completed, got %s\n%s", state, out)
	}
	_, _, state, out = b.send(ctx, t, time.Minute, "acme/demo/memory-agent", "what did I ask you to remember?", "--context-id", contextID)
	t.Logf("turn 2:\n%s", out)
	if state != "completed" || !strings.Contains(out, word) {
		t.Fatalf("turn 2 does not recall %q from turn 1 (state %s):\n%s", word, state, out)
	}
}

// rotate rolls an Agent's credentials and checks that its pod is replaced by one that connects
// with the new password, and that the agent answers again.
func (b *bus) rotate(ctx context.Context, t *testing.T, name string) {
	before, err := env.Pods(ctx, samplesNamespace, "a2a.fleet.dev/agent="+name)
	if err != nil || len(before) != 1 {
		t.Fatalf("want 1 pod of %s before the rotation, got %d (%v)", name, len(before), err)
	}
	secret := &corev1.Secret{}
	key := client.ObjectKey{Namespace: samplesNamespace, Name: name + "-mqtt-credentials"}
	if err := env.Client.Get(ctx, key, secret); err != nil {
		t.Fatal(err)
	}
	oldPassword := string(secret.Data["password"])
	agent := &a2av1.Agent{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: samplesNamespace, Name: name}, agent); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(agent.DeepCopy())
	if agent.Annotations == nil {
		agent.Annotations = map[string]string{}
	}
	agent.Annotations["a2a.fleet.dev/rotate-credentials"] = time.Now().UTC().Format(time.RFC3339Nano)
	start := time.Now()
	if err := env.Client.Patch(ctx, agent, patch); err != nil {
		t.Fatal(err)
	}
	err = Poll(ctx, 3*time.Minute, "a new pod of "+name+" ready with the new password", func(ctx context.Context) (bool, string, error) {
		if err := env.Client.Get(ctx, key, secret); err != nil {
			return false, "", err
		}
		if string(secret.Data["password"]) == oldPassword {
			return false, "password not rotated yet", nil
		}
		pods, err := env.Pods(ctx, samplesNamespace, "a2a.fleet.dev/agent="+name)
		if err != nil {
			return false, "", err
		}
		if len(pods) != 1 || pods[0].UID == before[0].UID {
			return false, fmt.Sprintf("%d ready pods, the old one among them: %v", len(pods), len(pods) > 0 && pods[0].UID == before[0].UID), nil
		}
		return true, "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: new password and a new ready pod %.1fs after the rotation", name, time.Since(start).Seconds())
	if _, err := env.WaitAgents(ctx, samplesNamespace, 2*time.Minute, true, name); err != nil {
		t.Fatal(err)
	}
	connectedSince(ctx, t, name, start)
	_, _, state, out := b.send(ctx, t, time.Minute, "acme/demo/"+name, "after the rotation")
	if state != "completed" || !strings.Contains(out, "after the rotation") {
		t.Fatalf("%s does not answer after the rotation (%s):\n%s", name, state, out)
	}
	// The old password opens nothing any more.
	addr := strings.TrimPrefix(b.broker, "mqtt://")
	if _, err := brokertest.Dial(t, addr, brokertest.Options{ClientID: "acme/demo/" + name, Username: string(secret.Data["username"]), Password: oldPassword}); err == nil {
		t.Fatalf("the broker still accepts %s's old password", name)
	} else if re := (*brokertest.RefusedError)(nil); !errors.As(err, &re) {
		t.Fatalf("connect with the old password: want a refusal, got %v", err)
	}
}

// newServicePassword deletes the conversation service's credentials Secret: the operator writes a
// new password to a new Secret and to the broker, which disconnects the service; the service reads
// the mounted Secret at every CONNECT, so the same pods take the new password once the kubelet has
// updated the volume, and governed conversations go on without a restart.
func (b *bus) newServicePassword(ctx context.Context, t *testing.T) {
	const selector = "app.kubernetes.io/name=conversation-service"
	before, err := env.Pods(ctx, Namespace, selector)
	if err != nil || len(before) == 0 {
		t.Fatalf("no ready service pods: %v", err)
	}
	restarts, err := env.Restarts(ctx, Namespace, selector)
	if err != nil {
		t.Fatal(err)
	}
	key := client.ObjectKey{Namespace: Namespace, Name: "a2a-fleet-conversation-service-credentials"}
	secret := &corev1.Secret{}
	if err := env.Client.Get(ctx, key, secret); err != nil {
		t.Fatal(err)
	}
	oldPassword, oldUID := string(secret.Data["password"]), secret.UID
	start := time.Now()
	if err := env.Client.Delete(ctx, secret); err != nil {
		t.Fatal(err)
	}
	err = Poll(ctx, 2*time.Minute, "a new service Secret with a new password", func(ctx context.Context) (bool, string, error) {
		if err := env.Client.Get(ctx, key, secret); err != nil {
			return false, err.Error(), client.IgnoreNotFound(err)
		}
		if secret.UID == oldUID || string(secret.Data["password"]) == oldPassword {
			return false, "the old Secret or password", nil
		}
		return true, "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("new Secret with a new password %.1fs after the delete", time.Since(start).Seconds())
	// The old password soon opens nothing: the operator writes the new Secret first, then gives the
	// broker the new password.
	addr := strings.TrimPrefix(b.broker, "mqtt://")
	err = Poll(ctx, 30*time.Second, "the broker refuses the service's old password", func(ctx context.Context) (bool, string, error) {
		c, err := brokertest.Dial(t, addr, brokertest.Options{ClientID: "password-check", Username: string(secret.Data["username"]), Password: oldPassword})
		if err == nil {
			c.Close()
			return false, "still accepted", nil
		}
		if re := (*brokertest.RefusedError)(nil); !errors.As(err, &re) {
			return false, "", fmt.Errorf("connect with the old password: want a refusal, got %w", err)
		}
		return true, "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A governed agent answers through the service again (confirm's first turn is decided by it).
	_, _, state, out := b.send(ctx, t, 3*time.Minute, "acme/demo/confirm", "rename the staging bucket")
	if state != "input-required" {
		t.Fatalf("after the new password: want input-required from confirm, got %s\n%s", state, out)
	}
	t.Logf("a governed request answered %.1fs after the delete", time.Since(start).Seconds())
	after, err := env.Pods(ctx, Namespace, selector)
	if err != nil {
		t.Fatal(err)
	}
	uids := map[types.UID]bool{}
	for _, p := range before {
		uids[p.UID] = true
	}
	for _, p := range after {
		if !uids[p.UID] {
			t.Errorf("service pod %s is new: the service was replaced, not given the password", p.Name)
		}
	}
	now, err := env.Restarts(ctx, Namespace, selector)
	if err != nil {
		t.Fatal(err)
	}
	for c, n := range now {
		if n != restarts[c] {
			t.Errorf("%s restarted (%d → %d) to take the new password", c, restarts[c], n)
		}
	}
}

// deleteAgent deletes an Agent and checks that its Secret, its Deployment and pod, its broker
// identity and its retained card are gone.
func (b *bus) deleteAgent(ctx context.Context, t *testing.T, name string) {
	secret := &corev1.Secret{}
	key := client.ObjectKey{Namespace: samplesNamespace, Name: name + "-mqtt-credentials"}
	if err := env.Client.Get(ctx, key, secret); err != nil {
		t.Fatal(err)
	}
	agent := &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Namespace: samplesNamespace, Name: name}}
	start := time.Now()
	if err := env.Client.Delete(ctx, agent); err != nil {
		t.Fatal(err)
	}
	err := Poll(ctx, 2*time.Minute, "Agent "+name+", its Secret, Deployment and pods gone", func(ctx context.Context) (bool, string, error) {
		var left []string
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(agent), agent); !apierrors.IsNotFound(err) {
			left = append(left, "Agent")
		}
		if err := env.Client.Get(ctx, key, &corev1.Secret{}); !apierrors.IsNotFound(err) {
			left = append(left, "Secret")
		}
		deploys, err := env.Clientset.AppsV1().Deployments(samplesNamespace).List(ctx, metav1.ListOptions{LabelSelector: "a2a.fleet.dev/agent=" + name})
		if err != nil {
			return false, "", err
		}
		if len(deploys.Items) > 0 {
			left = append(left, "Deployment")
		}
		pods, err := env.Clientset.CoreV1().Pods(samplesNamespace).List(ctx, metav1.ListOptions{LabelSelector: "a2a.fleet.dev/agent=" + name})
		if err != nil {
			return false, "", err
		}
		if len(pods.Items) > 0 {
			left = append(left, fmt.Sprintf("%d pods", len(pods.Items)))
		}
		return len(left) == 0, "left: " + strings.Join(left, ", "), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: Agent, Secret, Deployment and pod gone %.1fs after the delete", name, time.Since(start).Seconds())
	addr := strings.TrimPrefix(b.broker, "mqtt://")
	if _, err := brokertest.Dial(t, addr, brokertest.Options{ClientID: "acme/demo/" + name,
		Username: string(secret.Data["username"]), Password: string(secret.Data["password"])}); err == nil {
		t.Fatalf("the broker still accepts the deleted Agent's identity")
	} else if re := (*brokertest.RefusedError)(nil); !errors.As(err, &re) {
		t.Fatalf("connect as the deleted Agent: want a refusal, got %v", err)
	}
	// Its retained card is gone; the confirm agent's card is the control that cards are readable.
	username, _ := os.ReadFile(filepath.Join(b.console, "username"))
	password, _ := os.ReadFile(filepath.Join(b.console, "password"))
	c, err := brokertest.Dial(t, addr, brokertest.Options{ClientID: "acme/demo/console", Username: string(username), Password: string(password)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if rc := c.Subscribe("$a2a/v1/discovery/acme/demo/confirm"); rc > 2 {
		t.Fatalf("subscribe to confirm's card: reason 0x%02x", rc)
	}
	if m, err := c.Next(10 * time.Second); err != nil || !m.Retain {
		t.Fatalf("no retained card of confirm (control): %v", err)
	}
	if rc := c.Subscribe("$a2a/v1/discovery/acme/demo/" + name); rc > 2 {
		t.Fatalf("subscribe to %s's card: reason 0x%02x", name, rc)
	}
	c.ExpectNothing(3 * time.Second)
}

// killAndRecover kills the operator's pods and the broker's pod at once and checks that
// everything is Ready again and a conversation through the service works.
func (b *bus) killAndRecover(ctx context.Context, t *testing.T) {
	var victims []corev1.Pod
	for _, selector := range []string{"app.kubernetes.io/component=operator", "app.kubernetes.io/name=mosquitto"} {
		pods, err := env.Pods(ctx, Namespace, selector)
		if err != nil || len(pods) == 0 {
			t.Fatalf("no ready pods for %s: %v", selector, err)
		}
		victims = append(victims, pods...)
	}
	start := time.Now()
	for i := range victims {
		if err := env.Kill(ctx, &victims[i]); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("killed %d pods", len(victims))
	// The Deployments' status lags the kill: first see every victim gone and replaced.
	err := Poll(ctx, 4*time.Minute, "the killed pods replaced", func(ctx context.Context) (bool, string, error) {
		for _, v := range victims {
			p, err := env.Clientset.CoreV1().Pods(v.Namespace).Get(ctx, v.Name, metav1.GetOptions{})
			if err == nil && p.UID == v.UID {
				return false, v.Name + " still there", nil
			}
			if err != nil && !apierrors.IsNotFound(err) {
				return false, "", err
			}
		}
		for _, selector := range []string{"app.kubernetes.io/component=operator", "app.kubernetes.io/name=mosquitto"} {
			pods, err := env.Pods(ctx, Namespace, selector)
			if err != nil {
				return false, "", err
			}
			if len(pods) == 0 {
				return false, "no ready pod for " + selector, nil
			}
		}
		return true, "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.WaitDeployments(ctx, Namespace, 4*time.Minute, "a2a-fleet-controller-manager", "a2a-fleet-mosquitto", "a2a-fleet-conversation-service"); err != nil {
		t.Fatal(err)
	}
	names := append([]string{"console"}, "confirm", "memory")
	if _, err := env.WaitAgents(ctx, samplesNamespace, 3*time.Minute, false, names...); err != nil {
		t.Fatal(err)
	}
	if _, err := env.WaitAgents(ctx, samplesNamespace, 3*time.Minute, true, "confirm", "memory"); err != nil {
		t.Fatal(err)
	}
	t.Logf("Deployments available and Agents Ready and connected %.1fs after the kill", time.Since(start).Seconds())
	b.chatConfirm(ctx, t)
}

// uninstall removes what an earlier run installed (the samples, a Helm release, the quickstart,
// the CRDs), so that each install starts from a cluster without a2a-fleet.
func uninstall(ctx context.Context, t *testing.T) {
	t.Helper()
	if err := env.Uninstall(ctx, t.Logf); err != nil {
		t.Fatal(err)
	}
}
