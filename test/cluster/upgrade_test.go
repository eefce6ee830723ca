package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/cardsig"
)

// PreviousReleaseEnv names the folder hack/previous-release.sh built the previous release into
// (its dist/ and config/); make test sets it after make previous-release and
// kind-load-previous-release.
const PreviousReleaseEnv = "A2A_FLEET_PREVIOUS_RELEASE"

// previousRelease is the release the working tree upgrades from, as its user has it: its bundle
// (packaged chart, images tagged with its version, loaded into the cluster) and its kustomize tree.
type previousRelease struct {
	version string
	// env installs it: Root is its tree (config/), Images its images, Chart its packaged chart.
	env *Env
}

// loadPreviousRelease reads what hack/previous-release.sh built. It fails, never skips, when the
// bundle is missing: make test builds it before the tests.
func loadPreviousRelease(t *testing.T) *previousRelease {
	t.Helper()
	dir := os.Getenv(PreviousReleaseEnv)
	if dir == "" {
		t.Fatalf("%s is not set: run `make previous-release kind-load-previous-release` and set it to `hack/previous-release.sh --print` (make test does both)", PreviousReleaseEnv)
	}
	pinned, err := os.ReadFile(filepath.Join(env.Root, "hack", "previous-release"))
	if err != nil {
		t.Fatal(err)
	}
	version := ""
	for _, line := range strings.Split(string(pinned), "\n") {
		if v, ok := strings.CutPrefix(line, "version="); ok {
			version = strings.TrimSpace(v)
		}
	}
	current, err := os.ReadFile(filepath.Join(env.Root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	if version == "" || version == strings.TrimSpace(string(current)) {
		t.Fatalf("hack/previous-release names version %q, the working tree is %q: an upgrade needs two versions", version, strings.TrimSpace(string(current)))
	}
	old := *env
	old.Root = dir
	old.Chart = filepath.Join(dir, "dist", "a2a-fleet-"+version+".tgz")
	old.Images = map[string]string{}
	for _, name := range imageVars {
		old.Images[name] = name + ":" + version
	}
	for _, path := range []string{old.Chart, filepath.Join(dir, "config", "quickstart", "kustomization.yaml")} {
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("the previous release in %s: %v (make previous-release)", dir, err)
		}
	}
	return &previousRelease{version: version, env: &old}
}

// upgradeWay is one of the two install ways: how to install the previous release, upgrade it to
// the working tree, and uninstall it as docs/install.md says.
type upgradeWay struct {
	name      string
	install   func(ctx context.Context, t *testing.T, prev *previousRelease)
	upgrade   func(ctx context.Context, t *testing.T)
	uninstall func(ctx context.Context, t *testing.T)
	// kept is what the way's uninstall leaves on purpose (docs/install.md "Uninstall").
	kept func(o leftover) bool
}

var helmWay = upgradeWay{
	name: "helm",
	install: func(ctx context.Context, t *testing.T, prev *previousRelease) {
		args := append([]string{"install", "a2a-fleet", prev.env.Chart, "--namespace", Namespace, "--create-namespace"}, prev.env.HelmImageArgs()...)
		if _, err := env.Command(ctx, env.Helm, args...); err != nil {
			t.Fatal(err)
		}
	},
	upgrade: func(ctx context.Context, t *testing.T) {
		// The chart's defaults, not the previous install's --set values: the working tree's
		// images. --reset-values says so: with no --set or -f of its own, `helm upgrade` reuses
		// the last release's values, and the previous images' tags with them (with the working
		// tree's images at their default names, HelmImageArgs sets nothing).
		args := append([]string{"upgrade", "a2a-fleet", env.Chart, "--namespace", Namespace, "--reset-values"}, env.HelmImageArgs()...)
		if _, err := env.Command(ctx, env.Helm, args...); err != nil {
			t.Fatal(err)
		}
	},
	uninstall: func(ctx context.Context, t *testing.T) {
		if _, err := env.Command(ctx, env.Helm, "uninstall", "a2a-fleet", "--namespace", Namespace, "--wait"); err != nil {
			t.Fatal(err)
		}
	},
	// Helm keeps the CRDs and the two claims (helm.sh/resource-policy: keep), and the namespace
	// it created (--create-namespace) with what the operator wrote there at run time.
	kept: func(o leftover) bool {
		switch {
		case o.kind == "CustomResourceDefinition" && strings.HasSuffix(o.name, "."+a2av1.GroupVersion.Group):
			return true
		case o.kind == "PersistentVolumeClaim" && o.namespace == Namespace:
			return o.name == "a2a-fleet-mosquitto-data" || o.name == "a2a-fleet-conversation-service-state"
		case o.kind == "PersistentVolume":
			return true // bound to a kept claim (checked by uninstallLeavesNothing)
		case o.kind == "Namespace" && o.name == Namespace:
			return true
		case o.namespace == Namespace:
			return runtimeObjects[o.kind+"/"+o.name]
		}
		return false
	},
}

// runtimeObjects are what the operator and the service create in the install's namespace as they
// run (no install manifest names them), which helm uninstall cannot know about, and what
// Kubernetes puts in every namespace: deleting the namespace removes them (docs/install.md).
var runtimeObjects = map[string]bool{
	"ServiceAccount/default":                            true,
	"ConfigMap/kube-root-ca.crt":                        true,
	"Secret/a2a-fleet-card-signing":                     true,
	"Secret/a2a-fleet-gateway-card-signing":             true,
	"Secret/a2a-fleet-mosquitto-admin":                  true,
	"Secret/a2a-fleet-conversation-service-credentials": true,
	"Lease/a2a-fleet-operator.a2a.fleet.dev":            true,
}

var kustomizeWay = upgradeWay{
	name: "kustomize",
	install: func(ctx context.Context, t *testing.T, prev *previousRelease) {
		quickstart, err := prev.env.Kustomization(t.TempDir(), "config/quickstart")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.KubectlRun(ctx, "apply", "--server-side", "-k", quickstart); err != nil {
			t.Fatal(err)
		}
	},
	upgrade: func(ctx context.Context, t *testing.T) {
		quickstart, err := env.Kustomization(t.TempDir(), "config/quickstart")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.KubectlRun(ctx, "apply", "--server-side", "-k", quickstart); err != nil {
			t.Fatal(err)
		}
	},
	uninstall: func(ctx context.Context, t *testing.T) {
		quickstart, err := env.Kustomization(t.TempDir(), "config/quickstart")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := env.KubectlRun(ctx, "delete", "-k", quickstart, "--wait=true", "--timeout=4m"); err != nil {
			t.Fatal(err)
		}
	},
	kept: func(leftover) bool { return false },
}

// The previous release (its packaged chart, its kustomize tree and its images) installed with
// agents talking, upgraded to the working tree in place, then uninstalled: once with Helm, once
// with kubectl apply -k.
func TestUpgradeFromThePreviousRelease(t *testing.T) {
	ctx := context.Background()
	prev := loadPreviousRelease(t)
	for _, way := range []upgradeWay{helmWay, kustomizeWay} {
		t.Run(way.name, func(t *testing.T) {
			t.Cleanup(func() {
				if t.Failed() {
					env.Dump(t, Namespace, samplesNamespace)
				}
			})
			upgradeAcross(ctx, t, prev, way)
		})
	}
}

// watchAgent is an Agent with no workload of its own that the test connects as with plain paho,
// to count the broker's disconnects through the upgrade.
const watchAgent = "upgrade-watch"

func upgradeAcross(ctx context.Context, t *testing.T, prev *previousRelease, way upgradeWay) {
	uninstall(ctx, t)
	start := time.Now()
	way.install(ctx, t, prev)
	if err := env.WaitDeployments(ctx, Namespace, 5*time.Minute, operatorDeployment, "a2a-fleet-conversation-service", "a2a-fleet-mosquitto"); err != nil {
		t.Fatal(err)
	}
	runningVersion(ctx, t, prev.version)
	t.Logf("%s: %s installed and available in %.1fs", way.name, prev.version, time.Since(start).Seconds())

	b := samplesOf(ctx, t, prev)
	watch := b.watchDisconnects(ctx, t)
	before := b.snapshot(ctx, t)
	brokerBefore := brokerPod(ctx, t)

	upgradeStart := time.Now()
	start = upgradeStart
	way.upgrade(ctx, t)
	current, err := os.ReadFile(filepath.Join(env.Root, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(current))
	if err := Poll(ctx, 5*time.Minute, "every pod of the install on the working tree's images", func(ctx context.Context) (bool, string, error) {
		return installRunsImages(ctx)
	}); err != nil {
		t.Fatal(err)
	}
	if err := env.WaitDeployments(ctx, Namespace, 5*time.Minute, operatorDeployment, "a2a-fleet-conversation-service", "a2a-fleet-mosquitto"); err != nil {
		t.Fatal(err)
	}
	runningVersion(ctx, t, version)
	if _, err := env.WaitAgents(ctx, samplesNamespace, 3*time.Minute, true, sampleAgents...); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: upgraded from %s to %s, every Agent Ready and connected %.1fs after the upgrade", way.name, prev.version, version, time.Since(start).Seconds())

	t.Run("conversations, credentials and cards survive", func(t *testing.T) {
		after := b.snapshotOf(ctx, t, before)
		before.compare(t, after)
		b.resume(ctx, t, before)
	})
	t.Run("no agent kicked more than once", func(t *testing.T) {
		kicks := watch.stop()
		if len(kicks) > 1 {
			t.Errorf("%s was disconnected %d times by the upgrade: %v", watchAgent, len(kicks), kicks)
		}
		agentKicks(ctx, t, before, brokerBefore, upgradeStart)
		t.Logf("%s (plain paho): %d disconnects through the upgrade %v", watchAgent, len(kicks), kicks)
	})
	t.Run("uninstall leaves nothing behind", func(t *testing.T) { uninstallLeavesNothing(ctx, t, prev, way) })
}

// runningVersion checks the version the operator's and the service's binaries report (--version,
// run in their running containers).
func runningVersion(ctx context.Context, t *testing.T, want string) {
	t.Helper()
	for _, part := range []struct{ selector, container, binary string }{
		{operatorPods, "manager", "/manager"},
		{"app.kubernetes.io/name=conversation-service", "", "/conversation-service"},
	} {
		pods, err := env.Pods(ctx, Namespace, part.selector)
		if err != nil || len(pods) == 0 {
			t.Fatalf("no ready pods for %s: %v", part.selector, err)
		}
		container := cmpOr(part.container, pods[0].Spec.Containers[0].Name)
		out, err := env.Exec(ctx, Namespace, pods[0].Name, container, part.binary, "--version")
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(out); len(f) < 2 || f[1] != want {
			t.Fatalf("%s in %s reports %q, want version %s", part.binary, pods[0].Name, strings.TrimSpace(out), want)
		}
	}
}

// installRunsImages reports whether every pod of the install's namespace runs the working tree's
// images (and no old pod is left).
func installRunsImages(ctx context.Context) (bool, string, error) {
	pods, err := env.Clientset.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, "", err
	}
	for _, p := range pods.Items {
		for _, c := range p.Spec.Containers {
			name, _, _ := strings.Cut(c.Image, ":")
			if _, ours := imageVars[envVarOf(name)]; ours && c.Image != env.Image(name) {
				return false, fmt.Sprintf("pod %s runs %s", p.Name, c.Image), nil
			}
		}
	}
	return true, "", nil
}

// envVarOf is the variable of imageVars that names image (the manifests' name), or "".
func envVarOf(image string) string {
	for v, name := range imageVars {
		if name == image {
			return v
		}
	}
	return ""
}

// samplesOf applies the previous release's samples (its example agents' image), an Agent to
// watch the broker with, and returns the host's way onto the bus.
func samplesOf(ctx context.Context, t *testing.T, prev *previousRelease) *bus {
	t.Helper()
	samples, err := prev.env.Kustomization(t.TempDir(), "config/samples-workloads")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.KubectlRun(ctx, "apply", "--server-side", "-n", samplesNamespace, "-k", samples); err != nil {
		t.Fatal(err)
	}
	watcher := &a2av1.Agent{ObjectMeta: metav1.ObjectMeta{Name: watchAgent, Namespace: samplesNamespace}}
	watcher.Spec.OrgID, watcher.Spec.UnitID = "acme", "demo"
	watcher.Spec.Card.Name = "Upgrade watch"
	watcher.Spec.Card.Description = "Counts the broker's disconnects through an upgrade."
	watcher.Spec.Callers.Scope = a2av1.CallerScopeNone
	if err := env.Client.Create(ctx, watcher); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := env.WaitAgents(ctx, samplesNamespace, 4*time.Minute, true, sampleAgents...); err != nil {
		t.Fatal(err)
	}
	if _, err := env.WaitAgents(ctx, samplesNamespace, time.Minute, false, "console", watchAgent); err != nil {
		t.Fatal(err)
	}
	return consoleBus(ctx, t)
}

// disconnectWatch is a plain paho client connected as the watch Agent that reconnects at once
// after every disconnect and records how each one came.
type disconnectWatch struct {
	mu     sync.Mutex
	kicks  []string
	cancel context.CancelFunc
	done   chan struct{}
}

func (b *bus) watchDisconnects(ctx context.Context, t *testing.T) *disconnectWatch {
	t.Helper()
	secret := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: samplesNamespace, Name: watchAgent + "-mqtt-credentials"}, secret); err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(b.broker, "mqtt://")
	opts := brokertest.Options{ClientID: "acme/demo/" + watchAgent, Username: string(secret.Data["username"]),
		Password: string(secret.Data["password"]), IgnoreMessages: true}
	inbox := "$a2a/v1/request/acme/demo/" + watchAgent
	first, err := brokertest.Dial(t, addr, opts)
	if err != nil {
		t.Fatalf("connect as %s: %v", watchAgent, err)
	}
	if rc := first.Subscribe(inbox); rc >= 0x80 {
		t.Fatalf("%s subscribes to its own inbox: reason 0x%02x", watchAgent, rc)
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &disconnectWatch{cancel: cancel, done: make(chan struct{})}
	t.Cleanup(func() { w.stop() })
	go func() {
		defer close(w.done)
		c := first
		for {
			select {
			case <-ctx.Done():
				c.Close()
				return
			case <-c.Done():
			}
			w.mu.Lock()
			w.kicks = append(w.kicks, strings.Join(c.Kicks(), ""))
			w.mu.Unlock()
			for c = nil; c == nil; {
				select {
				case <-ctx.Done():
					return
				case <-time.After(200 * time.Millisecond):
				}
				c, _ = brokertest.Dial(t, addr, opts)
			}
		}
	}()
	return w
}

// stop ends the watch and returns the disconnects it saw.
func (w *disconnectWatch) stop() []string {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.kicks)
}

// installState is what an upgrade must keep: the conversations the service holds, the Agents'
// credentials, the retained cards, and the sample agents' pods.
type installState struct {
	memoryContext, memoryWord string
	waitingTask, waitingCtx   string
	conversations             map[string]map[string]storedConversation // by agent, context
	tasks                     map[string]map[string][]a2a.TaskID       // by agent, context
	passwords                 map[string]string                        // Secret name -> password
	secretUIDs                map[string]types.UID
	cards                     map[string]string // topic -> retained payload
	pods                      map[string]types.UID
	restarts                  map[string]int32
}

const upgradeMemory, upgradeConfirm = "acme/demo/memory-agent", "acme/demo/confirm"

// snapshot holds conversations the first time (a memory context of two turns, a confirm task left
// waiting for input) and reads back everything the upgrade must keep.
func (b *bus) snapshot(ctx context.Context, t *testing.T) *installState {
	t.Helper()
	return b.snapshotOf(ctx, t, nil)
}

func (b *bus) snapshotOf(ctx context.Context, t *testing.T, held *installState) *installState {
	t.Helper()
	s := held
	if s == nil {
		s = &installState{}
		s.memoryWord = fmt.Sprintf("osprey-%d", time.Now().UnixNano()%100000)
		task1, contextID, state, out := b.send(ctx, t, 2*time.Minute, upgradeMemory, "remember the word "+s.memoryWord)
		if state != "completed" {
			t.Fatalf("memory turn 1: want completed, got %s\n%s", state, out)
		}
		task2, _, state, out := b.send(ctx, t, time.Minute, upgradeMemory, "what did I ask you to remember?", "--context-id", contextID)
		if state != "completed" || !strings.Contains(out, s.memoryWord) {
			t.Fatalf("memory turn 2 does not recall %q (state %s):\n%s", s.memoryWord, state, out)
		}
		s.memoryContext = contextID
		waiting, waitingCtx, state, out := b.send(ctx, t, time.Minute, upgradeConfirm, "rename the upgrade bucket")
		if state != "input-required" {
			t.Fatalf("confirm turn 1: want input-required, got %s\n%s", state, out)
		}
		s.waitingTask, s.waitingCtx = waiting, waitingCtx
		s.tasks = map[string]map[string][]a2a.TaskID{
			upgradeMemory:  {contextID: {a2a.TaskID(task1), a2a.TaskID(task2)}},
			upgradeConfirm: {waitingCtx: {a2a.TaskID(waiting)}},
		}
	}
	got := &installState{memoryContext: s.memoryContext, memoryWord: s.memoryWord, waitingTask: s.waitingTask,
		waitingCtx: s.waitingCtx, tasks: s.tasks, conversations: map[string]map[string]storedConversation{},
		passwords: map[string]string{}, secretUIDs: map[string]types.UID{}, cards: map[string]string{},
		pods: map[string]types.UID{}, restarts: map[string]int32{}}
	for agent, tasks := range s.tasks {
		got.conversations[agent] = b.readConversations(ctx, t, agent, tasks)
	}
	for _, name := range append([]string{"console", watchAgent}, sampleAgents...) {
		secret := &corev1.Secret{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: samplesNamespace, Name: name + "-mqtt-credentials"}, secret); err != nil {
			t.Fatal(err)
		}
		got.passwords[secret.Name], got.secretUIDs[secret.Name] = string(secret.Data["password"]), secret.UID
	}
	got.cards = b.retainedCards(t)
	for _, name := range sampleAgents {
		pods, err := env.Clientset.CoreV1().Pods(samplesNamespace).List(ctx, metav1.ListOptions{LabelSelector: "a2a.fleet.dev/agent=" + name})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			got.pods[p.Name] = p.UID
			for _, cs := range p.Status.ContainerStatuses {
				got.restarts[p.Name+"/"+cs.Name] = cs.RestartCount
			}
		}
	}
	if held == nil {
		t.Logf("held: memory context %s (2 tasks), confirm task %s waiting for input; %d Secrets, %d retained cards, %d workload pods",
			s.memoryContext, s.waitingTask, len(got.passwords), len(got.cards), len(got.pods))
	}
	return got
}

// retainedCards reads, as the console, the retained card of every sample agent and the card key
// set: what a client finds on the broker.
func (b *bus) retainedCards(t *testing.T) map[string]string {
	t.Helper()
	c, err := b.connectConsole(t, "")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cards := map[string]string{}
	topics := []string{a2amqtt.CardKeysTopic}
	for _, ref := range []string{"echo", "confirm", "memory-agent"} {
		topics = append(topics, "$a2a/v1/discovery/acme/demo/"+ref)
	}
	for _, topic := range topics {
		if rc := c.Subscribe(topic); rc > 2 {
			t.Fatalf("subscribe %s: reason 0x%02x", topic, rc)
		}
		m, err := c.Next(10 * time.Second)
		if err != nil || !m.Retain || m.Topic != topic {
			t.Fatalf("no retained message on %s: %v", topic, err)
		}
		cards[topic] = string(m.Payload)
	}
	return cards
}

// compare checks that after holds what s held: every task as GetTask and ListTasks answered, the
// same Secrets with the same passwords, the same card key set and cards.
func (s *installState) compare(t *testing.T, after *installState) {
	t.Helper()
	n := 0
	for agent, contexts := range s.conversations {
		for contextID, tasks := range contexts {
			for id, want := range tasks {
				n++
				if got := after.conversations[agent][contextID][id]; got != want {
					t.Errorf("%s task %s (context %s) after the upgrade: %s, before: %s", agent, id, contextID, got, want)
				}
			}
		}
	}
	for name, password := range s.passwords {
		if after.secretUIDs[name] != s.secretUIDs[name] {
			t.Errorf("Secret %s was replaced by the upgrade", name)
		}
		if after.passwords[name] != password {
			t.Errorf("Secret %s has a new password after the upgrade (a rotation)", name)
		}
	}
	// The card key set is the same byte for byte (same key); each card has the same content and
	// the same protected header (key ID, jku) and verifies with that key set after the upgrade.
	// Its signature value may differ: ES256 signs with a random nonce, and the new operator signs
	// the cards again.
	if after.cards[a2amqtt.CardKeysTopic] != s.cards[a2amqtt.CardKeysTopic] {
		t.Errorf("the card key set changed through the upgrade:\nbefore %s\nafter  %s", s.cards[a2amqtt.CardKeysTopic], after.cards[a2amqtt.CardKeysTopic])
	}
	jwks, err := cardsig.ParseKeySet([]byte(after.cards[a2amqtt.CardKeysTopic]))
	if err != nil {
		t.Fatalf("the card key set after the upgrade: %v", err)
	}
	resigned := 0
	for topic, card := range s.cards {
		if topic == a2amqtt.CardKeysTopic {
			continue
		}
		if got, want := cardContent(t, after.cards[topic]), cardContent(t, card); got != want {
			t.Errorf("the card on %s changed through the upgrade:\nbefore %s\nafter  %s", topic, want, got)
		}
		if _, err := cardsig.Verify([]byte(after.cards[topic]), jwks); err != nil {
			t.Errorf("the card on %s does not verify after the upgrade: %v", topic, err)
		}
		if after.cards[topic] != card {
			resigned++
		}
	}
	if !t.Failed() {
		t.Logf("after the upgrade: %d tasks answered as before (GetTask, ListTasks, history), %d Secrets with the same password, the card key set byte for byte, %d retained cards with the same content verified with it (%d signed again)",
			n, len(s.passwords), len(s.cards)-1, resigned)
	}
}

// cardContent is a card as JSON without its signatures' signature values.
func cardContent(t *testing.T, payload string) string {
	t.Helper()
	var card map[string]any
	if err := json.Unmarshal([]byte(payload), &card); err != nil {
		t.Fatalf("card %s: %v", payload, err)
	}
	signatures, _ := card["signatures"].([]any)
	for _, sig := range signatures {
		if m, ok := sig.(map[string]any); ok {
			delete(m, "signature")
		}
	}
	out, err := json.Marshal(card)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// resume goes on with the held conversations on the upgraded install: the memory agent recalls
// the word of the context's first turn, and the waiting task completes.
func (b *bus) resume(ctx context.Context, t *testing.T, s *installState) {
	t.Helper()
	_, _, state, out := b.send(ctx, t, time.Minute, upgradeMemory, "what did I ask you to remember?", "--context-id", s.memoryContext)
	if state != "completed" || !strings.Contains(out, s.memoryWord) {
		t.Fatalf("after the upgrade the memory agent does not recall %q from context %s (state %s):\n%s", s.memoryWord, s.memoryContext, state, out)
	}
	task, contextID, state, out := b.send(ctx, t, time.Minute, upgradeConfirm, "go ahead", "--approve", "--task-id", s.waitingTask, "--context-id", s.waitingCtx)
	if task != s.waitingTask || contextID != s.waitingCtx || state != "completed" || !strings.Contains(out, "rename the upgrade bucket") {
		t.Fatalf("after the upgrade the waiting task %s does not resume: %s (%s) %s:\n%s", s.waitingTask, task, contextID, state, out)
	}
	t.Logf("after the upgrade: the memory agent recalls the old context's word, the waiting task completes")
}

// brokerPod is the running broker pod.
func brokerPod(ctx context.Context, t *testing.T) corev1.Pod {
	t.Helper()
	pods, err := env.Pods(ctx, Namespace, "app.kubernetes.io/name=mosquitto")
	if err != nil || len(pods) != 1 {
		t.Fatalf("want 1 ready broker pod, got %d (%v)", len(pods), err)
	}
	return pods[0]
}

var connectedAs = regexp.MustCompile(`New client connected from \S+ as (\S+)`)

// agentKicks checks that the sample agents' pods were neither replaced nor restarted by the
// upgrade, and counts, in the log of the broker the install runs now since the upgrade began, how
// often each sample agent connected to it: once when the broker pod was replaced (each agent
// reconnects to the new one), none when it was not.
func agentKicks(ctx context.Context, t *testing.T, before *installState, brokerBefore corev1.Pod, since time.Time) {
	t.Helper()
	for _, name := range sampleAgents {
		pods, err := env.Clientset.CoreV1().Pods(samplesNamespace).List(ctx, metav1.ListOptions{LabelSelector: "a2a.fleet.dev/agent=" + name})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if before.pods[p.Name] != p.UID {
				t.Errorf("Agent %s's pod %s is new: the upgrade replaced the workload", name, p.Name)
			}
			for _, cs := range p.Status.ContainerStatuses {
				if n := cs.RestartCount - before.restarts[p.Name+"/"+cs.Name]; n != 0 {
					t.Errorf("Agent %s's container %s/%s restarted %d times in the upgrade", name, p.Name, cs.Name, n)
				}
			}
		}
	}
	broker := brokerPod(ctx, t)
	out, err := env.KubectlRun(ctx, "logs", "-n", Namespace, broker.Name, "-c", "mosquitto", "--since-time", since.UTC().Format(time.RFC3339))
	if err != nil {
		t.Fatal(err)
	}
	connects := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if m := connectedAs.FindStringSubmatch(sc.Text()); m != nil {
			connects[m[1]]++
		}
	}
	allowed := 0
	if broker.UID != brokerBefore.UID {
		allowed = 1
	}
	var counts []string
	for _, ref := range []string{"acme/demo/echo", "acme/demo/confirm", "acme/demo/memory-agent"} {
		counts = append(counts, fmt.Sprintf("%s %d", ref, connects[ref]))
		if connects[ref] > allowed {
			t.Errorf("%s connected %d times to the broker pod %s after the upgrade (broker replaced: %v): kicked more than once", ref, connects[ref], broker.Name, allowed == 1)
		}
	}
	t.Logf("sample agents' pods unchanged, no restarts; connects to the broker pod %s (replaced by the upgrade: %v): %s",
		broker.Name, allowed == 1, strings.Join(counts, ", "))
}

// leftover is one object found on the cluster after an uninstall.
type leftover struct{ kind, namespace, name string }

func (o leftover) String() string {
	if o.namespace == "" {
		return o.kind + " " + o.name
	}
	return o.kind + " " + o.namespace + "/" + o.name
}

// uninstallLeavesNothing uninstalls as docs/install.md says (the Agents and the samples first,
// while the operator runs; then the install) and lists every object of the cluster that is the
// install's: in its namespace, named a2a-fleet*, labelled as the project's, of the a2a.fleet.dev
// group, or a volume bound to one of its claims. Nothing but what the way keeps on purpose may be
// left.
func uninstallLeavesNothing(ctx context.Context, t *testing.T, prev *previousRelease, way upgradeWay) {
	samples, err := prev.env.Kustomization(t.TempDir(), "config/samples-workloads")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.KubectlRun(ctx, "delete", "agent", watchAgent, "-n", samplesNamespace, "--wait=true", "--timeout=2m"); err != nil {
		t.Fatal(err)
	}
	if _, err := env.KubectlRun(ctx, "delete", "-n", samplesNamespace, "-k", samples, "--wait=true", "--timeout=3m"); err != nil {
		t.Fatal(err)
	}
	// The suite's own NodePort Service (BrokerNodePort) is no part of the install.
	if err := env.Client.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: "a2a-fleet-mosquitto-e2e"}}); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	// The control: before the uninstall, the same listing finds the install's objects of every
	// kind it ships (so that "nothing left" is not a listing that sees nothing).
	installed, err := installObjects(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, o := range installed {
		seen[o.kind]++
	}
	for _, kind := range []string{"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
		"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "Role", "RoleBinding", "ServiceAccount",
		"ConfigMap", "Secret", "Service", "Deployment", "Pod", "PersistentVolumeClaim", "PersistentVolume", "Lease"} {
		if seen[kind] == 0 {
			t.Errorf("before the uninstall the listing finds no %s of the install: %v", kind, installed)
		}
	}
	if t.Failed() {
		return
	}
	t.Logf("before the uninstall: %d objects of the install, of %d kinds", len(installed), len(seen))
	start := time.Now()
	way.uninstall(ctx, t)
	var left, kept []leftover
	err = Poll(ctx, 3*time.Minute, "nothing of the install left but what "+way.name+" keeps", func(ctx context.Context) (bool, string, error) {
		all, err := installObjects(ctx)
		if err != nil {
			return false, err.Error(), nil
		}
		left, kept = left[:0], kept[:0]
		for _, o := range all {
			if way.kept(o) {
				kept = append(kept, o)
			} else {
				left = append(left, o)
			}
		}
		return len(left) == 0, fmt.Sprintf("%v", left), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s uninstall: nothing left %.1fs after it; kept on purpose: %v", way.name, time.Since(start).Seconds(), kept)
	if way.name == helmWay.name {
		// What docs/install.md says to do with what Helm keeps: the namespace, and the CRDs.
		if _, err := env.KubectlRun(ctx, "delete", "namespace", Namespace, "--wait=true", "--timeout=3m"); err != nil {
			t.Fatal(err)
		}
		if _, err := env.KubectlRun(ctx, "delete", "crd", "agents.a2a.fleet.dev", "conversationpolicies.a2a.fleet.dev",
			"tenants.a2a.fleet.dev", "agentgrants.a2a.fleet.dev", "--wait=true", "--timeout=2m"); err != nil {
			t.Fatal(err)
		}
		err := Poll(ctx, 3*time.Minute, "nothing left after the namespace and the CRDs are deleted", func(ctx context.Context) (bool, string, error) {
			all, err := installObjects(ctx)
			if err != nil {
				return false, err.Error(), nil
			}
			return len(all) == 0, fmt.Sprintf("%v", all), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("helm: after deleting the namespace and the CRDs, nothing of the install is left")
	}
}

// installObjects lists the objects of every listable kind on the cluster (discovery, then a list
// of each) and returns those that belong to the install: in its namespace, of the a2a.fleet.dev
// group, labelled as the project's, a volume bound to one of its claims, or a cluster-scoped
// object named a2a-fleet* (ClusterRoles, bindings, webhook and admission configurations). The
// node and the suite's own node-tools namespace share the prefix (the kind cluster's name) and
// are not the install's.
func installObjects(ctx context.Context) ([]leftover, error) {
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		return nil, err
	}
	lists, err := env.Clientset.Discovery().ServerPreferredResources()
	if err != nil && len(lists) == 0 {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	var found []leftover
	for _, list := range lists {
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil {
			return nil, err
		}
		for _, r := range list.APIResources {
			if !slices.Contains(r.Verbs, "list") || strings.Contains(r.Name, "/") || r.Kind == "Event" ||
				r.Kind == "Node" || r.Kind == "CSINode" || r.Kind == "ComponentStatus" {
				continue
			}
			// One list may hang on a loaded machine: bounded, and the caller's Poll calls again.
			listCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
			objects, err := dyn.Resource(gv.WithResource(r.Name)).List(listCtx, metav1.ListOptions{})
			cancel()
			if err != nil {
				return nil, fmt.Errorf("list %s: %w", r.Name, err)
			}
			for _, o := range objects.Items {
				claimNS, _, _ := unstructured.NestedString(o.Object, "spec", "claimRef", "namespace")
				labels := o.GetLabels()
				ns, name := o.GetNamespace(), o.GetName()
				ours := ns == Namespace || gv.Group == a2av1.GroupVersion.Group || claimNS == Namespace ||
					labels["app.kubernetes.io/part-of"] == "a2a-fleet" || labels["app.kubernetes.io/instance"] == "a2a-fleet" ||
					(ns == "" && strings.HasPrefix(name, "a2a-fleet") && name != nodeToolsNamespace) ||
					(r.Kind == "CustomResourceDefinition" && strings.HasSuffix(name, "."+a2av1.GroupVersion.Group))
				if ours {
					found = append(found, leftover{kind: r.Kind, namespace: ns, name: name})
				}
			}
		}
	}
	return found, nil
}
