package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// TestUserStory08ThroughTheService runs the profile's user story 08 through the conversation
// service with an agent that is not built on the SDK (plain paho, hand-written JSON-RPC) and
// answers SendMessage the way the story has Agent B do: a stream of events (WORKING, an
// artifact, COMPLETED; WORKING, INPUT_REQUIRED when it asks), as it answers
// SendStreamingMessage. The requesters are plain paho (every event, in order, on the
// request's correlation) and the SDK. Every turn, with SendMessage and with
// SendStreamingMessage: follow-ups in one context, input-required and resume, the seed's
// failure cases (mismatched context -32602, unknown context, two concurrent tasks in one
// context, expired context), and replays of a finished stream dropped.
func TestUserStory08ThroughTheService(t *testing.T) {
	onBothBrokers(t, userStory08)
}

// storyEvent names one reply as the requester reads it: "status:TASK_STATE_WORKING",
// "artifact", "task:TASK_STATE_COMPLETED", "error:-32602".
func storyEvent(t testing.TB, p *paho.Publish) string {
	t.Helper()
	var env struct {
		Result *struct {
			StatusUpdate *struct {
				Status struct {
					State string `json:"state"`
				} `json:"status"`
			} `json:"statusUpdate"`
			ArtifactUpdate *struct {
				Artifact struct {
					Parts []struct {
						Text string `json:"text"`
					} `json:"parts"`
				} `json:"artifact"`
			} `json:"artifactUpdate"`
			Task *wireTask `json:"task"`
		} `json:"result"`
		Error *struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(p.Payload, &env); err != nil {
		t.Fatalf("reply %s: %v", p.Payload, err)
	}
	switch r := env.Result; {
	case env.Error != nil:
		return fmt.Sprintf("error:%d", env.Error.Code)
	case r == nil:
		return "empty"
	case r.StatusUpdate != nil:
		return "status:" + r.StatusUpdate.Status.State
	case r.ArtifactUpdate != nil:
		return "artifact"
	case r.Task != nil:
		return "task:" + r.Task.Status.State
	}
	return "other"
}

// storyCall sends method with a fresh correlation and returns the events that arrived once
// want of them did, plus whatever else arrived within settle after that (nothing may).
func storyCall(t testing.TB, ctx context.Context, rc *rawClient, method string, msg map[string]any, want int) []string {
	t.Helper()
	corr := []byte("s08-" + uuid.NewString())
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": "r-" + uuid.NewString(), "method": method, "params": map[string]any{"message": msg}})
	if err != nil {
		t.Fatal(err)
	}
	rc.publish(t, ctx, ref("story").RequestTopic(), rc.id.ReplyTopic("s08"), corr, nil, string(body))
	got := rc.wait(corr, want, 15*time.Second)
	if len(got) == want {
		// Nothing may follow the stream-final event.
		got = rc.wait(corr, want+1, 300*time.Millisecond)
	}
	events := make([]string, 0, len(got))
	for _, p := range got {
		events = append(events, storyEvent(t, p))
	}
	return events
}

var (
	storyDone   = []string{"status:TASK_STATE_WORKING", "artifact", "status:TASK_STATE_COMPLETED"}
	storyAsks   = []string{"status:TASK_STATE_WORKING", "status:TASK_STATE_INPUT_REQUIRED"}
	storyMethod = []string{a2amqtt.MethodSendMessage, a2amqtt.MethodSendStreamingMessage}
)

func userStory08(t *testing.T, kind string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st := newStack(t, ctx, kind)
	clk := &clock{}
	svc := st.startService(t, ctx, clk, "s08")
	agent := startRawAgent(t, ctx, st.addr, st.usernames["story"], st.passwords["story"], ref("story"), identity.DeliveryTopic(ref("story")), answersWithAStream)
	client := startRawClient(t, ctx, st, "client")
	sdk := st.requesterAs(t, ctx, "direct").Transport(ref("story"))
	expect := func(t *testing.T, what string, got, want []string) {
		t.Helper()
		if !slices.Equal(got, want) {
			t.Fatalf("%s: events %v, want %v", what, got, want)
		}
	}
	// Contexts left idle until the last subtest expires them.
	idle := map[string]string{}

	for _, method := range storyMethod {
		t.Run(method, func(t *testing.T) {
			c := uuid.NewString()
			first := uuid.NewString()
			t.Run("every event is relayed, the stream-final one last", func(t *testing.T) {
				expect(t, "turn 1", storyCall(t, ctx, client, method, userMessage(first, c, "hello"), 3), storyDone)
			})
			t.Run("follow-up in the same context", func(t *testing.T) {
				expect(t, "turn 2", storyCall(t, ctx, client, method, userMessage(uuid.NewString(), c, "and again"), 3), storyDone)
			})
			t.Run("input-required, then resume with a fresh request", func(t *testing.T) {
				task := uuid.NewString()
				expect(t, "ask", storyCall(t, ctx, client, method, userMessage(task, c, "ask me"), 2), storyAsks)
				expect(t, "resume", storyCall(t, ctx, client, method, userMessage(task, c, "tomorrow"), 3), storyDone)
			})
			t.Run("mismatched context id is -32602", func(t *testing.T) {
				expect(t, "hijack", storyCall(t, ctx, client, method, userMessage(first, uuid.NewString(), "hijack"), 1), []string{"error:-32602"})
			})
			t.Run("unknown context id starts a new context", func(t *testing.T) {
				expect(t, "new context", storyCall(t, ctx, client, method, userMessage(uuid.NewString(), uuid.NewString(), "hi"), 3), storyDone)
			})
			t.Run("two concurrent tasks in one context complete independently", func(t *testing.T) {
				shared := uuid.NewString()
				var wg sync.WaitGroup
				got := make([][]string, 2)
				for i := range got {
					wg.Go(func() {
						got[i] = storyCall(t, ctx, client, method, userMessage(uuid.NewString(), shared, fmt.Sprintf("slow T%d", 4+i)), 3)
					})
				}
				wg.Wait()
				for i := range got {
					expect(t, fmt.Sprintf("T%d", 4+i), got[i], storyDone)
				}
			})
			t.Run("a replay of a finished stream is dropped", func(t *testing.T) {
				dropped := counter(t, svc.Registry(), "a2a_conversation_replies_total", "outcome", "dropped_replay")
				n := agent.replayOf(first)
				if n != len(storyDone) {
					t.Fatalf("the agent sent %d replies for the first task, want %d", n, len(storyDone))
				}
				eventually(t, 10*time.Second, "replays dropped", func() error {
					if got := counter(t, svc.Registry(), "a2a_conversation_replies_total", "outcome", "dropped_replay"); got != dropped+float64(n) {
						return fmt.Errorf("dropped_replay %v, want %v", got, dropped+float64(n))
					}
					return nil
				})
			})
			old := uuid.NewString()
			expect(t, "a context to expire", storyCall(t, ctx, client, method, userMessage(uuid.NewString(), old, "soon idle"), 3), storyDone)
			idle[method] = old
		})
	}

	t.Run("SDK requester: SendMessage folds the stream into the completed task", func(t *testing.T) {
		res, err := send(ctx, sdk, uuid.NewString(), uuid.NewString(), "hi")
		task, ok := res.(*a2a.Task)
		if err != nil || !ok || task.Status.State != a2a.TaskStateCompleted {
			t.Fatalf("SendMessage: %v %T %v", err, res, state(res))
		}
		if len(task.Artifacts) != 1 || !strings.Contains(a2amqtt.ResultText(task), "echo: hi") {
			t.Fatalf("folded task: artifacts %d, text %q", len(task.Artifacts), a2amqtt.ResultText(task))
		}
	})
	t.Run("SDK requester: a conversation pauses and resumes", func(t *testing.T) {
		conv := a2amqtt.NewConversation(sdk)
		res, err := conv.Send(ctx, "ask me")
		if _, pending := conv.Pending(); err != nil || state(res) != a2a.TaskStateInputRequired || !pending {
			t.Fatalf("ask: %v %v", err, state(res))
		}
		res, err = conv.Send(ctx, "tomorrow")
		if err != nil || state(res) != a2a.TaskStateCompleted || len(conv.State().Tasks) != 1 {
			t.Fatalf("resume: %v %v tasks %v", err, state(res), conv.State().Tasks)
		}
		res, err = conv.Send(ctx, "next")
		if err != nil || state(res) != a2a.TaskStateCompleted || len(conv.State().Tasks) != 2 {
			t.Fatalf("follow-up: %v %v tasks %v", err, state(res), conv.State().Tasks)
		}
	})
	t.Run("SDK requester: SendStreamingMessage yields every event", func(t *testing.T) {
		var got []string
		for ev, err := range a2amqtt.NewConversation(sdk).Stream(ctx, a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("hi"))) {
			if err != nil {
				t.Fatal(err)
			}
			switch v := ev.(type) {
			case *a2a.TaskStatusUpdateEvent:
				got = append(got, "status:"+string(v.Status.State))
			case *a2a.TaskArtifactUpdateEvent:
				got = append(got, "artifact")
			default:
				got = append(got, fmt.Sprintf("%T", ev))
			}
		}
		want := []string{"status:" + string(a2a.TaskStateWorking), "artifact", "status:" + string(a2a.TaskStateCompleted)}
		if !slices.Equal(got, want) {
			t.Fatalf("events %v, want %v", got, want)
		}
	})

	t.Run("expired context is refused with the engine's error", func(t *testing.T) {
		clk.Advance(conversation.DefaultIdleTTL + time.Minute)
		for _, method := range storyMethod {
			got := storyCall(t, ctx, client, method, userMessage(uuid.NewString(), idle[method], "still there?"), 1)
			expect(t, method, got, []string{fmt.Sprintf("error:%d", conversation.CodeContextExpired)})
		}
	})
}
