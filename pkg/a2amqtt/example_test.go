package a2amqtt_test

import (
	"context"
	"fmt"
	"iter"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// greeter answers every message with a completed task whose status message greets the text.
type greeter struct{}

func (greeter) Execute(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		reply := a2a.NewMessage(a2a.MessageRoleAgent, a2a.NewTextPart("hello, "+a2amqtt.TextOf(ec.Message)))
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, reply), nil)
	}
}

func (greeter) Cancel(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, nil), nil)
	}
}

// An agent serves an a2asrv.AgentExecutor on its request topic, and a requester sends it a
// message through an a2aclient.Transport. The broker here is an embedded one in this process;
// any MQTT v5 broker works (mqtt:// or mqtts:// with TLSFiles).
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	broker, err := brokertest.NewMochi()
	if err != nil {
		panic(err)
	}
	defer broker.Stop()

	// The agent: one connection per identity, a responder for its executor.
	agent := a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "greeter"}
	agentConn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: broker.URL(), Agent: agent})
	if err != nil {
		panic(err)
	}
	defer func() { _ = agentConn.Close(ctx) }()
	if _, err := a2amqtt.NewResponder(ctx, agentConn, a2amqtt.ResponderOptions{Executor: greeter{}}); err != nil {
		panic(err)
	}

	// The requester: its own identity, a transport to the agent.
	me := a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "planner"}
	conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: broker.URL(), Agent: me})
	if err != nil {
		panic(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	req, err := a2amqtt.NewRequester(ctx, conn, a2amqtt.RequesterOptions{})
	if err != nil {
		panic(err)
	}
	res, err := req.Transport(agent).SendMessage(ctx, nil, &a2a.SendMessageRequest{
		Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("world")),
	})
	if err != nil {
		panic(err)
	}
	task := res.(*a2a.Task)
	fmt.Println(task.Status.State, a2amqtt.TextOf(task.Status.Message))
	// Output: TASK_STATE_COMPLETED hello, world
}
