package cluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// conversationsClient calls target from this machine as the console Agent with the SDK (GetTask,
// ListTasks: the conversation service answers them for governed agents from its store). It uses
// the console's client ID, like a2actl: close it before the next a2actl call.
func (b *bus) conversationsClient(ctx context.Context, t *testing.T, target string) *a2aclient.Client {
	t.Helper()
	read := func(key string) string {
		data, err := os.ReadFile(filepath.Join(b.console, key))
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	ref, err := a2amqtt.ParseAgentRef(target)
	if err != nil {
		t.Fatal(err)
	}
	c, err := a2amqtt.NewClient(ctx, a2amqtt.ClientConfig{
		Config: a2amqtt.Config{BrokerURL: b.broker, Username: read("username"), Password: read("password"),
			Agent: a2amqtt.AgentRef{Org: "acme", Unit: "demo", Agent: "console"}},
		Target: ref,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// storedConversation is what the service answers about one context: each task's state and the
// texts of its history, in order.
type storedConversation map[a2a.TaskID]string

func describeTask(task *a2a.Task) string {
	var texts []string
	for _, m := range task.History {
		for _, p := range m.Parts {
			if tp, ok := p.Content.(a2a.Text); ok {
				texts = append(texts, string(m.Role)+": "+string(tp))
			}
		}
	}
	return fmt.Sprintf("%s [%s]", task.Status.State, strings.Join(texts, " | "))
}

// readConversations asks the service (GetTask for each task, ListTasks for each context) what it
// holds about the given tasks of target, keyed by context.
func (b *bus) readConversations(ctx context.Context, t *testing.T, target string, tasks map[string][]a2a.TaskID) map[string]storedConversation {
	t.Helper()
	out := map[string]storedConversation{}
	err := Poll(ctx, 2*time.Minute, "GetTask and ListTasks answered for every conversation of "+target, func(ctx context.Context) (bool, string, error) {
		c := b.conversationsClient(ctx, t, target)
		defer c.Destroy()
		history := 100
		for contextID, ids := range tasks {
			got := storedConversation{}
			for _, id := range ids {
				task, err := c.GetTask(ctx, &a2a.GetTaskRequest{ID: id, HistoryLength: &history})
				if err != nil {
					return false, fmt.Sprintf("GetTask %s: %v", id, err), nil
				}
				if string(task.ContextID) != contextID {
					return false, "", fmt.Errorf("GetTask %s: context %s, want %s", id, task.ContextID, contextID)
				}
				got[id] = describeTask(task)
			}
			list, err := c.ListTasks(ctx, &a2a.ListTasksRequest{ContextID: contextID, HistoryLength: &history})
			if err != nil {
				return false, fmt.Sprintf("ListTasks %s: %v", contextID, err), nil
			}
			var listed []a2a.TaskID
			for _, task := range list.Tasks {
				listed = append(listed, task.ID)
				if want, ok := got[task.ID]; ok && describeTask(task) != want {
					return false, "", fmt.Errorf("ListTasks %s shows task %s as %s, GetTask as %s", contextID, task.ID, describeTask(task), want)
				}
			}
			for _, id := range ids {
				if !slices.Contains(listed, id) {
					return false, "", fmt.Errorf("ListTasks %s: task %s missing from %v", contextID, id, listed)
				}
			}
			out[contextID] = got
		}
		return true, "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// serviceStateSurvivesItsPod holds conversations through the service (the memory agent: two
// contexts of two turns; confirm: a task left waiting for input), reads them back with GetTask
// and ListTasks, deletes the service's pod, and checks that the new pod, on the same claim,
// answers the same for every task, that the memory agent still recalls an old context's first
// turn from its history, and that the waiting task resumes where it stopped.
func (b *bus) serviceStateSurvivesItsPod(ctx context.Context, t *testing.T) {
	const memory, confirm = "acme/demo/memory-agent", "acme/demo/confirm"
	memoryTasks, confirmTasks := map[string][]a2a.TaskID{}, map[string][]a2a.TaskID{}
	words := map[string]string{}
	for i := range 2 {
		word := fmt.Sprintf("heron-%d-%d", i, time.Now().UnixNano()%100000)
		task1, contextID, state, out := b.send(ctx, t, time.Minute, memory, "remember the word "+word)
		if state != "completed" {
			t.Fatalf("memory turn 1: want completed, got %s\n%s", state, out)
		}
		task2, _, state, out := b.send(ctx, t, time.Minute, memory, "what did I ask you to remember?", "--context-id", contextID)
		if state != "completed" || !strings.Contains(out, word) {
			t.Fatalf("memory turn 2 does not recall %q (state %s):\n%s", word, state, out)
		}
		memoryTasks[contextID] = []a2a.TaskID{a2a.TaskID(task1), a2a.TaskID(task2)}
		words[contextID] = word
	}
	waiting, waitingContext, state, out := b.send(ctx, t, time.Minute, confirm, "rename the archive bucket")
	if state != "input-required" {
		t.Fatalf("confirm turn 1: want input-required, got %s\n%s", state, out)
	}
	confirmTasks[waitingContext] = []a2a.TaskID{a2a.TaskID(waiting)}
	before := map[string]map[string]storedConversation{
		memory:  b.readConversations(ctx, t, memory, memoryTasks),
		confirm: b.readConversations(ctx, t, confirm, confirmTasks),
	}

	// The service may still be coming back to Ready from an earlier subtest's broker change.
	if err := env.WaitDeployments(ctx, Namespace, 2*time.Minute, "a2a-fleet-conversation-service"); err != nil {
		t.Fatal(err)
	}
	const selector = "app.kubernetes.io/name=conversation-service"
	pods, err := env.Pods(ctx, Namespace, selector)
	if err != nil || len(pods) != 1 {
		t.Fatalf("want 1 ready service pod, got %d (%v)", len(pods), err)
	}
	old := pods[0]
	claim := ""
	for _, v := range old.Spec.Volumes {
		if v.Name == "state" && v.PersistentVolumeClaim != nil {
			claim = v.PersistentVolumeClaim.ClaimName
		}
	}
	if claim == "" {
		t.Fatalf("the service's state volume is no PersistentVolumeClaim: %+v", old.Spec.Volumes)
	}
	start := time.Now()
	if err := env.Clientset.CoreV1().Pods(Namespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = Poll(ctx, 3*time.Minute, "a new service pod ready", func(ctx context.Context) (bool, string, error) {
		pods, err := env.Pods(ctx, Namespace, selector)
		if err != nil {
			return false, "", err
		}
		if len(pods) != 1 || pods[0].UID == old.UID {
			return false, fmt.Sprintf("%d ready pods", len(pods)), nil
		}
		return true, "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("service pod %s deleted; a new pod on the claim %s ready %.1fs later", old.Name, claim, time.Since(start).Seconds())

	after := map[string]map[string]storedConversation{
		memory:  b.readConversations(ctx, t, memory, memoryTasks),
		confirm: b.readConversations(ctx, t, confirm, confirmTasks),
	}
	n := 0
	for agent, contexts := range before {
		for contextID, tasks := range contexts {
			for id, want := range tasks {
				n++
				if got := after[agent][contextID][id]; got != want {
					t.Errorf("%s task %s (context %s) after the new pod: %s, before: %s", agent, id, contextID, got, want)
				}
			}
		}
	}
	if t.Failed() {
		return
	}
	t.Logf("the new pod answers GetTask and ListTasks for all %d tasks in %d contexts as the old one did", n, len(memoryTasks)+len(confirmTasks))
	for contextID, word := range words {
		_, _, state, out := b.send(ctx, t, time.Minute, memory, "what did I ask you to remember?", "--context-id", contextID)
		if state != "completed" || !strings.Contains(out, word) {
			t.Fatalf("after the new pod the memory agent does not recall %q from context %s (state %s):\n%s", word, contextID, state, out)
		}
	}
	task, contextID, state, out := b.send(ctx, t, time.Minute, confirm, "go ahead", "--approve", "--task-id", waiting, "--context-id", waitingContext)
	if task != waiting || contextID != waitingContext || state != "completed" || !strings.Contains(out, "rename the archive bucket") {
		t.Fatalf("after the new pod the waiting task %s does not resume: %s (%s) %s:\n%s", waiting, task, contextID, state, out)
	}
	t.Logf("after the new pod: the memory agent recalls both contexts' words, the waiting task completes")
}
