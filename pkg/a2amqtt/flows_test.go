package a2amqtt_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

var (
	bRef = a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "agent-b"}
	aRef = a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "agent-a"}
	fast = a2amqtt.RetryPolicy{FirstReplyTimeout: 2 * time.Second, StreamIdleTimeout: 3 * time.Second, MaxAttempts: 2, BackoffBase: 50 * time.Millisecond}
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func tctx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// forEachMode runs fn on both brokers with both responder handlers.
func forEachMode(t *testing.T, fn func(t *testing.T, b brokertest.Broker, direct bool)) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		for _, direct := range []bool{false, true} {
			name := "a2a-go-handler"
			if direct {
				name = "direct-handler"
			}
			t.Run(name, func(t *testing.T) { fn(t, b, direct) })
		}
	})
}

func startAgent(t *testing.T, b brokertest.Broker, kind agents.Kind, ref a2amqtt.AgentRef, delay time.Duration, pools ...string) *agents.Agent {
	return startAgentMode(t, b, kind, ref, delay, false, pools...)
}

func startAgentMode(t *testing.T, b brokertest.Broker, kind agents.Kind, ref a2amqtt.AgentRef, delay time.Duration, direct bool, pools ...string) *agents.Agent {
	t.Helper()
	a, err := agents.Start(tctx(t, 10*time.Second), kind, agents.Options{BrokerURL: b.URL(), Agent: ref, Logger: quiet(), Delay: delay, Pools: pools, ReferenceHandler: !direct})
	if err != nil {
		t.Fatalf("start %s agent: %v", kind, err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
	return a
}

func newRequester(t *testing.T, b brokertest.Broker, ref a2amqtt.AgentRef) *a2amqtt.Requester {
	t.Helper()
	conn, err := a2amqtt.Connect(tctx(t, 10*time.Second), a2amqtt.Config{BrokerURL: b.URL(), Agent: ref, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	r, err := a2amqtt.NewRequester(tctx(t, 5*time.Second), conn, a2amqtt.RequesterOptions{Retry: fast})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// wire records every request published to the agent (a passive subscriber
// with its own identity), to check Correlation Data and user properties.
type wire struct {
	mu  sync.Mutex
	got []*paho.Publish
}

func tap(t *testing.T, b brokertest.Broker, filter string) *wire {
	t.Helper()
	w := &wire{}
	conn, err := a2amqtt.Connect(tctx(t, 10*time.Second), a2amqtt.Config{BrokerURL: b.URL(), Agent: a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "tap-" + uuid.NewString()[:8]}, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	if _, err := conn.Subscribe(tctx(t, 5*time.Second), filter, func(p *paho.Publish) {
		w.mu.Lock()
		w.got = append(w.got, p)
		w.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	return w
}

type wireReq struct {
	topic, corr, method, taskID, contextID, ctxProp string
}

func (w *wire) requests() []wireReq {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []wireReq
	for _, p := range w.got {
		var env struct {
			Method string `json:"method"`
			Params struct {
				ID      string `json:"id"`
				Message struct {
					TaskID    string `json:"taskId"`
					ContextID string `json:"contextId"`
				} `json:"message"`
			} `json:"params"`
		}
		_ = json.Unmarshal(p.Payload, &env)
		task := env.Params.Message.TaskID
		if task == "" {
			task = env.Params.ID
		}
		out = append(out, wireReq{topic: p.Topic, corr: string(p.Properties.CorrelationData), method: env.Method,
			taskID: task, contextID: env.Params.Message.ContextID, ctxProp: p.Properties.User.Get(a2amqtt.PropContextID)})
	}
	return out
}

func (w *wire) waitFor(t *testing.T, n int) []wireReq {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if r := w.requests(); len(r) >= n {
			return r
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("tap saw %d requests, want %d", len(w.requests()), n)
	return nil
}

func asTask(t *testing.T, res a2a.SendMessageResult) *a2a.Task {
	t.Helper()
	task, ok := res.(*a2a.Task)
	if !ok {
		t.Fatalf("result %T, want *a2a.Task", res)
	}
	return task
}

// TestSeed000MultiTurn runs every flow of user story 08 (seed 000) against
// the memory agent.
func TestSeed000MultiTurn(t *testing.T) {
	forEachMode(t, func(t *testing.T, b brokertest.Broker, direct bool) {
		startAgentMode(t, b, agents.KindMemory, bRef, 0, direct)
		w := tap(t, b, bRef.RequestTopic())
		tr := newRequester(t, b, aRef).Transport(bRef)
		ctx := tctx(t, 30*time.Second)
		conv := a2amqtt.NewConversation(tr)
		if _, err := uuid.Parse(conv.ContextID()); err != nil {
			t.Fatalf("context id %q is not a UUID", conv.ContextID())
		}

		t1 := seed000TwoTurns(t, ctx, conv)
		conv, t3 := seed000InterruptedTask(t, ctx, tr, conv)
		seed000Correlations(t, w, conv, t3)
		seed000Failures(t, ctx, tr, t1)
	})
}

// seed000TwoTurns: turn 1 opens context C with task T1; turn 2 is a new task in C whose answer
// uses turn 1. It returns T1.
func seed000TwoTurns(t *testing.T, ctx context.Context, conv *a2amqtt.Conversation) *a2a.Task {
	t.Helper()
	// Turn 1: new context C, new task T1.
	res, err := conv.Send(ctx, "My name is Ada")
	if err != nil {
		t.Fatal(err)
	}
	t1 := asTask(t, res)
	if t1.ContextID != conv.ContextID() || t1.Status.State != a2a.TaskStateCompleted || !strings.Contains(a2amqtt.ResultText(t1), "start of our conversation") {
		t.Fatalf("turn 1: %+v %q", t1.Status.State, a2amqtt.ResultText(t1))
	}

	// Turn 2: new task T2 in C; the answer uses turn 1.
	res, err = conv.Send(ctx, "What is my name?")
	if err != nil {
		t.Fatal(err)
	}
	t2 := asTask(t, res)
	if t2.ID == t1.ID || t2.ContextID != t1.ContextID {
		t.Fatalf("turn 2 must be a new task in the same context: t1=%s t2=%s ctx %s/%s", t1.ID, t2.ID, t1.ContextID, t2.ContextID)
	}
	if ans := a2amqtt.ResultText(t2); !strings.Contains(ans, `"My name is Ada"`) || !strings.Contains(ans, "Turn 2") {
		t.Fatalf("turn 2 answer ignores turn 1: %q", ans)
	}
	return t1
}

// seed000InterruptedTask: task T3 streams partial results, stops at input-required
// (stream-final), and is resumed with the same Task.id and context and fresh Correlation Data,
// after the conversation was saved and loaded again. It returns the resumed conversation and T3.
func seed000InterruptedTask(t *testing.T, ctx context.Context, tr *a2amqtt.Transport, conv *a2amqtt.Conversation) (*a2amqtt.Conversation, *a2a.Task) {
	t.Helper()

	// Interrupted task T3: streams partial results, stops at
	// input-required (stream-final), resumed with the same Task.id and
	// context and fresh Correlation Data.
	var states []a2a.TaskState
	for ev, err := range conv.Stream(ctx, a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("remind me to call Bob"))) {
		if err != nil {
			t.Fatal(err)
		}
		if su, ok := ev.(*a2a.TaskStatusUpdateEvent); ok {
			states = append(states, su.Status.State)
		}
	}
	if len(states) != 2 || states[0] != a2a.TaskStateWorking || states[1] != a2a.TaskStateInputRequired {
		t.Fatalf("T3 stream states %v, want [working input-required]", states)
	}
	pending, ok := conv.Pending()
	if !ok || pending.Question != agents.MemoryQuestion || pending.State != a2a.TaskStateInputRequired {
		t.Fatalf("pending %+v %v", pending, ok)
	}
	// Persist and reload the conversation between the question and the
	// answer, as a CLI would across runs.
	path := filepath.Join(t.TempDir(), "conv.json")
	if err := conv.SaveFile(path); err != nil {
		t.Fatal(err)
	}
	st, err := a2amqtt.LoadConversationFile(path)
	if err != nil {
		t.Fatal(err)
	}
	conv, err = a2amqtt.ResumeConversation(tr, st)
	if err != nil {
		t.Fatal(err)
	}
	res, err := conv.Send(ctx, "tomorrow at 9")
	if err != nil {
		t.Fatal(err)
	}
	t3 := asTask(t, res)
	if t3.ID != pending.TaskID || t3.Status.State != a2a.TaskStateCompleted || !strings.Contains(a2amqtt.ResultText(t3), "to call Bob tomorrow at 9") {
		t.Fatalf("resume: id %s (want %s) state %s text %q", t3.ID, pending.TaskID, t3.Status.State, a2amqtt.ResultText(t3))
	}
	if _, ok := conv.Pending(); ok {
		t.Fatal("pending task not cleared after completion")
	}
	return conv, t3
}

// seed000Correlations: every request had its own Correlation Data and the conversation's
// context; T3 was published twice (question, resume).
func seed000Correlations(t *testing.T, w *wire, conv *a2amqtt.Conversation, t3 *a2a.Task) {
	t.Helper()
	reqs := w.waitFor(t, 4)
	seen := map[string]bool{}
	var t3corrs []string
	for _, r := range reqs {
		if seen[r.corr] {
			t.Fatalf("Correlation Data reused across requests: %+v", reqs)
		}
		seen[r.corr] = true
		if r.contextID != conv.ContextID() || r.ctxProp != conv.ContextID() {
			t.Fatalf("request without the conversation context (payload %q, a2a-context-id %q)", r.contextID, r.ctxProp)
		}
		if r.taskID == string(t3.ID) {
			t3corrs = append(t3corrs, r.corr)
		}
	}
	if len(t3corrs) != 2 {
		t.Fatalf("T3 should have been published twice (question, resume) with fresh correlation, got %d", len(t3corrs))
	}
}

// seed000Failures: a mismatched context, a message to a terminal task, an unknown context.
func seed000Failures(t *testing.T, ctx context.Context, tr *a2amqtt.Transport, t1 *a2a.Task) {
	t.Helper()

	// Failure case: mismatched context for an existing task → -32602.
	bad := &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("hijack"))}
	bad.Message.TaskID, bad.Message.ContextID = t1.ID, uuid.NewString()
	_, err := tr.SendMessage(ctx, nil, bad)
	var rpcErr *a2amqtt.RPCError
	if !errors.As(err, &rpcErr) || rpcErr.Code != -32602 || !errors.Is(err, a2a.ErrInvalidParams) {
		t.Fatalf("mismatched context: want -32602, got %v", err)
	}

	// Failure case: a message to a terminal task → UnsupportedOperation
	// (A2A v1.0 -32004, without the binding's a2a_error).
	again := &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("more"))}
	again.Message.TaskID, again.Message.ContextID = t1.ID, t1.ContextID
	_, err = tr.SendMessage(ctx, nil, again)
	if !errors.As(err, &rpcErr) || !errors.Is(err, a2a.ErrUnsupportedOperation) || rpcErr.A2AError() != "" || rpcErr.Retryable() {
		t.Fatalf("terminal task: want UnsupportedOperation, got %v", err)
	}

	// Failure case: unknown context → a new context, no error.
	fresh := a2amqtt.NewConversation(tr)
	res, err := fresh.Send(ctx, "hello again")
	if err != nil {
		t.Fatalf("unknown context must start a new one: %v", err)
	}
	if ans := a2amqtt.ResultText(res); !strings.Contains(ans, "start of our conversation") || strings.Contains(ans, "Ada") {
		t.Fatalf("new context leaked memory: %q", ans)
	}
}

// TestSeed000ConcurrentTasks: T4 and T5 in flight at once in one context
// complete independently, each on its own correlation.
func TestSeed000ConcurrentTasks(t *testing.T) {
	forEachMode(t, func(t *testing.T, b brokertest.Broker, direct bool) {
		// Each turn takes turnTime at the agent: run one after the other they take twice that,
		// run concurrently once plus the overhead, which the bound below leaves room for on a
		// loaded machine (seen: 550 ms of overhead at load 18 with 500 ms turns).
		const turnTime = 1500 * time.Millisecond
		startAgentMode(t, b, agents.KindEcho, bRef, turnTime, direct)
		w := tap(t, b, bRef.RequestTopic())
		tr := newRequester(t, b, aRef).Transport(bRef)
		ctx := tctx(t, 20*time.Second)
		contextID := uuid.NewString()
		var wg sync.WaitGroup
		results := make([]*a2a.Task, 2)
		errs := make([]error, 2)
		start := time.Now()
		for i, text := range []string{"T4", "T5"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text))}
				req.Message.ContextID = contextID
				res, err := tr.SendMessage(ctx, nil, req)
				errs[i] = err
				if err == nil {
					results[i], _ = res.(*a2a.Task)
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(start)
		for i, text := range []string{"T4", "T5"} {
			if errs[i] != nil || results[i] == nil {
				t.Fatalf("%s: %v", text, errs[i])
			}
			if results[i].ContextID != contextID || a2amqtt.ResultText(results[i]) != "echo: "+text {
				t.Fatalf("%s: got %q in %s", text, a2amqtt.ResultText(results[i]), results[i].ContextID)
			}
		}
		if results[0].ID == results[1].ID {
			t.Fatal("concurrent turns share a task id")
		}
		// Sequential execution would take >= 2 x turnTime.
		if elapsed >= 2*turnTime-300*time.Millisecond {
			t.Fatalf("T4/T5 ran one after the other (%s); they must run concurrently", elapsed)
		}
		reqs := w.waitFor(t, 2)
		if reqs[0].corr == reqs[1].corr {
			t.Fatal("T4 and T5 used the same Correlation Data")
		}
	})
}

// TestSeed001Confirmation: plan → input-required → re-ask → "go ahead" →
// completed → further messages refused.
func TestSeed001Confirmation(t *testing.T) {
	forEachMode(t, func(t *testing.T, b brokertest.Broker, direct bool) {
		startAgentMode(t, b, agents.KindConfirm, bRef, 0, direct)
		conv := a2amqtt.NewConversation(newRequester(t, b, aRef).Transport(bRef))
		ctx := tctx(t, 20*time.Second)
		steps := []struct {
			say   string
			state a2a.TaskState
			text  string
		}{
			{"deploy v2", a2a.TaskStateInputRequired, agents.ConfirmPrompt("do deploy v2")},
			{"hmm, not sure", a2a.TaskStateInputRequired, agents.ConfirmReask},
			{"OK, go ahead", a2a.TaskStateCompleted, "Done: do deploy v2"},
		}
		var taskID a2a.TaskID
		for i, s := range steps {
			res, err := conv.Send(ctx, s.say)
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			task := asTask(t, res)
			if i == 0 {
				taskID = task.ID
			} else if task.ID != taskID {
				t.Fatalf("step %d continued task %s, want %s", i, task.ID, taskID)
			}
			if task.Status.State != s.state || a2amqtt.TextOf(task.Status.Message) != s.text {
				t.Fatalf("step %d: %s %q, want %s %q", i, task.Status.State, a2amqtt.TextOf(task.Status.Message), s.state, s.text)
			}
		}
		req := &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("go ahead"))}
		req.Message.TaskID, req.Message.ContextID = taskID, conv.ContextID()
		if _, err := conv.State(), error(nil); err != nil {
			t.Fatal(err)
		}
		tr := newRequester(t, b, a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "other"}).Transport(bRef)
		if _, err := tr.SendMessage(ctx, nil, req); !errors.Is(err, a2a.ErrUnsupportedOperation) {
			t.Fatalf("message to completed task: want UnsupportedOperation, got %v", err)
		}
	})
}

// TestPoolDispatch: two responders share a pool; each pooled reply names
// its responder and follow-ups go to that responder's direct topic.
func TestPoolDispatch(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		p1 := a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "worker-1"}
		p2 := a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "worker-2"}
		startAgent(t, b, agents.KindEcho, p1, 0, "workers")
		startAgent(t, b, agents.KindEcho, p2, 0, "workers")
		r := newRequester(t, b, aRef)
		pool := a2amqtt.PoolRef{Org: "acme", Unit: "ops", Pool: "workers"}
		tr := r.PoolTransport(pool)
		ctx := tctx(t, 30*time.Second)
		if b.Name() == "mosquitto" {
			// Mosquitto 2.0.11 (Debian bookworm) never delivers topics that
			// start with '$' to shared subscriptions: the pooled publish is
			// acknowledged with 0x10 "no matching subscribers". The SDK must
			// surface that as a clear error instead of waiting for a reply.
			// See docs/protocol.md, "Broker notes".
			_, err := tr.SendMessage(ctx, nil, userText("job"))
			if !errors.Is(err, a2amqtt.ErrNoSubscribers) {
				t.Fatalf("pooled send on mosquitto: want ErrNoSubscribers (broker limitation), got %v", err)
			}
			return
		}
		w := tap(t, b, "$a2a/v1/request/acme/ops/#")
		used := map[string]int{}
		var last *a2a.Task
		for i := 0; i < 16; i++ {
			res, err := tr.SendMessage(ctx, nil, userText("job"))
			if err != nil {
				t.Fatalf("pooled send %d: %v", i, err)
			}
			last = asTask(t, res)
			who, ok := r.ResponderFor(last.ID)
			if !ok || (who != p1.Agent && who != p2.Agent) {
				t.Fatalf("pooled reply without a pool member's a2a-responder-agent-id: %q", who)
			}
			used[who]++
		}
		if len(used) != 2 {
			t.Fatalf("shared subscription used %v; want both pool members", used)
		}
		who, _ := r.ResponderFor(last.ID)
		got, err := tr.GetTask(ctx, nil, &a2a.GetTaskRequest{ID: last.ID})
		if err != nil || got.ID != last.ID {
			t.Fatalf("follow-up GetTask: %v", err)
		}
		reqs := w.waitFor(t, 17)
		follow := reqs[len(reqs)-1]
		want := a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: who}.RequestTopic()
		if follow.method != a2amqtt.MethodGetTask || follow.topic != want {
			t.Fatalf("follow-up went to %s (%s), want direct topic %s", follow.topic, follow.method, want)
		}
		for _, rq := range reqs[:16] {
			if rq.topic != pool.RequestTopic() {
				t.Fatalf("pooled request published to %s, want %s", rq.topic, pool.RequestTopic())
			}
		}
	})
}

// TestPresenceLifecycle: online card on connect, LWT (offline/lwt) when the
// connection dies without DISCONNECT, online again on reconnect, and
// offline/agent on graceful close.
func TestPresenceLifecycle(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		conn, err := a2amqtt.Connect(tctx(t, 10*time.Second), a2amqtt.Config{BrokerURL: b.URL(), Agent: aRef, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		dir, err := a2amqtt.NewDirectory(tctx(t, 5*time.Second), conn, a2amqtt.DirectoryFilter("acme"))
		if err != nil {
			t.Fatal(err)
		}
		waitStatus := func(status, source string) {
			t.Helper()
			err := dir.Wait(tctx(t, 5*time.Second), func(d *a2amqtt.Directory) bool {
				e, ok := d.Get(bRef)
				return ok && e.Presence.Status == status && e.Presence.Source == source && e.Card != nil
			})
			if err != nil {
				e, _ := dir.Get(bRef)
				t.Fatalf("waiting for %s/%s: %v (entry %+v)", status, source, err, e)
			}
		}
		a := startAgent(t, b, agents.KindEcho, bRef, 0)
		waitStatus(a2amqtt.StatusOnline, a2amqtt.SourceAgent)
		if e, _ := dir.Get(bRef); e.Card.Name != bRef.Agent || len(e.Card.SupportedInterfaces) == 0 {
			t.Fatalf("card %+v", e.Card)
		}
		card, pres, err := a2amqtt.ResolveCard(tctx(t, 5*time.Second), conn, bRef, time.Second)
		if err != nil || card.Name != bRef.Agent || pres.Status != a2amqtt.StatusOnline {
			t.Fatalf("ResolveCard: %+v %+v %v", card, pres, err)
		}

		a.Conn.Abort() // network loss: no DISCONNECT, the broker fires the LWT
		waitStatus(a2amqtt.StatusOffline, a2amqtt.SourceLWT)

		a2 := startAgent(t, b, agents.KindEcho, bRef, 0)
		waitStatus(a2amqtt.StatusOnline, a2amqtt.SourceAgent)
		if err := a2.Close(tctx(t, 5*time.Second)); err != nil {
			t.Fatal(err)
		}
		waitStatus(a2amqtt.StatusOffline, a2amqtt.SourceAgent)

		if _, _, err := a2amqtt.ResolveCard(tctx(t, 5*time.Second), conn, a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "ghost"}, 300*time.Millisecond); !errors.Is(err, a2amqtt.ErrAgentNotFound) {
			t.Fatalf("unknown agent: %v", err)
		}
	})
}

func userText(s string) *a2a.SendMessageRequest {
	return &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(s))}
}

// TestBrokerOutage restarts Mosquitto under a connected requester and
// responder: both reconnect, resubscribe and republish presence, and the
// next request succeeds. A request made during the outage fails cleanly.
func TestBrokerOutage(t *testing.T) {
	m := brokertest.StartMosquitto(t, brokertest.MosquittoOptions{})
	startAgent(t, m, agents.KindEcho, bRef, 0)
	conn, err := a2amqtt.Connect(tctx(t, 10*time.Second), a2amqtt.Config{BrokerURL: m.URL(), Agent: aRef, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	req, err := a2amqtt.NewRequester(tctx(t, 5*time.Second), conn, a2amqtt.RequesterOptions{
		Retry: a2amqtt.RetryPolicy{FirstReplyTimeout: 400 * time.Millisecond, MaxAttempts: 2, BackoffBase: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	tr := req.Transport(bRef)
	if _, err := tr.SendMessage(tctx(t, 5*time.Second), nil, userText("before")); err != nil {
		t.Fatal(err)
	}
	m.Stop()
	if _, err := tr.SendMessage(tctx(t, 5*time.Second), nil, userText("during")); err == nil {
		t.Fatal("request during the outage succeeded")
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	// Persistence is off, so the restarted broker lost the retained card:
	// the agent's reconnect must republish it.
	dir, err := a2amqtt.NewDirectory(tctx(t, 10*time.Second), conn, a2amqtt.DirectoryFilter("acme"))
	if err != nil {
		t.Fatalf("directory after restart: %v", err)
	}
	if err := dir.Wait(tctx(t, 10*time.Second), func(d *a2amqtt.Directory) bool {
		e, ok := d.Get(bRef)
		return ok && e.Online()
	}); err != nil {
		t.Fatalf("agent did not republish its online card after the broker restart: %v", err)
	}
	var lastErr error
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		res, err := tr.SendMessage(tctx(t, 5*time.Second), nil, userText("after"))
		if err == nil {
			if got := a2amqtt.ResultText(res); got != "echo: after" {
				t.Fatalf("after restart: %q", got)
			}
			return
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("no successful request after the broker restart: %v", lastErr)
}
