package agents

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

func TestExamplesServeOverMQTT(t *testing.T) {
	b := brokertest.StartMochi(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: b.URL(), Agent: a2amqtt.AgentRef{Org: "demo", Unit: "default", Agent: "tester"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	req, err := a2amqtt.NewRequester(ctx, conn, a2amqtt.RequesterOptions{Retry: a2amqtt.RetryPolicy{FirstReplyTimeout: 3 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	startOnce := map[a2amqtt.AgentRef]struct{}{}
	for _, tc := range []struct {
		kind  Kind
		say   string
		state a2a.TaskState
		want  string
	}{
		{KindEcho, "hi", a2a.TaskStateCompleted, "echo: hi"},
		{KindConfirm, "ship it", a2a.TaskStateInputRequired, ConfirmPrompt("do ship it")},
		{KindMemory, "hello", a2a.TaskStateCompleted, "This is the start of our conversation."},
		{KindMemory, "remind me to stretch", a2a.TaskStateInputRequired, MemoryQuestion},
	} {
		ref := a2amqtt.AgentRef{Org: "demo", Unit: "default", Agent: string(tc.kind)}
		if _, ok := startOnce[ref]; !ok {
			a, err := Start(ctx, tc.kind, Options{BrokerURL: b.URL(), Agent: ref})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close(context.Background())
			startOnce[ref] = struct{}{}
		}
		card, pres, err := req.ResolveCard(ctx, ref, 2*time.Second)
		if err != nil || pres.Status != a2amqtt.StatusOnline || len(card.Skills) != 1 || card.Skills[0].ID != string(tc.kind) {
			t.Fatalf("%s card: %+v %+v %v", tc.kind, card, pres, err)
		}
		res, err := req.Transport(ref).SendMessage(ctx, nil, &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(tc.say))})
		if err != nil {
			t.Fatalf("%s: %v", tc.kind, err)
		}
		task := res.(*a2a.Task)
		if task.Status.State != tc.state || !strings.Contains(a2amqtt.TextOf(task.Status.Message), tc.want) {
			t.Fatalf("%s: %s %q, want %s %q", tc.kind, task.Status.State, a2amqtt.TextOf(task.Status.Message), tc.state, tc.want)
		}
	}
	if _, err := Executor("nope", 0); err == nil {
		t.Fatal("unknown kind accepted")
	}
}
