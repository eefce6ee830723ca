package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// storyAgent is a governed Agent without a workload: its responder is not built on the SDK and
// runs on this machine (brokertest.ServeUserStory, plain paho), as a new user's own agent would.
const storyAgent = `apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata:
  name: story
  namespace: default
  labels:
    a2a.fleet.dev/conversations: governed
spec:
  orgID: acme
  unitID: demo
  card:
    name: User story agent
    description: Answers SendMessage with a stream of events, as the A2A-over-MQTT profile's user story 08 has Agent B do.
  callers:
    scope: SameUnit
`

// userStory08 runs the profile's user story 08 on the install: an agent on plain paho answers
// SendMessage with WORKING, an artifact and COMPLETED (or WORKING and INPUT_REQUIRED when asked
// to ask), governed by the samples' ConversationPolicy. a2actl (the SDK) holds a conversation
// with it through the conversation service (a turn, input-required, the resume in the same
// task), and a plain-paho requester sees every event of a SendMessage and nothing after the
// stream-final one.
func (b *bus) userStory08(ctx context.Context, t *testing.T) {
	manifest := filepath.Join(t.TempDir(), "story.yaml")
	if err := os.WriteFile(manifest, []byte(storyAgent), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := env.KubectlRun(ctx, "apply", "--server-side", "-f", manifest); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = env.KubectlRun(context.Background(), "delete", "--ignore-not-found", "-f", manifest) })
	agents, err := env.WaitAgents(ctx, samplesNamespace, 2*time.Minute, false, "story")
	if err != nil {
		t.Fatal(err)
	}
	story := agents[0]
	if story.Status.Topics == nil || story.Status.Topics.Delivery == "" {
		t.Fatalf("the governed Agent has no delivery topic: %+v", story.Status.Topics)
	}
	creds := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: samplesNamespace, Name: story.Status.CredentialsSecret}, creds); err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(b.broker, "mqtt://")
	agent := brokertest.MustDial(t, addr, brokertest.Options{ClientID: a2amqtt.AgentRef{Org: "acme", Unit: "demo", Agent: "story"}.ClientID(),
		Username: string(creds.Data["username"]), Password: string(creds.Data["password"])})
	brokertest.ServeUserStory(t, agent, story.Status.Topics.Delivery)
	if _, err := env.WaitAgents(ctx, samplesNamespace, time.Minute, true, "story"); err != nil {
		t.Fatal(err)
	}

	_, contextID, state, out := b.send(ctx, t, time.Minute, "acme/demo/story", "hello")
	if state != "completed" || !strings.Contains(out, "echo: hello") {
		t.Fatalf("turn 1: want completed with the artifact, got %s:\n%s", state, out)
	}
	task, _, state, out := b.send(ctx, t, time.Minute, "acme/demo/story", "ask me", "--context-id", contextID)
	if state != "input-required" {
		t.Fatalf("turn 2: want input-required, got %s:\n%s", state, out)
	}
	task2, _, state, out := b.send(ctx, t, time.Minute, "acme/demo/story", "tomorrow", "--task-id", task, "--context-id", contextID)
	if task2 != task || state != "completed" || !strings.Contains(out, "echo: tomorrow") {
		t.Fatalf("resume: want task %s completed, got %s %s:\n%s", task, task2, state, out)
	}
	t.Logf("a2actl: a turn, input-required and the resume, through the service")

	console := a2amqtt.AgentRef{Org: "acme", Unit: "demo", Agent: "console"}
	user, pass, err := b.consoleCredentials()
	if err != nil {
		t.Fatal(err)
	}
	requester := brokertest.MustDial(t, addr, brokertest.Options{ClientID: console.ClientID(), Username: user, Password: pass})
	reply := console.ReplyTopic("story-" + uuid.NewString()[:8])
	if rc := requester.Subscribe(reply); rc >= 0x80 {
		t.Fatalf("subscribe %s: %#x", reply, rc)
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": map[string]any{"message": map[string]any{
		"messageId": uuid.NewString(), "taskId": uuid.NewString(), "contextId": uuid.NewString(), "role": "ROLE_USER",
		"parts": []any{map[string]any{"text": "every event"}}}}})
	if _, err := requester.PublishWith(&paho.Publish{Topic: a2amqtt.AgentRef{Org: "acme", Unit: "demo", Agent: "story"}.RequestTopic(), QoS: 1, Payload: body,
		Properties: &paho.PublishProperties{ResponseTopic: reply, CorrelationData: []byte("story-1"), ContentType: "application/json"}}); err != nil {
		t.Fatal(err)
	}
	var events []string
	for range 3 {
		p, err := requester.Next(30 * time.Second)
		if err != nil {
			t.Fatalf("after %v: %v", events, err)
		}
		events = append(events, replyKind(p.Payload))
	}
	want := []string{"statusUpdate:TASK_STATE_WORKING", "artifactUpdate", "statusUpdate:TASK_STATE_COMPLETED"}
	if fmt.Sprint(events) != fmt.Sprint(want) {
		t.Fatalf("SendMessage's events %v, want %v", events, want)
	}
	requester.ExpectNothing(500 * time.Millisecond)
	t.Logf("plain-paho requester: SendMessage answered with %v through the service", events)
}

// consoleCredentials reads the console's username and password from the files a2actl uses.
func (b *bus) consoleCredentials() (string, string, error) {
	user, err := os.ReadFile(filepath.Join(b.console, "username"))
	if err != nil {
		return "", "", err
	}
	pass, err := os.ReadFile(filepath.Join(b.console, "password"))
	return string(user), string(pass), err
}

// replyKind names one JSON-RPC reply: "statusUpdate:STATE", "artifactUpdate", "task:STATE",
// "error:CODE".
func replyKind(payload []byte) string {
	var env struct {
		Result map[string]struct {
			Status struct {
				State string `json:"state"`
			} `json:"status"`
		} `json:"result"`
		Error *struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(payload, &env); err != nil {
		return "undecodable: " + string(payload)
	}
	if env.Error != nil {
		return fmt.Sprintf("error:%d", env.Error.Code)
	}
	for k, v := range env.Result {
		if v.Status.State != "" {
			return k + ":" + v.Status.State
		}
		return k
	}
	return "empty"
}
