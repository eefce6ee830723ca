package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"
	"github.com/go-logr/logr/testr"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

var gatedNames = []string{"acme/sales/confirm", "acme/sales/guarded", "acme/sales/memory", "acme/sales/raw", "acme/sales/story"}

// startService runs a replica in process on a bolt store (no fsync) in a
// temp dir.
func (st *stack) startService(t testing.TB, ctx context.Context, clk *clock, replica string) *convservice.Service {
	return st.startServiceWith(t, ctx, clk, replica, true)
}

func (st *stack) startServiceWith(t testing.TB, ctx context.Context, clk *clock, replica string, noSync bool) *convservice.Service {
	t.Helper()
	return st.startServiceCfg(t, ctx, clk, replica, func(c *convservice.Config) { c.BoltNoSync = noSync })
}

// startServiceCfg starts an in-process replica on a bolt store in a temp dir,
// with the test's settings changed by edit.
func (st *stack) startServiceCfg(t testing.TB, ctx context.Context, clk *clock, replica string, edit func(*convservice.Config)) *convservice.Service {
	t.Helper()
	cfg := convservice.Config{
		BrokerURL: st.brokerURL, Username: st.svcUser, Password: st.svcPass, ReplicaID: replica,
		Store: "bolt:" + filepath.Join(t.TempDir(), "state.db"), BoltNoSync: true,
		RestConfig: restCfg, Namespace: st.ns, Now: clk.Now,
		SweepInterval: 50 * time.Millisecond, ResyncInterval: 500 * time.Millisecond, StatsInterval: 200 * time.Millisecond,
		Logger: serviceLogger(t),
		// One requester drives back-to-back turns, faster than any caller's rate limit allows
		// (test/security tests the limit).
		CallerRate: -1,
	}
	if edit != nil {
		edit(&cfg)
	}
	svc, err := convservice.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start conversation service: %v", err)
	}
	t.Cleanup(func() { _ = svc.Close() })
	eventually(t, 30*time.Second, "service consumes every gated agent", func() error {
		if got := svc.GatedAgents(); !slices.Equal(got, gatedNames) {
			return fmt.Errorf("gated agents %v, want %v", got, gatedNames)
		}
		return nil
	})
	return svc
}

// serviceLogger shows the service's logs with E2E_SERVICE_LOGS=1.
func serviceLogger(t testing.TB) logrLogger {
	if tt, ok := t.(*testing.T); ok && os.Getenv("E2E_SERVICE_LOGS") == "1" {
		return testr.NewWithOptions(tt, testr.Options{Verbosity: 1})
	}
	return logrLogger{}
}

func rpcCode(err error) (int, string) {
	var e *a2amqtt.RPCError
	if errors.As(err, &e) {
		return e.Code, e.A2AError()
	}
	return 0, ""
}

func state(res a2a.SendMessageResult) a2a.TaskState {
	if t, ok := res.(*a2a.Task); ok {
		return t.Status.State
	}
	if _, ok := res.(*a2a.Message); ok {
		return a2a.TaskStateCompleted
	}
	return a2a.TaskStateUnspecified
}

func send(ctx context.Context, tr *a2amqtt.Transport, taskID, contextID, text string) (a2a.SendMessageResult, error) {
	msg := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text))
	msg.TaskID, msg.ContextID = a2a.TaskID(taskID), contextID
	return tr.SendMessage(ctx, nil, &a2a.SendMessageRequest{Message: msg})
}

func TestSeedFlowsThroughTheService(t *testing.T) {
	onBothBrokers(t, seedFlows)
}

func seedFlows(t *testing.T, kind string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st := newStack(t, ctx, kind)
	clk := &clock{}
	svc := st.startService(t, ctx, clk, "r1")
	memoryConn := startSDKAgent(t, ctx, st, agents.KindMemory, "memory", 100*time.Millisecond)
	startSDKAgent(t, ctx, st, agents.KindConfirm, "confirm", 0)
	startRawAgent(t, ctx, st.addr, st.usernames["raw"], st.passwords["raw"], ref("raw"), identity.DeliveryTopic(ref("raw")))
	startRawAgent(t, ctx, st.addr, st.usernames["guarded"], st.passwords["guarded"], ref("guarded"), identity.DeliveryTopic(ref("guarded")))
	r := st.requester(t, ctx)
	memory, confirm, raw, guarded := r.Transport(ref("memory")), r.Transport(ref("confirm")), r.Transport(ref("raw")), r.Transport(ref("guarded"))

	conv := a2amqtt.NewConversation(memory)
	t.Run("turn 1 starts a context", func(t *testing.T) {
		res, err := conv.Send(ctx, "I like tea")
		if err != nil || state(res) != a2a.TaskStateCompleted || !strings.Contains(a2amqtt.ResultText(res), "Turn 1.") {
			t.Fatalf("turn 1: %v %v %q", err, state(res), a2amqtt.ResultText(res))
		}
	})
	t.Run("turn 2 in the same context sees the prior turn", func(t *testing.T) {
		res, err := conv.Send(ctx, "and coffee")
		if err != nil || !containsAll(a2amqtt.ResultText(res), "Turn 2.", `"I like tea"`) {
			t.Fatalf("turn 2: %v %q", err, a2amqtt.ResultText(res))
		}
		// The agent reads the context's prior turns from the service (it may
		// ask only about its own conversations) ...
		agentSide, err := a2amqtt.NewRequester(ctx, memoryConn, a2amqtt.RequesterOptions{})
		if err != nil {
			t.Fatal(err)
		}
		list, err := agentSide.Transport(identity.Service).ListTasks(ctx, nil, &a2a.ListTasksRequest{ContextID: conv.ContextID()})
		if err != nil || len(list.Tasks) != 2 || list.Tasks[0].Status.State != a2a.TaskStateCompleted || string(list.Tasks[1].ID) != string(conv.State().Tasks[0]) {
			t.Fatalf("agent's ListTasks: %v %+v", err, list)
		}
		task, err := agentSide.Transport(identity.Service).GetTask(ctx, nil, &a2a.GetTaskRequest{ID: conv.State().Tasks[1]})
		if err != nil || task.ContextID != conv.ContextID() || task.Status.State != a2a.TaskStateCompleted {
			t.Fatalf("agent's GetTask: %v %+v", err, task)
		}
		// ... and so may the requester, for the contexts it opened (params.tenant names the agent;
		// the operator grants callers of gated agents the service's request topic).
		mine, err := r.Transport(identity.Service).GetTask(ctx, nil, &a2a.GetTaskRequest{Tenant: "acme/sales/memory", ID: conv.State().Tasks[1]})
		if err != nil || mine.ContextID != conv.ContextID() {
			t.Fatalf("requester's GetTask of its own context: %v %+v", err, mine)
		}
	})
	t.Run("input-required, then resume with the same task id and fresh correlation", func(t *testing.T) {
		res, err := conv.Send(ctx, "remind me to call mom")
		p, pending := conv.Pending()
		if err != nil || state(res) != a2a.TaskStateInputRequired || !pending || p.Question != agents.MemoryQuestion {
			t.Fatalf("interrupt: %v %v %+v", err, state(res), p)
		}
		res, err = conv.Send(ctx, "tomorrow")
		if err != nil || state(res) != a2a.TaskStateCompleted || !strings.Contains(a2amqtt.ResultText(res), "call mom tomorrow") {
			t.Fatalf("resume: %v %v %q", err, state(res), a2amqtt.ResultText(res))
		}
		if tasks := conv.State().Tasks; tasks[len(tasks)-1] != p.TaskID {
			t.Fatalf("resume used task %s, want %s", tasks[len(tasks)-1], p.TaskID)
		}
	})
	t.Run("mismatched context id is -32602", func(t *testing.T) {
		_, err := send(ctx, memory, string(conv.State().Tasks[0]), uuid.NewString(), "hijack")
		if code, _ := rpcCode(err); code != -32602 {
			t.Fatalf("got %v (code %d), want -32602", err, code)
		}
	})
	t.Run("unknown context id starts a new context", func(t *testing.T) {
		res, err := a2amqtt.NewConversation(memory).Send(ctx, "hello")
		if err != nil || !strings.Contains(a2amqtt.ResultText(res), "Turn 1.") {
			t.Fatalf("new context: %v %q", err, a2amqtt.ResultText(res))
		}
	})
	t.Run("concurrent tasks T4 and T5 in one context complete independently", func(t *testing.T) {
		c := uuid.NewString()
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range 2 {
			wg.Go(func() {
				res, err := send(ctx, memory, uuid.NewString(), c, fmt.Sprintf("T%d", 4+i))
				if err == nil && state(res) != a2a.TaskStateCompleted {
					err = fmt.Errorf("state %s", state(res))
				}
				errs[i] = err
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("seed 001 confirmation loop", func(t *testing.T) {
		cc := a2amqtt.NewConversation(confirm)
		res, err := cc.Send(ctx, "deploy v2")
		if err != nil || state(res) != a2a.TaskStateInputRequired || !strings.Contains(a2amqtt.ResultText(res), "go ahead") {
			t.Fatalf("plan: %v %v %q", err, state(res), a2amqtt.ResultText(res))
		}
		// The agent declared expected_input approval (continuation hint): through the service an
		// answer that is neither approve nor deny is refused before it reaches the agent, and the
		// task still waits (seed 001's "re-ask" is what the agent does when reached directly).
		if _, err = cc.Send(ctx, "hmm, not sure"); !errors.Is(err, a2amqtt.ErrContinuationMismatch) {
			t.Fatalf("an answer without approve/deny: want continuation_mismatch, got %v", err)
		}
		if p, ok := cc.Pending(); !ok || p.Continuation == nil || p.Continuation.ExpectedInput != a2amqtt.ExpectApproval {
			t.Fatalf("the task must still wait for an approval: %+v %v", p, ok)
		}
		// "go ahead" as a2actl chat sends it: the text and the approve data part.
		msg := a2amqtt.ApprovalMessage(true, "")
		msg.Parts = append(a2a.ContentParts{a2a.NewTextPart("go ahead")}, msg.Parts[1:]...)
		if res, err = cc.SendMessage(ctx, msg); err != nil || state(res) != a2a.TaskStateCompleted || len(cc.State().Tasks) != 1 {
			t.Fatalf("confirm: %v %v tasks=%v", err, state(res), cc.State().Tasks)
		}
	})
	t.Run("plain-paho agent streams through the service", func(t *testing.T) {
		var states []a2a.TaskState
		for ev, err := range a2amqtt.NewConversation(raw).Stream(ctx, a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("hi"))) {
			if err != nil {
				t.Fatal(err)
			}
			if u, ok := ev.(*a2a.TaskStatusUpdateEvent); ok {
				states = append(states, u.Status.State)
			}
		}
		if !slices.Equal(states, []a2a.TaskState{a2a.TaskStateWorking, a2a.TaskStateCompleted}) {
			t.Fatalf("states %v", states)
		}
	})
	t.Run("concurrency guard refuses a second working task", func(t *testing.T) {
		c := uuid.NewString()
		done := make(chan error, 1)
		go func() { _, err := send(ctx, guarded, uuid.NewString(), c, "slow"); done <- err }()
		time.Sleep(100 * time.Millisecond)
		_, err := send(ctx, guarded, uuid.NewString(), c, "second")
		if code, reason := rpcCode(err); code != conversation.CodeConcurrencyLimit || reason != conversation.A2AErrorConcurrencyLimit {
			t.Fatalf("got %v, want the concurrency limit error", err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("follow-up right after completion is never refused (1000x, limit 1)", func(t *testing.T) {
		c := uuid.NewString()
		start := time.Now()
		for i := range 1000 {
			res, err := send(ctx, guarded, uuid.NewString(), c, "go")
			if err != nil || state(res) != a2a.TaskStateCompleted {
				t.Fatalf("repetition %d: %v %v", i, err, state(res))
			}
		}
		t.Logf("1000 back-to-back turns in one context in %s", time.Since(start).Round(time.Millisecond))
	})
	t.Run("direct publish to the delivery topic is refused", func(t *testing.T) {
		_, err := r.Conn().Publish(ctx, &paho.Publish{Topic: identity.DeliveryTopic(ref("raw")), QoS: 1, Payload: []byte("{}")})
		if err == nil {
			t.Fatal("the broker accepted a publish that bypasses the service")
		}
	})
	t.Run("policy change applies without restart: input-required timeout", func(t *testing.T) {
		pol := &unstructuredPolicy{name: "governed", ns: st.ns}
		pol.patch(t, ctx, `{"spec":{"inputRequiredTimeout":"1m"}}`)
		eventually(t, 20*time.Second, "input-required task failed by the timeout", func() error {
			cc := a2amqtt.NewConversation(raw)
			if res, err := cc.Send(ctx, "ask me"); err != nil || state(res) != a2a.TaskStateInputRequired {
				return fmt.Errorf("ask: %v %v", err, state(res))
			}
			clk.Advance(2 * time.Minute)
			time.Sleep(200 * time.Millisecond)
			_, err := cc.Send(ctx, "answer")
			if code, _ := rpcCode(err); code != -32004 || !strings.Contains(err.Error(), "input-required timeout") {
				return fmt.Errorf("resume after timeout: %v", err)
			}
			return nil
		})
	})
	t.Run("expired context is refused with the engine's error", func(t *testing.T) {
		clk.Advance(conversation.DefaultIdleTTL + time.Minute)
		_, err := conv.Send(ctx, "still there?")
		if code, reason := rpcCode(err); code != conversation.CodeContextExpired || reason != conversation.A2AErrorContextExpired {
			t.Fatalf("got %v, want context_expired", err)
		}
	})
	t.Run("metrics", func(t *testing.T) {
		mfs, err := svc.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, mf := range mfs {
			seen[mf.GetName()] = true
		}
		for _, name := range []string{"a2a_conversation_rejections_total", "a2a_conversation_proxy_latency_seconds", "a2a_conversation_requests_total"} {
			if !seen[name] {
				t.Errorf("metric %s missing", name)
			}
		}
	})
}
