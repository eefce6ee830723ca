package a2amqtt

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// coreStyleServer answers SendStreamingMessage the way core A2A servers (the A2A JS SDK's
// DefaultRequestHandler) do, on raw paho: every stream opens with a Task snapshot; a new task
// then stops at input-required ("which version?"); on a resume the opening snapshot still shows
// input-required, and working and completed follow.
func coreStyleServer(t *testing.T, b brokertest.Broker, ref AgentRef) {
	t.Helper()
	conn := connectT(t, b, ref, nil)
	var mu sync.Mutex
	tasks := map[a2a.TaskID]*a2a.Task{}
	if _, err := conn.Subscribe(ctxT(t, 5*time.Second), ref.RequestTopic(), func(p *paho.Publish) {
		var env struct {
			ID     string                 `json:"id"`
			Params a2a.SendMessageRequest `json:"params"`
		}
		if err := json.Unmarshal(p.Payload, &env); err != nil || env.Params.Message == nil {
			t.Errorf("core-style server: undecodable request %s", p.Payload)
			return
		}
		msg := env.Params.Message
		mu.Lock()
		task := tasks[msg.TaskID]
		if task == nil {
			task = &a2a.Task{ID: msg.TaskID, ContextID: msg.ContextID, Status: a2a.TaskStatus{State: a2a.TaskStateSubmitted}}
			tasks[msg.TaskID] = task
		}
		task.History = append(task.History, msg)
		opening := *task
		resume := task.Status.State == a2a.TaskStateInputRequired
		events := []a2a.Event{&opening}
		status := func(s a2a.TaskState, text string) {
			task.Status = a2a.TaskStatus{State: s, Message: a2a.NewMessageForTask(a2a.MessageRoleAgent, task, a2a.NewTextPart(text))}
			events = append(events, &a2a.TaskStatusUpdateEvent{TaskID: task.ID, ContextID: task.ContextID, Status: task.Status})
		}
		if resume {
			status(a2a.TaskStateWorking, "deploying "+messageText(msg))
			status(a2a.TaskStateCompleted, "deployed "+messageText(msg))
		} else {
			status(a2a.TaskStateInputRequired, "which version?")
		}
		mu.Unlock()
		respTo, corr := p.Properties.ResponseTopic, p.Properties.CorrelationData
		go func() {
			// Not bound to the test: the last PUBACK may arrive after the test has its answer.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			for _, ev := range events {
				body, _ := json.Marshal(rpcResult{JSONRPC: "2.0", ID: env.ID, Result: a2a.StreamResponse{Event: ev}})
				_, _ = conn.Publish(ctx, &paho.Publish{Topic: respTo, QoS: 1, Payload: body, Properties: &paho.PublishProperties{CorrelationData: corr}})
			}
		}()
	}); err != nil {
		t.Fatal(err)
	}
}

// converse runs two streamed turns (a question, then the answer) and returns the states seen
// in the second one.
func converse(t *testing.T, tr *Transport) []a2a.TaskState {
	t.Helper()
	conv := NewConversation(tr)
	ctx := ctxT(t, 15*time.Second)
	var states []a2a.TaskState
	turn := func(text string) {
		states = nil
		for ev, err := range conv.Stream(ctx, a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text))) {
			if err != nil {
				t.Fatalf("turn %q: %v", text, err)
			}
			switch v := ev.(type) {
			case *a2a.Task:
				states = append(states, v.Status.State)
			case *a2a.TaskStatusUpdateEvent:
				states = append(states, v.Status.State)
			}
		}
	}
	start := time.Now()
	turn("deploy")
	if p, ok := conv.Pending(); !ok || p.Question != "which version?" {
		t.Fatalf("first turn: pending %+v %v, states %v", p, ok, states)
	}
	turn("v3")
	if _, ok := conv.Pending(); ok {
		t.Fatalf("conversation still pending after the resumed turn; states %v", states)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("turns took %s: a stream ended by its idle timeout, not by its final event", d)
	}
	return states
}

var resumeRetry = RetryPolicy{FirstReplyTimeout: 5 * time.Second, StreamIdleTimeout: 20 * time.Second, MaxAttempts: 1}

// TestResumeStreamOpensWithTask (issue 12 item 6): the opening Task event of a resumed stream
// (still input-required, as core A2A servers send it) does not end the stream: the requester
// also gets working and completed, and the conversation is no longer pending.
func TestResumeStreamOpensWithTask(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		coreStyleServer(t, b, agentB)
		tr := requesterT(t, b, agentA, func(o *RequesterOptions) { o.Retry = resumeRetry }).Transport(agentB)
		states := converse(t, tr)
		want := []a2a.TaskState{a2a.TaskStateInputRequired, a2a.TaskStateWorking, a2a.TaskStateCompleted}
		if len(states) != len(want) || states[0] != want[0] || states[1] != want[1] || states[2] != want[2] {
			t.Fatalf("resumed stream states %v, want %v", states, want)
		}
	})
}

// TestDirectHandlerExecutorOpensWithTask: the SDK's direct handler treats an executor that
// opens each run with a Task snapshot (the core A2A habit) the same way.
func TestDirectHandlerExecutorOpensWithTask(t *testing.T) {
	b := brokertest.StartMochi(t)
	serveT(t, b, agentB, &scriptExec{fn: func(_ context.Context, ec *a2asrv.ExecutorContext, yield func(a2a.Event, error) bool) {
		snapshot := *ec.StoredTask
		if !yield(&snapshot, nil) {
			return
		}
		if snapshot.Status.State != a2a.TaskStateInputRequired {
			yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateInputRequired, a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart("which version?"))), nil)
			return
		}
		if !yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateWorking, nil), nil) {
			return
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, nil), nil)
	}}, nil)
	tr := requesterT(t, b, agentA, func(o *RequesterOptions) { o.Retry = resumeRetry }).Transport(agentB)
	if states := converse(t, tr); states[len(states)-1] != a2a.TaskStateCompleted {
		t.Fatalf("resumed run states %v", states)
	}
}

// TestDeferredArtifactSaves: the direct handler persists artifact updates in batches, but never
// more than artifactSaveInterval behind what it streamed, also when the executor stalls after
// them, and completely before the final status goes out.
func TestDeferredArtifactSaves(t *testing.T) {
	b := brokertest.StartMochi(t)
	release := make(chan struct{})
	const chunks = 50
	serveT(t, b, agentB, &scriptExec{fn: func(ctx context.Context, ec *a2asrv.ExecutorContext, yield func(a2a.Event, error) bool) {
		art := a2a.NewArtifactEvent(ec, a2a.NewTextPart("c"))
		for i := 0; i < chunks; i++ {
			ev := a2a.NewArtifactUpdateEvent(ec, art.Artifact.ID, a2a.NewTextPart("c"))
			ev.Append = i > 0
			if !yield(ev, nil) {
				return
			}
		}
		select { // stall, as a slow model would
		case <-release:
		case <-ctx.Done():
			return
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, nil), nil)
	}}, nil)
	tr := requesterT(t, b, agentA, func(o *RequesterOptions) { o.Retry = resumeRetry }).Transport(agentB)
	other := requesterT(t, b, AgentRef{Org: "acme", Unit: "ops", Agent: "observer"}, nil).Transport(agentB)
	ctx := ctxT(t, 20*time.Second)
	parts := func(task *a2a.Task) int {
		if len(task.Artifacts) == 0 {
			return 0
		}
		return len(task.Artifacts[0].Parts)
	}
	var taskID a2a.TaskID
	seen := 0
	for ev, err := range tr.SendStreamingMessage(ctx, nil, userText("stream")) {
		if err != nil {
			t.Fatal(err)
		}
		if a, ok := ev.(*a2a.TaskArtifactUpdateEvent); ok {
			taskID = a.TaskID
			if seen++; seen == chunks {
				// Every chunk streamed; the executor now stalls. The store catches up within
				// the save interval.
				deadline := time.Now().Add(5 * time.Second)
				for {
					got, gerr := other.GetTask(ctx, nil, &a2a.GetTaskRequest{ID: taskID})
					if gerr == nil && parts(got) == chunks {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("stored task still behind the stream during a stall: %v parts, %v", parts(got), gerr)
					}
					time.Sleep(20 * time.Millisecond)
				}
				close(release)
			}
		}
	}
	got, err := other.GetTask(ctx, nil, &a2a.GetTaskRequest{ID: taskID})
	if err != nil || got.Status.State != a2a.TaskStateCompleted || parts(got) != chunks {
		t.Fatalf("final stored task: %v parts, state %v, %v", parts(got), got.Status.State, err)
	}
}
