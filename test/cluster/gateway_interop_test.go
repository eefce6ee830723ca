package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
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

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2aclient/agentcard"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/gateway"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// gatewayInterop is what the gateway's interop checks add beside the quickstart's samples:
//   - http-stranger, an HTTP caller's identity that the memory sample's callers rules do not
//     admit (it lacks the team label), for the ServiceAccount gw-stranger;
//   - brief-memory, the memory example under the ConversationPolicy brief, whose contexts
//     expire after 2 s idle (exposed over HTTP);
//   - slow-confirm, the confirm example with a delay before it acts (governed, exposed over
//     HTTP), so that a gateway pod can be killed while its stream is open;
//   - http-agents, a pod (the Debian image the kind node already holds, nothing pulled) running
//     two HTTP A2A servers: the official JS SDK's (test/gateway/js/http-responder.mjs on :8081)
//     and a2a-go's (bin/httpdeploy on :8082); the host copies Node.js, the SDK and the programs
//     into it (pods cannot reach the host's network on kind);
//   - deploy-js and deploy-go, the Agents whose spec.http.url names those servers: the gateway
//     holds them on the bus. Their cards are the ones the servers serve (CardMatches).
const gatewayInterop = `apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata:
  name: http-stranger
  namespace: default
spec:
  orgID: acme
  unitID: demo
  card:
    name: HTTP stranger
    description: An HTTP client the memory agent does not admit.
  callers:
    scope: None
  http:
    serviceAccounts: [gw-stranger]
---
apiVersion: a2a.fleet.dev/v1alpha1
kind: ConversationPolicy
metadata:
  name: brief
  namespace: default
spec:
  agentSelector:
    matchLabels:
      a2a.fleet.dev/conversations: brief
  contextIdleTTL: 2s
  contextMaxAge: 1h
---
apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata:
  name: brief-memory
  namespace: default
  labels:
    a2a.fleet.dev/team: demo
    a2a.fleet.dev/conversations: brief
spec:
  orgID: acme
  unitID: demo
  card:
    name: Brief memory agent
    description: The memory example; its contexts expire after 2 s idle.
  callers:
    scope: SameUnit
  http:
    expose: true
  workload:
    template:
      spec:
        automountServiceAccountToken: false
        securityContext:
          runAsNonRoot: true
          seccompProfile: {type: RuntimeDefault}
        containers:
        - name: agent
          image: a2a-fleet/example-agents:dev
          imagePullPolicy: IfNotPresent
          command: [/memory]
          resources:
            requests: {cpu: 20m, memory: 32Mi}
            limits: {memory: 128Mi}
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {drop: [ALL]}
---
apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata:
  name: slow-confirm
  namespace: default
  labels:
    a2a.fleet.dev/team: demo
    a2a.fleet.dev/conversations: governed
spec:
  orgID: acme
  unitID: demo
  card:
    name: Slow confirmation agent
    description: The confirm example, 8 s between working and done.
    capabilities:
      streaming: true
  callers:
    scope: SameUnit
  http:
    expose: true
  workload:
    template:
      spec:
        automountServiceAccountToken: false
        securityContext:
          runAsNonRoot: true
          seccompProfile: {type: RuntimeDefault}
        containers:
        - name: agent
          image: a2a-fleet/example-agents:dev
          imagePullPolicy: IfNotPresent
          command: [/confirm]
          args: [--delay=8s]
          env:
          - {name: A2A_SESSION_EXPIRY, value: "5m"}
          resources:
            requests: {cpu: 20m, memory: 32Mi}
            limits: {memory: 128Mi}
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {drop: [ALL]}
---
apiVersion: v1
kind: Service
metadata:
  name: http-agents
  namespace: default
spec:
  selector: {app.kubernetes.io/name: http-agents}
  ports:
  - {name: js, port: 8081}
  - {name: go, port: 8082}
---
apiVersion: v1
kind: Pod
metadata:
  name: http-agents
  namespace: default
  labels: {app.kubernetes.io/name: http-agents}
spec:
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 1
  securityContext:
    runAsNonRoot: true
    runAsUser: 65534
    runAsGroup: 65534
    seccompProfile: {type: RuntimeDefault}
  volumes:
  - {name: work, emptyDir: {}}
  containers:
  # The JS server runs while /work/js-stopped does not exist (the presence check stops it).
  - name: js
    image: a2a-fleet.local/debian:bookworm
    imagePullPolicy: Never
    command: [sh, -c, 'until [ -e /work/ready ]; do sleep 0.2; done; cd /work/js; while :; do if [ ! -e /work/js-stopped ]; then /work/node http-responder.mjs & echo $! > /work/js.pid; wait $!; fi; sleep 0.2; done']
    env:
    - {name: A2A_HOST, value: 0.0.0.0}
    - {name: A2A_PORT, value: "8081"}
    - {name: A2A_PUBLIC_URL, value: "http://http-agents.default.svc:8081/"}
    ports:
    - {name: js, containerPort: 8081}
    volumeMounts:
    - {name: work, mountPath: /work}
    securityContext:
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL]}
  - name: go
    image: a2a-fleet.local/debian:bookworm
    imagePullPolicy: Never
    command: [sh, -c, 'until [ -e /work/ready ]; do sleep 0.2; done; exec /work/httpdeploy --addr :8082 --url http://http-agents.default.svc:8082/']
    ports:
    - {name: go, containerPort: 8082}
    volumeMounts:
    - {name: work, mountPath: /work}
    securityContext:
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL]}
---
apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata:
  name: deploy-js
  namespace: default
spec:
  orgID: acme
  unitID: demo
  card:
    name: deploy
    description: deploys after a yes (A2A JS SDK over HTTP)
    version: "1.0.0"
    capabilities:
      streaming: true
    defaultInputModes: [text/plain]
    defaultOutputModes: [text/plain]
  callers:
    scope: SameUnit
  http:
    url: http://http-agents.default.svc:8081/
---
apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata:
  name: deploy-go
  namespace: default
spec:
  orgID: acme
  unitID: demo
  card:
    name: deploy
    description: deploys after a yes (a2a-go over HTTP)
    version: "1.0.0"
    capabilities:
      streaming: true
    defaultInputModes: [text/plain]
    defaultOutputModes: [text/plain]
  callers:
    scope: SameUnit
  http:
    url: http://http-agents.default.svc:8082/
`

// nodeDeps is where hack/install-node-deps.sh installed the JS SDK (make tools-test).
func nodeDeps(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("bash", filepath.Join(env.Root, "hack", "install-node-deps.sh"), "--print-dir").Output()
	if err != nil {
		t.Fatalf("node deps dir: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@a2a-js", "sdk")); err != nil {
		t.Fatalf("the A2A JS SDK is not installed in %s: run hack/install-node-deps.sh (make tools-test): %v", dir, err)
	}
	return dir
}

// startHTTPAgents copies Node.js, the JS SDK with js/http-responder.mjs, and bin/httpdeploy into
// the http-agents pod (one tar stream through kubectl exec), then lets its containers start them.
func startHTTPAgents(ctx context.Context, t *testing.T) {
	t.Helper()
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	httpdeploy := filepath.Join(env.Root, "bin", "httpdeploy")
	if _, err := os.Stat(httpdeploy); err != nil {
		t.Fatalf("bin/httpdeploy: %v (make tools-test builds it)", err)
	}
	// A staging folder of links, followed by tar -h: node, httpdeploy, js/node_modules, js/*.mjs.
	stage := t.TempDir()
	links := map[string]string{
		"node":                  nodeBin,
		"httpdeploy":            httpdeploy,
		"js/node_modules":       filepath.Join(nodeDeps(t), "node_modules"),
		"js/http-responder.mjs": filepath.Join(env.Root, "test", "gateway", "js", "http-responder.mjs"),
	}
	for name, target := range links {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(stage, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, filepath.Join(stage, name)); err != nil {
			t.Fatal(err)
		}
	}
	err = Poll(ctx, 2*time.Minute, "pod default/http-agents running", func(ctx context.Context) (bool, string, error) {
		pods, err := env.Pods(ctx, samplesNamespace, "app.kubernetes.io/name=http-agents")
		if err != nil {
			return false, "", err
		}
		return len(pods) == 1 && pods[0].Status.Phase == "Running", fmt.Sprintf("%d pods", len(pods)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Named, not ".": the pod's user may not change the emptyDir's own mode and times.
	tarCmd := exec.CommandContext(ctx, "tar", "-chf", "-", "-C", stage, "node", "httpdeploy", "js")
	kubectl := exec.CommandContext(ctx, env.Kubectl, "exec", "-i", "-n", samplesNamespace, "http-agents", "-c", "js", "--", "tar", "-xf", "-", "-C", "/work")
	kubectl.Env = append(os.Environ(), "KUBECONFIG="+env.Kubeconfig)
	pipe, err := tarCmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	kubectl.Stdin = pipe
	var out bytes.Buffer
	kubectl.Stdout, kubectl.Stderr = &out, &out
	start := time.Now()
	if err := tarCmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := kubectl.Run(); err != nil {
		t.Fatalf("copy into http-agents: %v\n%s", err, out.String())
	}
	if err := tarCmd.Wait(); err != nil {
		t.Fatalf("tar: %v", err)
	}
	if _, err := env.Exec(ctx, samplesNamespace, "http-agents", "js", "touch", "/work/ready"); err != nil {
		t.Fatal(err)
	}
	t.Logf("Node.js, the JS SDK and bin/httpdeploy copied into pod http-agents in %.1fs", time.Since(start).Seconds())
}

// jsTurn is one line of js/http-requester.mjs.
type jsTurn struct {
	Turn        int      `json:"turn"`
	Events      []string `json:"events"`
	States      []string `json:"states"`
	TaskID      string   `json:"taskId"`
	State       string   `json:"state"`
	Text        string   `json:"text"`
	SameContext bool     `json:"sameContext"`
	Got         *struct {
		State   string   `json:"state"`
		History []string `json:"history"`
		Error   string   `json:"error"`
	} `json:"got"`
	Error *struct {
		Message string `json:"message"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// runJSRequester runs js/http-requester.mjs (the JS SDK's HTTP client) on this machine, next to
// the installed node_modules, and returns its lines.
func runJSRequester(ctx context.Context, t *testing.T, cardURL, token, turns string) []jsTurn {
	t.Helper()
	dir, err := os.MkdirTemp(nodeDeps(t), "cluster-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	src, err := os.ReadFile(filepath.Join(env.Root, "test", "gateway", "js", "http-requester.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "http-requester.mjs")
	if err := os.WriteFile(script, src, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", script)
	cmd.Env = append(os.Environ(), "A2A_CARD_URL="+cardURL, "A2A_TOKEN="+token, "A2A_TURNS="+turns)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node http-requester.mjs: %v\n%s", err, stderr.String())
	}
	var lines []jsTurn
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var l jsTurn
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("http-requester.mjs: line %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	return lines
}

// jsClientCallsMQTTAgents: the official JS SDK's HTTP client, on this machine, calls governed
// samples through the gateway Service: with memory, follow-ups in one context (the second turn
// recalls the first), input-required and resume with GetTask of the resumed task, a mismatched
// context (-32602); with confirm (its card declares streaming), input-required, then the
// approval as an SSE stream whose events arrive in order, and GetTask; with brief-memory, a
// follow-up after its policy's idle TTL refused with -32060 context_expired. A caller the memory agent
// does not admit gets the bus's -31403; a malformed body -32700; a body over the gateway's limit
// HTTP 413 with a JSON-RPC error.
func jsClientCallsMQTTAgents(ctx context.Context, t *testing.T, gatewayAddr, callerToken, strangerToken string) {
	card := "http://" + gatewayAddr + "/agents/acme/demo/memory-agent/.well-known/agent-card.json"
	start := time.Now()
	turns := runJSRequester(ctx, t, card, callerToken,
		`[{"say":"hello"},{"say":"what did I say?"},{"say":"remind me to call Bob"},{"say":"tomorrow","resume":true,"get":true},`+
			`{"say":"again","resume":true,"otherContext":true}]`)
	t.Logf("JS SDK client, 5 turns with memory-agent through the gateway on kind in %.1fs", time.Since(start).Seconds())
	if len(turns) != 5 {
		t.Fatalf("turns %+v", turns)
	}
	want := []struct{ state, text string }{
		{"TASK_STATE_COMPLETED", "Turn 1"},
		{"TASK_STATE_COMPLETED", `Earlier in this conversation you said: "hello"`},
		{"TASK_STATE_INPUT_REQUIRED", "When should I remind you?"},
		{"TASK_STATE_COMPLETED", "OK, I will remind you to call Bob tomorrow."},
	}
	for i, w := range want {
		got := turns[i]
		if got.Error != nil || got.State != w.state || !strings.Contains(got.Text, w.text) || !got.SameContext {
			t.Fatalf("turn %d: %+v, want %s %q in the same context", i+1, got, w.state, w.text)
		}
	}
	if turns[3].TaskID != turns[2].TaskID {
		t.Fatalf("resume answered task %s, want %s", turns[3].TaskID, turns[2].TaskID)
	}
	if g := turns[3].Got; g == nil || g.State != "TASK_STATE_COMPLETED" || !slices.Contains(g.History, "remind me to call Bob") || !slices.Contains(g.History, "tomorrow") {
		t.Fatalf("GetTask of the resumed task: %+v, want completed with both user turns in its history", g)
	}
	if e := turns[4].Error; e == nil || e.Code != -32602 {
		t.Fatalf("mismatched context: %+v, want -32602", turns[4])
	}

	confirm := "http://" + gatewayAddr + "/agents/acme/demo/confirm/.well-known/agent-card.json"
	turns = runJSRequester(ctx, t, confirm, callerToken,
		`[{"say":"rename the js bucket"},{"say":"go ahead","resume":true,"approve":true,"stream":true,"get":true}]`)
	if len(turns) != 2 || turns[0].State != "TASK_STATE_INPUT_REQUIRED" || turns[1].Error != nil || turns[1].TaskID != turns[0].TaskID {
		t.Fatalf("confirm: %+v, want input-required, then the same task resumed", turns)
	}
	ev, st := turns[1].Events, turns[1].States
	if artifact := slices.Index(ev, "artifactUpdate"); artifact < 0 || slices.Index(ev, "statusUpdate") > artifact || ev[len(ev)-1] != "statusUpdate" ||
		len(st) < 2 || st[0] != "TASK_STATE_WORKING" || st[len(st)-1] != "TASK_STATE_COMPLETED" {
		t.Fatalf("confirm's streamed resume: events %v states %v, want working, the artifact, then completed", ev, st)
	}
	if g := turns[1].Got; g == nil || g.State != "TASK_STATE_COMPLETED" || !slices.Contains(g.History, "rename the js bucket") {
		t.Fatalf("GetTask of confirm's task: %+v, want completed with the first turn in its history", g)
	}
	t.Logf("JS SDK: confirm's streamed resume: events %v states %v; GetTask history %q", ev, st, turns[1].Got.History)

	if _, err := env.WaitAgents(ctx, samplesNamespace, 2*time.Minute, true, "brief-memory"); err != nil {
		t.Fatal(err)
	}
	brief := "http://" + gatewayAddr + "/agents/acme/demo/brief-memory/.well-known/agent-card.json"
	turns = runJSRequester(ctx, t, brief, callerToken, `[{"say":"hello"},{"say":"still there?","waitMs":3500}]`)
	if len(turns) != 2 || turns[0].State != "TASK_STATE_COMPLETED" || turns[1].Error == nil || turns[1].Error.Code != -32060 {
		t.Fatalf("brief-memory: %+v, want a first turn, then -32060 context_expired after 3.5 s idle (the policy's 2 s)", turns)
	}
	t.Logf("JS SDK: a follow-up 3.5 s after the first turn, in a context of 2 s idle TTL: %d %q", turns[1].Error.Code, turns[1].Error.Message)

	refused := runJSRequester(ctx, t, card, strangerToken, `[{"say":"hello"}]`)
	if len(refused) != 1 || refused[0].Error == nil || refused[0].Error.Code != -31403 {
		t.Fatalf("http-stranger calling memory-agent: %+v, want JSON-RPC -31403 (the broker refused the publish)", refused)
	}
	t.Logf("JS SDK as http-stranger: %d %q", refused[0].Error.Code, refused[0].Error.Message)

	rpc := "http://" + gatewayAddr + "/agents/acme/demo/memory-agent/"
	post := func(body []byte) (int, map[string]any) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, rpc, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+callerToken)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = res.Body.Close() }()
		data, _ := io.ReadAll(res.Body)
		var msg map[string]any
		if err := json.Unmarshal(data, &msg); err != nil {
			t.Fatalf("HTTP %d, body %q is not JSON: %v", res.StatusCode, data, err)
		}
		return res.StatusCode, msg
	}
	rpcError := func(msg map[string]any) (float64, string) {
		e, _ := msg["error"].(map[string]any)
		code, _ := e["code"].(float64)
		text, _ := e["message"].(string)
		return code, text
	}
	status, msg := post([]byte(`{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":`))
	if code, _ := rpcError(msg); status != http.StatusOK || code != -32700 {
		t.Fatalf("malformed body: HTTP %d %v, want a JSON-RPC -32700", status, msg)
	}
	status, msg = post(append([]byte(`{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"pad":"`), append(bytes.Repeat([]byte("x"), 1<<20), `"}}`...)...))
	if code, text := rpcError(msg); status != http.StatusRequestEntityTooLarge || code != -32600 || !strings.Contains(text, "larger than the gateway accepts") {
		t.Fatalf("oversized body: HTTP %d %v, want 413 with a JSON-RPC -32600 naming the limit", status, msg)
	}
	t.Logf("malformed body: -32700; oversized: HTTP 413 %v", msg["error"])
}

// userMessage is a message of the user in contextID, continuing taskID when it is set.
func userMessage(contextID string, taskID a2a.TaskID, text string) *a2a.SendMessageRequest {
	m := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text))
	m.ContextID, m.TaskID = contextID, taskID
	return &a2a.SendMessageRequest{Message: m}
}

// eventKind names a stream event for an order check: "status:STATE", "artifact" or "task".
func eventKind(ev a2a.Event) string {
	switch e := ev.(type) {
	case *a2a.TaskStatusUpdateEvent:
		return "status:" + string(e.Status.State)
	case *a2a.TaskArtifactUpdateEvent:
		return "artifact"
	case *a2a.Task:
		return "task"
	default:
		return fmt.Sprintf("%T", ev)
	}
}

// mqttCallsHTTPAgent: the SDK's requester, as the console on this machine, calls an HTTP agent
// the gateway holds on the bus: input-required, a resume in the same task, a follow-up task in
// the same context (its second turn there), and a streamed resume whose events arrive in order.
func (b *bus) mqttCallsHTTPAgent(ctx context.Context, t *testing.T, agent string) {
	c := b.conversationsClient(ctx, t, "acme/demo/"+agent)
	defer func() { _ = c.Destroy() }()
	start := time.Now()
	contextID := a2a.NewContextID()
	var ask *a2a.Task
	err := Poll(ctx, time.Minute, "SendMessage to "+agent, func(ctx context.Context) (bool, string, error) {
		res, err := c.SendMessage(ctx, userMessage(contextID, "", "v2"))
		if err != nil {
			return false, err.Error(), nil // responder_unavailable while the gateway takes the agent up
		}
		task, ok := res.(*a2a.Task)
		if !ok {
			return false, "", fmt.Errorf("answered %T, want a task", res)
		}
		ask = task
		return true, "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if ask.Status.State != a2a.TaskStateInputRequired || ask.ContextID != contextID || a2amqtt.TextOf(ask.Status.Message) != "Turn 1. Deploy v2? Answer yes or no." {
		t.Fatalf("turn 1: %s %q in %s", ask.Status.State, a2amqtt.TextOf(ask.Status.Message), ask.ContextID)
	}
	res, err := c.SendMessage(ctx, userMessage(contextID, ask.ID, "yes"))
	if err != nil {
		t.Fatal(err)
	}
	if done, ok := res.(*a2a.Task); !ok || done.ID != ask.ID || done.Status.State != a2a.TaskStateCompleted || a2amqtt.TextOf(done.Status.Message) != "Deployed v2." {
		t.Fatalf("resume: %+v", res)
	}
	var second *a2a.TaskStatusUpdateEvent
	for ev, err := range c.SendStreamingMessage(ctx, userMessage(contextID, "", "v3")) {
		if err != nil {
			t.Fatalf("follow-up stream: %v", err)
		}
		if su, ok := ev.(*a2a.TaskStatusUpdateEvent); ok {
			second = su
		}
	}
	if second == nil || second.Status.State != a2a.TaskStateInputRequired || second.TaskID == ask.ID || a2amqtt.TextOf(second.Status.Message) != "Turn 2. Deploy v3? Answer yes or no." {
		t.Fatalf("follow-up: last status %+v, want a new task at turn 2 of the same context", second)
	}
	var kinds []string
	for ev, err := range c.SendStreamingMessage(ctx, userMessage(contextID, second.TaskID, "yes")) {
		if err != nil {
			t.Fatalf("streamed resume: %v", err)
		}
		kinds = append(kinds, eventKind(ev))
	}
	working, artifact := slices.Index(kinds, "status:"+string(a2a.TaskStateWorking)), slices.Index(kinds, "artifact")
	if working < 0 || artifact < working || kinds[len(kinds)-1] != "status:"+string(a2a.TaskStateCompleted) ||
		slices.Contains(kinds, "status:"+string(a2a.TaskStateInputRequired)) {
		t.Fatalf("streamed resume: events %v, want working, then the artifact, then completed, in that order", kinds)
	}
	t.Logf("%s over the gateway: 4 turns in %.1fs; streamed resume %v", agent, time.Since(start).Seconds(), kinds)
}

// connectedIs waits until an Agent's Connected condition has the given status and returns how
// long that took.
func connectedIs(ctx context.Context, t *testing.T, name string, want metav1.ConditionStatus) time.Duration {
	t.Helper()
	start := time.Now()
	err := Poll(ctx, time.Minute, fmt.Sprintf("Agent %s Connected=%s", name, want), func(ctx context.Context) (bool, string, error) {
		a := &a2av1.Agent{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: samplesNamespace, Name: name}, a); err != nil {
			return false, "", err
		}
		c := meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionConnected)
		return c != nil && c.Status == want, ConditionSummary(a.Status.Conditions), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return time.Since(start)
}

// httpAgentsJoinTheFleet: both HTTP agents' served cards match their manifests (CardMatches),
// each answers the SDK's requester through the gateway, and the JS agent's presence follows its
// server: stopped, the Agent is disconnected; started again, connected.
func (b *bus) httpAgentsJoinTheFleet(ctx context.Context, t *testing.T) {
	for _, name := range []string{"deploy-js", "deploy-go"} {
		err := Poll(ctx, time.Minute, name+" CardMatches=True", func(ctx context.Context) (bool, string, error) {
			a := &a2av1.Agent{}
			if err := env.Client.Get(ctx, client.ObjectKey{Namespace: samplesNamespace, Name: name}, a); err != nil {
				return false, "", err
			}
			c := meta.FindStatusCondition(a.Status.Conditions, a2av1.ConditionCardMatches)
			if c == nil {
				return false, ConditionSummary(a.Status.Conditions), nil
			}
			return c.Status == metav1.ConditionTrue && c.Reason == a2av1.ReasonServedCardMatches, c.Reason + ": " + c.Message, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	b.mqttCallsHTTPAgent(ctx, t, "deploy-js")
	b.mqttCallsHTTPAgent(ctx, t, "deploy-go")

	if _, err := env.Exec(ctx, samplesNamespace, "http-agents", "js", "sh", "-c", "touch /work/js-stopped; kill $(cat /work/js.pid)"); err != nil {
		t.Fatal(err)
	}
	down := connectedIs(ctx, t, "deploy-js", metav1.ConditionFalse)
	if _, err := env.Exec(ctx, samplesNamespace, "http-agents", "js", "rm", "/work/js-stopped"); err != nil {
		t.Fatal(err)
	}
	up := connectedIs(ctx, t, "deploy-js", metav1.ConditionTrue)
	t.Logf("deploy-js's presence follows its server: Connected=False %.1fs after the server stopped, True %.1fs after it started again", down.Seconds(), up.Seconds())
}

// ringOwner is the gateway replica that serves an identity (its client ID): the rendezvous owner
// among the replicas whose Leases are live, as each replica computes it.
func ringOwner(ctx context.Context, t *testing.T, clientID string) (owner string, others []string) {
	t.Helper()
	var members []gateway.Member
	err := Poll(ctx, time.Minute, "two live gateway Leases", func(ctx context.Context) (bool, string, error) {
		leases := &coordinationv1.LeaseList{}
		if err := env.Client.List(ctx, leases, client.InNamespace(Namespace), client.HasLabels{gateway.RingLabel}); err != nil {
			return false, "", err
		}
		members = members[:0]
		for _, l := range leases.Items {
			live := l.Spec.RenewTime != nil && l.Spec.LeaseDurationSeconds != nil &&
				time.Since(l.Spec.RenewTime.Time) < time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second
			if live && l.Spec.HolderIdentity != nil {
				members = append(members, gateway.Member{ID: *l.Spec.HolderIdentity})
			}
		}
		return len(members) == 2, fmt.Sprintf("%d live", len(members)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	owner = gateway.RendezvousOwner(clientID, members).ID
	for _, m := range members {
		if m.ID != owner {
			others = append(others, m.ID)
		}
	}
	return owner, others
}

// gatewayPodKilledDuringAStream: http-caller's first turn with slow-confirm (input-required, its
// continuation hint on the question), then its approval as an SSE stream through the replica
// that holds http-caller's connection; at the first event (working) a second task in the context
// is refused (secondTaskRefused), then that pod is deleted without grace. The stream ends without the
// task's end; the caller re-fetches the task with GetTask through the other replica until it is
// completed, and its history holds both turns and the answer.
func gatewayPodKilledDuringAStream(ctx context.Context, t *testing.T, token string) {
	caller := &a2av1.Agent{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: samplesNamespace, Name: "http-caller"}, caller); err != nil {
		t.Fatal(err)
	}
	owner, others := ringOwner(ctx, t, caller.Status.ClientID)
	hc := &http.Client{Transport: bearer{token: token, next: http.DefaultTransport}}
	var base string
	connect := func(pod string) *a2aclient.Client {
		start := time.Now()
		base = "http://" + portForward(ctx, t, Namespace, "pod/"+pod, "8080") + "/agents/acme/demo/slow-confirm"
		var c *a2aclient.Client
		err := Poll(ctx, time.Minute, "slow-confirm's card through "+pod, func(ctx context.Context) (bool, string, error) {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			card, err := agentcard.NewResolver(hc).Resolve(rctx, base)
			if err != nil {
				return false, err.Error(), nil
			}
			c, err = a2aclient.NewFromCard(ctx, card, a2aclient.WithJSONRPCTransport(hc))
			return err == nil, "", err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("port-forward to %s and slow-confirm's card through it: %.1fs", pod, time.Since(start).Seconds())
		return c
	}
	c := connect(owner)
	defer func() { _ = c.Destroy() }()
	var ask *a2a.Task
	err := Poll(ctx, time.Minute, "turn 1 with slow-confirm", func(ctx context.Context) (bool, string, error) {
		res, err := c.SendMessage(ctx, userMessage("", "", "rotate the gateway logs"))
		if err != nil {
			return false, err.Error(), nil
		}
		task, ok := res.(*a2a.Task)
		if !ok {
			return false, "", fmt.Errorf("answered %T, want a task", res)
		}
		ask = task
		return true, "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if ask.Status.State != a2a.TaskStateInputRequired {
		t.Fatalf("turn 1: %s, want input-required", ask.Status.State)
	}
	// The continuation hint crosses the gateway on the question (docs/protocol.md).
	if hint, ok, err := a2amqtt.ContinuationOf(ask.Status.Message); err != nil || !ok || hint.ExpectedInput != a2amqtt.ExpectApproval || hint.ResumeScope != a2amqtt.ResumeSameTask {
		t.Fatalf("turn 1's continuation hint over HTTP: %+v %v %v, want an approval of this task", hint, ok, err)
	}
	ownerRPC := base + "/"

	var kinds []string
	var killed time.Time
	streamCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var streamErr error
	approve := userMessage(ask.ContextID, ask.ID, "go ahead")
	approve.Message.Parts = append(approve.Message.Parts, a2amqtt.ApprovalPart(true, ""))
	for ev, err := range c.SendStreamingMessage(streamCtx, approve) {
		if err != nil {
			streamErr = err
			break
		}
		kinds = append(kinds, eventKind(ev))
		if killed.IsZero() && kinds[len(kinds)-1] == "status:"+string(a2a.TaskStateWorking) {
			secondTaskRefused(ctx, t, ownerRPC, token, ask.ContextID)
			pod, err := env.Clientset.CoreV1().Pods(Namespace).Get(ctx, owner, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := env.Kill(ctx, pod); err != nil {
				t.Fatal(err)
			}
			killed = time.Now()
		}
	}
	if killed.IsZero() {
		t.Fatalf("the stream ended (%v, events %v) before its working status: nothing was killed", streamErr, kinds)
	}
	if slices.Contains(kinds, "status:"+string(a2a.TaskStateCompleted)) {
		t.Fatalf("the stream carried the task to its end (%v) although the replica serving it was deleted: the kill came too late", kinds)
	}
	t.Logf("gateway pod %s (owner of http-caller) deleted at the stream's working status; the stream ended %.1fs later: %v (events %v)",
		owner, time.Since(killed).Seconds(), streamErr, kinds)

	var seen []string // what the caller saw until the end, each change once, with its time
	observe := func(what string) {
		if len(seen) == 0 || !strings.HasSuffix(seen[len(seen)-1], " "+what) {
			seen = append(seen, fmt.Sprintf("%.1fs %s", time.Since(killed).Seconds(), what))
		}
	}
	observe("connecting to " + others[0])
	c2 := connect(others[0])
	defer func() { _ = c2.Destroy() }()
	var task *a2a.Task
	err = Poll(ctx, 2*time.Minute, "GetTask of the cut stream's task through "+others[0], func(ctx context.Context) (bool, string, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		got, err := c2.GetTask(ctx, &a2a.GetTaskRequest{ID: ask.ID})
		if err != nil {
			observe(err.Error()) // 503 until the ring moves the caller off the deleted replica
			return false, err.Error(), nil
		}
		task = got
		observe(string(got.Status.State))
		return got.Status.State == a2a.TaskStateCompleted, string(got.Status.State), nil
	})
	t.Logf("GetTask through %s after the kill: %q", others[0], seen)
	if err != nil {
		t.Fatal(err)
	}
	var said []string
	for _, m := range task.History {
		said = append(said, string(m.Role)+": "+a2amqtt.TextOf(m))
	}
	user, agent := string(a2a.MessageRoleUser)+": ", string(a2a.MessageRoleAgent)+": "
	if !slices.Contains(said, user+"rotate the gateway logs") || !slices.Contains(said, user+"go ahead") ||
		!slices.Contains(said, agent+"Here's my plan: do rotate the gateway logs. Say 'go ahead' to proceed.") ||
		!strings.Contains(a2amqtt.TextOf(task.Status.Message), "rotate the gateway logs") {
		t.Fatalf("the task after the kill: %s %q, history %q: want completed with both turns and the question", task.Status.State, a2amqtt.TextOf(task.Status.Message), said)
	}
	t.Logf("GetTask through %s %.1fs after the kill: %s %q, history %q", others[0], time.Since(killed).Seconds(), task.Status.State, a2amqtt.TextOf(task.Status.Message), said)
}

// secondTaskRefused: while a task of contextID is working, a new task in the same context is
// refused by the governing policy's concurrent-call guard (maxConcurrentTasksPerContext: 1), the
// conversation service's -32061 concurrency_limit, whole, over HTTP (raw JSON-RPC: the HTTP
// caller sees the code and the error's name).
func secondTaskRefused(ctx context.Context, t *testing.T, rpc, token, contextID string) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "SendMessage",
		"params": userMessage(contextID, "", "and rotate the audit logs")})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, rpc, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }()
	raw, _ := io.ReadAll(res.Body)
	var out struct {
		Error *struct {
			Code int             `json:"code"`
			Data json.RawMessage `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || out.Error == nil || out.Error.Code != -32061 || !bytes.Contains(out.Error.Data, []byte(`"a2a_error":"concurrency_limit"`)) {
		t.Fatalf("a second task in a context with a working task: HTTP %d %s, want -32061 concurrency_limit", res.StatusCode, raw)
	}
	t.Logf("a second task in the context while one works: -32061 concurrency_limit over HTTP")
}
