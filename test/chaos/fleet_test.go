// Package chaos breaks an installed a2a-fleet on purpose, on a real cluster (test/cluster's Env:
// make test's kind cluster): config/quickstart runs from the project's images, the agents are
// Agent workloads whose Deployments run as pods (/chaosagent of the example-agents image, an SDK
// responder that journals every execution on a volume), and a load of single- and multi-turn
// requests runs from this machine through the broker's NodePort and the conversation service
// while the suite restarts the broker, wipes its volume, kills service replicas and the operator
// with SIGKILL, and rotates credentials. Every scenario reports requests completed, errored,
// lost and duplicated, and the bar is 0 lost, 0 duplicated and 0 frozen clients; recovery times
// go to docs/reliability.md.
package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/test/cluster"
)

// The chaos agents live in this namespace, org and unit.
const (
	chaosNS   = "chaos"
	chaosOrg  = "chaos"
	chaosUnit = "lab"
)

// The install's Deployments (config/quickstart) and the broker's volume (config/mosquitto).
const (
	operatorDeployment = "a2a-fleet-controller-manager"
	serviceDeployment  = "a2a-fleet-conversation-service"
	brokerDeployment   = "a2a-fleet-mosquitto"
	brokerClaim        = "a2a-fleet-mosquitto-data"
	redisDeployment    = "a2a-fleet-redis"
)

// Pod selectors of the install's components.
const (
	operatorPods = "app.kubernetes.io/component=operator"
	servicePods  = "app.kubernetes.io/name=conversation-service"
	brokerPods   = "app.kubernetes.io/name=mosquitto"
)

// workloads are the chaos agents that run as pods; "client" is the requester's identity (this
// machine's load generator).
var workloads = []string{"direct", "gated"}

// healthPort is where the chaos agents, the operator and the service serve their probes (and the
// chaos agents their journals).
const healthPort = "8081"

// fleetManifests are the chaos namespace, a policy that gates the "gated" agent (one working task
// per context, as before), a volume per
// workload for its pods' journals and logs, and the agents: "client" (the requester identity),
// "direct" (reached directly, with a persistent MQTT session: requests sent while it restarts
// wait on the broker) and "gated" (behind the conversation service, clean session: the service
// answers -32004 while it is away), the last two as workloads of /chaosagent with the SDK's
// readiness probe (ready once connected).
func fleetManifests() string {
	agent := func(name, labels, workload string) string {
		return fmt.Sprintf(`apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata: {name: %s, namespace: %s, labels: {%s}}
spec:
  orgID: %s
  unitID: %s
  card: {name: %s, description: chaos suite agent}
  callers: {scope: SameUnit}
%s---
`, name, chaosNS, labels, chaosOrg, chaosUnit, name, workload)
	}
	claim := func(name string) string {
		return `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: ` + name + `-chaos, namespace: ` + chaosNS + `}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 64Mi}}
---
`
	}
	workload := func(name, sessionExpiry string) string {
		return `  workload:
    template:
      spec:
        securityContext:
          runAsNonRoot: true
          runAsUser: 65532
          seccompProfile: {type: RuntimeDefault}
        containers:
        - name: agent
          image: ` + env.Image("a2a-fleet/example-agents") + `
          imagePullPolicy: IfNotPresent
          command: [/chaosagent]
          args: ["--health-addr=:` + healthPort + `"]
          env:
          - {name: CHAOS_DIR, value: /var/lib/chaos}
          - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
          - {name: A2A_SESSION_EXPIRY, value: "` + sessionExpiry + `"}
          - {name: A2A_CONNECT_TIMEOUT, value: 1m}
          ports: [{name: health, containerPort: ` + healthPort + `}]
          readinessProbe: {httpGet: {path: /readyz, port: health}, periodSeconds: 2}
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {drop: [ALL]}
          volumeMounts:
          - {name: chaos, mountPath: /var/lib/chaos}
        volumes:
        - {name: chaos, persistentVolumeClaim: {claimName: ` + name + `-chaos}}
`
	}
	return `apiVersion: v1
kind: Namespace
metadata: {name: ` + chaosNS + `}
---
apiVersion: a2a.fleet.dev/v1alpha1
kind: ConversationPolicy
metadata: {name: governed, namespace: ` + chaosNS + `}
spec:
  agentSelector: {matchLabels: {chaos: gated}}
  maxConcurrentTasksPerContext: 1
  # Every echo request opens a context: the fleet is kept from one scenario to the next, so
  # contexts expire (an idle context of the load lives 2 minutes, well past any fault's outage)
  # and one caller (the load) may hold as many as it opens.
  contextIdleTTL: 2m
  maxActiveContextsPerAgent: 100000
  maxActiveContextsPerCaller: 100000
---
` + claim("direct") + claim("gated") +
		agent("client", "role: client", "") +
		agent("direct", "role: agent", workload("direct", "10m")) +
		agent("gated", "role: agent, chaos: gated", workload("gated", "0s"))
}

// The install a scenario runs on: config/quickstart, or the quickstart scaled out on Redis.
const (
	quickstartInstall = "quickstart"
	redisInstall      = "quickstart on Redis, 2 service replicas"
)

// shared is what the scenarios of one run share: the install (one install for the whole run; a
// scenario that needs another one switches it) and the requester's connection.
var shared struct {
	install string
	broker  string
	conn    *a2amqtt.Conn
	req     *a2amqtt.Requester
}

// fleet is an installed a2a-fleet with the chaos agents running as workloads, as one scenario
// sees it.
type fleet struct {
	t         *testing.T
	requester *a2amqtt.Requester
	// restarts are the install's and the agents' container restarts when the scenario started;
	// killed are the containers the scenario killed itself (pod/container).
	restarts map[string]int32
	killed   map[string]bool
}

// newFleet makes sure install runs and the chaos fleet is up (both are kept from one scenario to
// the next: installing takes minutes), connects the requester and checks that both agents answer.
func newFleet(ctx context.Context, t *testing.T, install string) *fleet {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			env.Dump(t, cluster.Namespace, chaosNS)
		}
	})
	ensureInstall(ctx, t, install)
	f := &fleet{t: t, killed: map[string]bool{}}
	f.applyFleet(ctx)
	if shared.conn == nil {
		user, pass := credentials(ctx, t, "client")
		conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: shared.broker, Username: user, Password: pass, Agent: ref("client")})
		if err != nil {
			t.Fatalf("requester connect to %s: %v", shared.broker, err)
		}
		// The SDK's default retry policy (15 s first-reply timeout, 3 attempts), as an application uses it.
		req, err := a2amqtt.NewRequester(ctx, conn, a2amqtt.RequesterOptions{})
		if err != nil {
			_ = conn.Close(context.Background())
			t.Fatal(err)
		}
		shared.conn, shared.req = conn, req
	}
	f.requester = shared.req
	f.waitServing(ctx, 2*time.Minute)
	f.restarts = f.allRestarts(ctx)
	return f
}

// ensureInstall installs what the scenario needs, unless it is what runs: the quickstart as the
// README says (kubectl apply --server-side -k, taking back fields a scenario scaled), or the Redis
// variant as a user's overlay of it.
func ensureInstall(ctx context.Context, t *testing.T, install string) {
	t.Helper()
	if shared.install == install {
		err := env.WaitDeployments(ctx, cluster.Namespace, 2*time.Minute, installDeployments(install)...)
		if err == nil {
			return
		}
		// An earlier scenario failed and left it broken: install again, from scratch.
		t.Logf("%v: installing again", err)
		shared.install = ""
	}
	start := time.Now()
	// The run's first install starts from a cluster without a2a-fleet: what runs may be another
	// suite's (a Helm release, samples) or an earlier run's, with pods of older builds of the
	// images (same names and tags).
	if shared.install == "" {
		if err := deleteNamespace(ctx, chaosNS); err != nil {
			t.Fatal(err)
		}
		if err := env.Uninstall(ctx, t.Logf); err != nil {
			t.Fatal(err)
		}
	}
	// Going from one install to the other: the service's Deployment changes its strategy, which
	// an apply cannot undo (the defaulted rollingUpdate field has no owner), so it is replaced.
	for _, name := range []string{serviceDeployment, redisDeployment} {
		err := env.Client.Delete(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: cluster.Namespace, Name: name}})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	// On dynsec (the component config/mosquitto/dynsec): the scenarios read the broker's state
	// from its dynamic-security.json (observe_test.go).
	kustomization, err := env.Kustomization(dir, "config/quickstart", "config/mosquitto/dynsec")
	if err != nil {
		t.Fatal(err)
	}
	if install == redisInstall {
		if kustomization, err = redisOverlay(dir, kustomization); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.KubectlRun(ctx, "apply", "--server-side", "--force-conflicts", "-k", kustomization); err != nil {
		t.Fatal(err)
	}
	if install != redisInstall {
		_ = env.Client.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: cluster.Namespace, Name: redisDeployment}})
	}
	if err := env.WaitDeployments(ctx, cluster.Namespace, 5*time.Minute, installDeployments(install)...); err != nil {
		t.Fatal(err)
	}
	if shared.broker, err = env.BrokerNodePort(ctx); err != nil {
		t.Fatal(err)
	}
	shared.install = install
	t.Logf("installed %s in %.1fs; the broker from this machine: %s", install, time.Since(start).Seconds(), shared.broker)
}

func installDeployments(install string) []string {
	names := []string{operatorDeployment, serviceDeployment, brokerDeployment}
	if install == redisInstall {
		names = append(names, redisDeployment)
	}
	return names
}

// deleteNamespace deletes a namespace and waits until it is gone (its Agents finalized by the
// operator).
func deleteNamespace(ctx context.Context, name string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := env.Client.Delete(ctx, ns); apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	return cluster.Poll(ctx, 3*time.Minute, "namespace "+name+" gone", func(ctx context.Context) (bool, string, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(ns), ns)
		if apierrors.IsNotFound(err) {
			return true, "", nil
		}
		return false, "terminating", client.IgnoreNotFound(err)
	})
}

// redisOverlay is a user's overlay of the quickstart (the folder base) that scales the service out
// on Redis, as docs/conversation-service.md says: a Redis (Debian's redis-server, the image
// hack/kind/rootfs.sh makes; REDIS_IMG to run another), --store=redis://..., 2 replicas.
func redisOverlay(dir, base string) (string, error) {
	image := os.Getenv("REDIS_IMG")
	if image == "" {
		image = "a2a-fleet.local/redis:bookworm"
	}
	overlay := filepath.Join(dir, "redis")
	// kustomize takes a relative path only.
	rel, err := filepath.Rel(overlay, base)
	if err != nil {
		return "", err
	}
	files := map[string]string{
		"redis.yaml": `apiVersion: apps/v1
kind: Deployment
metadata: {name: ` + redisDeployment + `, namespace: ` + cluster.Namespace + `, labels: {app.kubernetes.io/name: redis}}
spec:
  replicas: 1
  selector: {matchLabels: {app.kubernetes.io/name: redis}}
  template:
    metadata: {labels: {app.kubernetes.io/name: redis}}
    spec:
      automountServiceAccountToken: false
      securityContext:
        runAsNonRoot: true
        runAsUser: 65534
        runAsGroup: 65534
        seccompProfile: {type: RuntimeDefault}
      containers:
      - name: redis
        image: ` + image + `
        imagePullPolicy: IfNotPresent
        command: [redis-server]
        args: ["--port", "6379", "--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", "/data"]
        ports: [{name: redis, containerPort: 6379}]
        readinessProbe: {tcpSocket: {port: redis}, periodSeconds: 2}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities: {drop: [ALL]}
        volumeMounts: [{name: data, mountPath: /data}]
      volumes: [{name: data, emptyDir: {}}]
---
apiVersion: v1
kind: Service
metadata: {name: ` + redisDeployment + `, namespace: ` + cluster.Namespace + `}
spec:
  selector: {app.kubernetes.io/name: redis}
  ports: [{name: redis, port: 6379, targetPort: redis}]
`,
		"service-redis.yaml": `apiVersion: apps/v1
kind: Deployment
metadata: {name: conversation-service, namespace: ` + cluster.Namespace + `}
spec:
  replicas: 2
  strategy: {type: RollingUpdate}
  template:
    spec:
      containers:
      - name: conversation-service
        args:
        - --broker=$(A2A_BROKER)
        - --store=redis://` + redisDeployment + `.` + cluster.Namespace + `.svc:6379/0
        - --metrics-bind-address=:8080
        - --health-probe-bind-address=:` + healthPort + `
`,
		"kustomization.yaml": "resources:\n- " + rel + "\n- redis.yaml\npatches:\n- path: service-redis.yaml\n",
	}
	if err := os.MkdirAll(overlay, 0o755); err != nil {
		return "", err
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(overlay, name), []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	return overlay, nil
}

// applyFleet applies the chaos fleet (idempotent) and waits until its Agents are Ready and its
// workloads' pods connected.
func (f *fleet) applyFleet(ctx context.Context) {
	f.t.Helper()
	file := filepath.Join(f.t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(file, []byte(fleetManifests()), 0o644); err != nil {
		f.t.Fatal(err)
	}
	start := time.Now()
	if _, err := env.KubectlRun(ctx, "apply", "--server-side", "--force-conflicts", "-f", file); err != nil {
		f.t.Fatal(err)
	}
	if _, err := env.WaitAgents(ctx, chaosNS, 3*time.Minute, false, "client"); err != nil {
		f.t.Fatal(err)
	}
	if _, err := env.WaitAgents(ctx, chaosNS, 3*time.Minute, true, workloads...); err != nil {
		f.t.Fatal(err)
	}
	if err := env.WaitDeployments(ctx, chaosNS, 3*time.Minute, workloadDeployments()...); err != nil {
		f.t.Fatal(err)
	}
	f.t.Logf("chaos fleet Ready and connected %.1fs after the apply", time.Since(start).Seconds())
}

func workloadDeployments() []string {
	var names []string
	for _, w := range workloads {
		names = append(names, w+"-agent")
	}
	return names
}

func ref(agent string) a2amqtt.AgentRef {
	return a2amqtt.AgentRef{Org: chaosOrg, Unit: chaosUnit, Agent: agent}
}

// credentials are an Agent's broker username and password (its Secret).
func credentials(ctx context.Context, t *testing.T, agent string) (string, string) {
	t.Helper()
	s := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: chaosNS, Name: agent + "-mqtt-credentials"}, s); err != nil {
		t.Fatal(err)
	}
	return string(s.Data["username"]), string(s.Data["password"])
}

// pods are the pods of namespace that match selector, running or not, by name.
func pods(ctx context.Context, t *testing.T, namespace, selector string) []corev1.Pod {
	t.Helper()
	list, err := env.Clientset.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	return list.Items
}

// readyPod is the one ready pod that matches selector (the test fails if there is not exactly one
// within timeout).
func readyPod(ctx context.Context, t *testing.T, namespace, selector string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := cluster.Poll(ctx, timeout, "one ready pod of "+selector, func(ctx context.Context) (bool, string, error) {
		ready, err := env.Pods(ctx, namespace, selector)
		if err != nil {
			return false, "", err
		}
		if len(ready) != 1 {
			return false, fmt.Sprintf("%d ready", len(ready)), nil
		}
		pod = &ready[0]
		return true, "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

func agentPods(agent string) string { return "a2a.fleet.dev/agent=" + agent }

// waitServing sends probes until both agents answer (the first request after a start or a fault).
func (f *fleet) waitServing(ctx context.Context, timeout time.Duration) time.Duration {
	f.t.Helper()
	start := time.Now()
	for _, agent := range workloads {
		for {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			res, err := sendOnce(pctx, f.requester, agent, "", "", "echo:probe")
			cancel()
			if err == nil && a2amqtt.ResultText(res) == "probe" {
				break
			}
			if time.Since(start) > timeout {
				f.t.Fatalf("%s does not answer %s after the start or fault: %v", agent, time.Since(start).Round(time.Second), err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	return time.Since(start)
}

// journals reads every execution the chaos agents recorded, from each workload's volume (the
// journals of every pod it ever had) through a pod of it: message id -> "pod time task" of each
// execution.
func (f *fleet) journals(ctx context.Context) map[string][]string {
	f.t.Helper()
	out := map[string][]string{}
	for _, agent := range workloads {
		body := f.fromVolume(ctx, agent, "/journal")
		for _, line := range strings.Split(body, "\n") {
			// pod time task message "text"
			fields := strings.Fields(line)
			if len(fields) >= 4 {
				out[fields[3]] = append(out[fields[3]], fields[0]+" "+fields[1]+" task "+fields[2])
			}
		}
	}
	return out
}

// podLog is what a pod of a workload logged (its log file on the workload's volume, kept after
// the pod is gone).
func (f *fleet) podLog(ctx context.Context, agent, pod string) string {
	f.t.Helper()
	return f.fromVolume(ctx, agent, "/log?pod="+pod)
}

// fromVolume reads path from the chaos agent's file server in a ready pod of the workload.
func (f *fleet) fromVolume(ctx context.Context, agent, path string) string {
	f.t.Helper()
	var body []byte
	err := cluster.Poll(ctx, time.Minute, agent+": GET "+path, func(ctx context.Context) (bool, string, error) {
		ready, err := env.Pods(ctx, chaosNS, agentPods(agent))
		if err != nil || len(ready) == 0 {
			return false, fmt.Sprintf("no ready pod (%v)", err), nil
		}
		code, b, err := env.PodGet(ctx, chaosNS, ready[0].Name, healthPort, path)
		if err != nil || code != 200 {
			return false, fmt.Sprintf("%s: %d %v %s", ready[0].Name, code, err, b), nil
		}
		body = b
		return true, "", nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return string(body)
}

// allRestarts counts the container restarts of the install's and the chaos agents' pods.
func (f *fleet) allRestarts(ctx context.Context) map[string]int32 {
	f.t.Helper()
	out := map[string]int32{}
	for _, ns := range []string{cluster.Namespace, chaosNS} {
		r, err := env.Restarts(ctx, ns, "")
		if err != nil {
			f.t.Fatal(err)
		}
		for k, v := range r {
			out[ns+"/"+k] = v
		}
	}
	return out
}

// kill sends SIGKILL to a pod's container (the kubelet restarts it in the same pod) and waits
// until it runs again; the restart is the scenario's, not one on its own.
func (f *fleet) kill(ctx context.Context, pod *corev1.Pod, container string) {
	f.t.Helper()
	f.killed[pod.Namespace+"/"+pod.Name+"/"+container] = true
	before := restartCount(pod, container)
	if err := env.Signal(ctx, pod, container, "KILL"); err != nil {
		f.t.Fatal(err)
	}
	err := cluster.Poll(ctx, 2*time.Minute, pod.Name+"/"+container+" restarted after kill -9", func(ctx context.Context) (bool, string, error) {
		p, err := env.Clientset.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, "", err
		}
		return restartCount(p, container) > before, fmt.Sprintf("restarts %d", restartCount(p, container)), nil
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

func restartCount(pod *corev1.Pod, container string) int32 {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name == container {
			return cs.RestartCount
		}
	}
	return 0
}

// checkNoFrozenProcess: every Deployment of the install and the fleet is available with ready
// pods, no container restarted that the scenario did not kill, and both agents answer through the
// bus.
func (f *fleet) checkNoFrozenProcess(ctx context.Context) {
	f.t.Helper()
	if err := env.WaitDeployments(ctx, cluster.Namespace, 90*time.Second, installDeployments(shared.install)...); err != nil {
		f.t.Errorf("frozen or unready: %v", err)
	}
	if err := env.WaitDeployments(ctx, chaosNS, 90*time.Second, workloadDeployments()...); err != nil {
		f.t.Errorf("frozen or unready: %v", err)
	}
	for key, n := range f.allRestarts(ctx) {
		if n > f.restarts[key] && !f.killed[key] {
			f.t.Errorf("container %s restarted on its own during the scenario (%d times)", key, n-f.restarts[key])
		}
	}
	f.waitServing(ctx, 90*time.Second)
}
