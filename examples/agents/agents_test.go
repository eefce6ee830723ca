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

// TestConfirmAndMemoryMultiTurn: confirm declares the continuation extension, pauses with an
// approval hint and takes an approve or deny data part as well as "go ahead"; memory quotes
// earlier turns (evidence) and counts earlier answers (receipts), and pauses a reminder with a
// free-text hint.
func TestConfirmAndMemoryMultiTurn(t *testing.T) {
	b := brokertest.StartMochi(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: b.URL(), Agent: a2amqtt.AgentRef{Org: "demo", Unit: "default", Agent: "tester"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	req, err := a2amqtt.NewRequester(ctx, conn, a2amqtt.RequesterOptions{Retry: a2amqtt.RetryPolicy{FirstReplyTimeout: 5 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	confirm := a2amqtt.AgentRef{Org: "demo", Unit: "default", Agent: "confirm"}
	memory := a2amqtt.AgentRef{Org: "demo", Unit: "default", Agent: "memory"}
	for kind, ref := range map[Kind]a2amqtt.AgentRef{KindConfirm: confirm, KindMemory: memory} {
		a, err := Start(ctx, kind, Options{BrokerURL: b.URL(), Agent: ref})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close(context.Background())
	}
	card, _, err := req.ResolveCard(ctx, confirm, 2*time.Second)
	if err != nil || !a2amqtt.DeclaresExtension(card, a2amqtt.ContinuationExtensionURI) {
		t.Fatalf("confirm's card must declare the continuation extension: %+v %v", card, err)
	}
	state := func(res a2a.SendMessageResult) a2a.TaskState { return res.(*a2a.Task).Status.State }

	for _, tc := range []struct {
		name   string
		answer *a2a.Message
		want   a2a.TaskState
		text   string
	}{
		{"approve part", a2amqtt.ApprovalMessage(true, ""), a2a.TaskStateCompleted, "Done: do ship v2"},
		{"go ahead", a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("go ahead")), a2a.TaskStateCompleted, "Done: do ship v2"},
		{"deny part", a2amqtt.ApprovalMessage(false, "freeze week"), a2a.TaskStateCanceled, "Not done: do ship v2 (denied: freeze week)"},
	} {
		conv := a2amqtt.NewConversation(req.Transport(confirm))
		res, err := conv.Send(ctx, "ship v2")
		if err != nil || state(res) != a2a.TaskStateInputRequired {
			t.Fatalf("%s: first turn %v %+v", tc.name, err, res)
		}
		p, _ := conv.Pending()
		if p.Continuation == nil || *p.Continuation != ConfirmHint {
			t.Fatalf("%s: hint %+v", tc.name, p.Continuation)
		}
		// Text that is neither re-asks, with the hint again.
		res, err = conv.Send(ctx, "hmm")
		if p, _ := conv.Pending(); err != nil || state(res) != a2a.TaskStateInputRequired || p.Question != ConfirmReask || p.Continuation == nil {
			t.Fatalf("%s: re-ask %v %+v", tc.name, err, p)
		}
		res, err = conv.SendMessage(ctx, tc.answer)
		if err != nil || state(res) != tc.want || a2amqtt.ResultText(res) != tc.text {
			t.Fatalf("%s: answer → %v %s %q", tc.name, err, state(res), a2amqtt.ResultText(res))
		}
	}

	conv := a2amqtt.NewConversation(req.Transport(memory))
	for i, tc := range []struct{ say, want string }{
		{"I like tea", "Turn 1. You said \"I like tea\". This is the start of our conversation."},
		{"and cake", "Turn 2. You said \"and cake\". Earlier in this conversation you said: \"I like tea\". 1 earlier answer is on record."},
		{"remind me to call Bob", MemoryQuestion},
		{"tomorrow", "OK, I will remind you to call Bob tomorrow."},
		{"what now", "Turn 4. You said \"what now\". Earlier in this conversation you said: \"I like tea\", \"and cake\", \"remind me to call Bob\". 3 earlier answers are on record."},
	} {
		res, err := conv.Send(ctx, tc.say)
		if err != nil || a2amqtt.ResultText(res) != tc.want {
			t.Fatalf("memory turn %d: %v %q, want %q", i+1, err, a2amqtt.ResultText(res), tc.want)
		}
		if tc.want == MemoryQuestion {
			if p, _ := conv.Pending(); p.Continuation == nil || *p.Continuation != MemoryHint {
				t.Fatalf("reminder hint: %+v", p)
			}
		}
	}
}
