package a2amqtt

import (
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// TestSendMessageAnsweredWithAStream: the requester's SendMessage folds a stream of events from
// an agent that is not built on the SDK (brokertest.ServeUserStory: plain paho) into the task, and returns at the stream-final event
// (COMPLETED, or INPUT_REQUIRED), not at the first one.
func TestSendMessageAnsweredWithAStream(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		brokertest.ServeUserStory(t, brokertest.MustDial(t, b.Addr(), brokertest.Options{ClientID: agentB.ClientID()}), agentB.RequestTopic())
		r := requesterT(t, b, agentA, nil)
		conv := NewConversation(r.Transport(agentB))
		ctx := ctxT(t, 20*time.Second)

		res, err := conv.Send(ctx, "hello")
		task, ok := res.(*a2a.Task)
		if err != nil || !ok || task.Status.State != a2a.TaskStateCompleted {
			t.Fatalf("SendMessage: %v %T %+v", err, res, res)
		}
		if len(task.Artifacts) != 1 || ResultText(task) != "echo: hello" {
			t.Fatalf("folded task: %d artifacts, text %q", len(task.Artifacts), ResultText(task))
		}

		res, err = conv.Send(ctx, "ask me")
		if _, pending := conv.Pending(); err != nil || !pending || res.(*a2a.Task).Status.State != a2a.TaskStateInputRequired {
			t.Fatalf("ask: %v %+v", err, res)
		}
		res, err = conv.Send(ctx, "tomorrow")
		if err != nil || res.(*a2a.Task).Status.State != a2a.TaskStateCompleted || ResultText(res) != "echo: tomorrow" {
			t.Fatalf("resume: %v %+v", err, res)
		}
		if tasks := conv.State().Tasks; len(tasks) != 2 {
			t.Fatalf("tasks %v: the resume must reuse the waiting task", tasks)
		}
	})
}
