package a2amqtt

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

var (
	agentB    = AgentRef{Org: "acme", Unit: "ops", Agent: "agent-b"}
	agentA    = AgentRef{Org: "acme", Unit: "ops", Agent: "agent-a"}
	stockOpts = []a2aclient.FactoryOption{a2aclient.WithDefaultsDisabled()}
)

// stockClient builds an unmodified a2aclient.Client over the MQTT transport
// from the agent's card, as any a2a-go user would.
func stockClient(t *testing.T, r *Requester, ref AgentRef) *a2aclient.Client {
	t.Helper()
	c, err := a2aclient.NewFromCard(ctxT(t, 5*time.Second), testCard(ref), append(stockOpts, WithMQTTTransport(r))...)
	if err != nil {
		t.Fatalf("a2aclient.NewFromCard: %v", err)
	}
	return c
}

func TestSendMessageAndTaskMethods(t *testing.T) {
	forEachMode(t, func(t *testing.T, b brokertest.Broker, mode func(*ResponderOptions)) {
		serveT(t, b, agentB, echoExec(), mode)
		client := stockClient(t, requesterT(t, b, agentA, nil), agentB)
		ctx := ctxT(t, 20*time.Second)

		res, err := client.SendMessage(ctx, userText("hello"))
		if err != nil {
			t.Fatalf("SendMessage: %v", err)
		}
		task, ok := res.(*a2a.Task)
		if !ok {
			t.Fatalf("result %T, want *a2a.Task", res)
		}
		if task.Status.State != a2a.TaskStateCompleted || messageText(task.Status.Message) != "echo: hello" {
			t.Fatalf("task status %+v", task.Status)
		}
		if v, err := uuid.Parse(string(task.ID)); err != nil || v.Version() != 4 {
			t.Fatalf("task id %q is not a requester-generated UUIDv4", task.ID)
		}
		if len(task.Artifacts) != 1 || task.Artifacts[0].Parts[0].Text() != "echo: hello" {
			t.Fatalf("artifacts %+v", task.Artifacts)
		}

		got, err := client.GetTask(ctx, &a2a.GetTaskRequest{ID: task.ID})
		if err != nil || got.ID != task.ID || got.ContextID != task.ContextID || got.Status.State != a2a.TaskStateCompleted {
			t.Fatalf("GetTask: %+v %v", got, err)
		}
		list, err := client.ListTasks(ctx, &a2a.ListTasksRequest{ContextID: task.ContextID})
		if err != nil || len(list.Tasks) != 1 || list.Tasks[0].ID != task.ID {
			t.Fatalf("ListTasks: %+v %v", list, err)
		}
		_, err = client.GetTask(ctx, &a2a.GetTaskRequest{ID: a2a.TaskID(uuid.NewString())})
		if !errors.Is(err, a2a.ErrTaskNotFound) {
			t.Fatalf("GetTask unknown: want ErrTaskNotFound, got %v", err)
		}
		_, err = client.CancelTask(ctx, &a2a.CancelTaskRequest{ID: task.ID})
		if !errors.Is(err, a2a.ErrTaskNotCancelable) {
			t.Fatalf("CancelTask on completed task: want ErrTaskNotCancelable, got %v", err)
		}
		if _, err := client.CreateTaskPushConfig(ctx, &a2a.PushConfig{TaskID: task.ID}); !errors.Is(err, a2a.ErrPushNotificationNotSupported) {
			t.Fatalf("push config: %v", err)
		}
	})
}

func TestSendStreamingMessage(t *testing.T) {
	forEachMode(t, func(t *testing.T, b brokertest.Broker, mode func(*ResponderOptions)) {
		serveT(t, b, agentB, echoExec(), mode)
		client := stockClient(t, requesterT(t, b, agentA, nil), agentB)
		var kinds []string
		var last a2a.Event
		for ev, err := range client.SendStreamingMessage(ctxT(t, 20*time.Second), userText("stream me")) {
			if err != nil {
				t.Fatalf("stream: %v", err)
			}
			switch v := ev.(type) {
			case *a2a.TaskStatusUpdateEvent:
				kinds = append(kinds, "status:"+string(v.Status.State))
			case *a2a.TaskArtifactUpdateEvent:
				kinds = append(kinds, "artifact:"+v.Artifact.Parts[0].Text())
			default:
				kinds = append(kinds, "other")
			}
			last = ev
		}
		want := []string{"status:TASK_STATE_WORKING", "artifact:echo: stream me", "status:TASK_STATE_COMPLETED"}
		if len(kinds) != len(want) {
			t.Fatalf("events %v, want %v", kinds, want)
		}
		for i := range want {
			if kinds[i] != want[i] {
				t.Fatalf("events %v, want %v", kinds, want)
			}
		}
		if !isStreamFinal(last) {
			t.Fatal("stream did not end on a final event")
		}
	})
}

// TestNewClientOneCall covers the convenience constructor.
func TestNewClientOneCall(t *testing.T) {
	b := brokertest.StartMochi(t)
	serveT(t, b, agentB, echoExec(), nil)
	ctx := ctxT(t, 10*time.Second)
	client, err := NewClient(ctx, ClientConfig{
		Config:           Config{BrokerURL: b.URL(), Agent: AgentRef{Org: "acme", Unit: "ops", Agent: "cli"}, Logger: testLogger(t)},
		RequesterOptions: RequesterOptions{Retry: fastRetry},
		Target:           agentB,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Destroy()
	res, err := client.SendMessage(ctx, userText("one call"))
	if err != nil {
		t.Fatal(err)
	}
	if task := res.(*a2a.Task); messageText(task.Status.Message) != "echo: one call" {
		t.Fatalf("got %+v", task.Status)
	}
}

var _ a2asrv.AgentExecutor = (*scriptExec)(nil)

func init() { _ = context.Background }

// TestBareMessageAnswer: an executor that answers with a plain Message (as
// many a2a-go samples do) completes the requester's task with it instead of
// failing it.
func TestBareMessageAnswer(t *testing.T) {
	forEachMode(t, func(t *testing.T, b brokertest.Broker, mode func(*ResponderOptions)) {
		exec := &scriptExec{fn: func(_ context.Context, ec *a2asrv.ExecutorContext, yield func(a2a.Event, error) bool) {
			yield(a2a.NewMessage(a2a.MessageRoleAgent, a2a.NewTextPart("just a message")), nil)
		}}
		serveT(t, b, agentB, exec, mode)
		tr := requesterT(t, b, agentA, nil).Transport(agentB)
		res, err := tr.SendMessage(ctxT(t, 5*time.Second), nil, userText("hi"))
		if err != nil {
			t.Fatal(err)
		}
		task, ok := res.(*a2a.Task)
		if !ok || task.Status.State != a2a.TaskStateCompleted || messageText(task.Status.Message) != "just a message" {
			t.Fatalf("got %T %+v", res, res)
		}
		got, err := tr.GetTask(ctxT(t, 5*time.Second), nil, &a2a.GetTaskRequest{ID: task.ID})
		if err != nil || got.Status.State != a2a.TaskStateCompleted {
			t.Fatalf("stored task: %+v %v", got, err)
		}
	})
}
