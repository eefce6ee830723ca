package gateway

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	"github.com/google/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

// codeConcurrencyLimit is the conversation service's refusal of a task beyond
// maxConcurrentTasksPerContext (docs/conversation-service.md).
const codeConcurrencyLimit = -32061

// gate is an agent that holds every task whose text starts with "hold" until released, and
// answers any other at once: while it holds two tasks of one context, both are working at the
// agent at the same time. The same executor runs behind a2a-go's HTTP server (an HTTP agent)
// and behind the SDK's responder (an MQTT agent).
type gate struct {
	arrived chan a2a.TaskID // the agent's own id of each held task, as it arrives
	release chan struct{}
	once    sync.Once
}

func newGate() *gate {
	return &gate{arrived: make(chan a2a.TaskID, 16), release: make(chan struct{})}
}

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

func (g *gate) Execute(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		text := a2amqtt.TextOf(ec.Message)
		if !yield(a2a.NewSubmittedTask(ec, ec.Message), nil) {
			return
		}
		if strings.HasPrefix(text, "hold") {
			g.arrived <- ec.TaskID
			select {
			case <-g.release:
			case <-ctx.Done():
				yield(nil, ctx.Err())
				return
			}
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart("done: "+text))), nil)
	}
}

func (g *gate) Cancel(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, nil), nil)
	}
}

// startHTTPGate serves a gate with a2a-go's own handler and JSON-RPC server on loopback.
func startHTTPGate(t testing.TB) (*gate, string) {
	t.Helper()
	g := newGate()
	mux := http.NewServeMux()
	mux.Handle("/", a2asrv.NewJSONRPCHandler(a2asrv.NewHandler(g)))
	mux.Handle("GET /.well-known/agent-card.json", a2asrv.NewStaticAgentCardHandler(plannerCard))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Cleanup(g.open) // before srv.Close (cleanups run last first): no request stays held
	return g, srv.URL + "/"
}

// startMQTTGate runs a gate with the SDK's responder as the governed MQTT agent name.
func (st *stack) startMQTTGate(t testing.TB, ctx context.Context, name string) *gate {
	t.Helper()
	g := newGate()
	conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: st.brokerURL, Username: st.usernames[name], Password: st.passwords[name], Agent: ref(name)})
	if err != nil {
		t.Fatalf("connect %s: %v", name, err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	resp, err := a2amqtt.NewResponder(ctx, conn, a2amqtt.ResponderOptions{Executor: g, RequestTopic: identity.DeliveryTopic(ref(name))})
	if err != nil {
		t.Fatalf("responder %s: %v", name, err)
	}
	t.Cleanup(func() { _ = resp.Close(context.Background()) })
	t.Cleanup(g.open)
	return g
}

// allowConcurrentTasks sets the governed agents' maxConcurrentTasksPerContext (the stack's
// policy sets none).
func (st *stack) allowConcurrentTasks(t testing.TB, ctx context.Context, n int32) {
	t.Helper()
	pol := &a2av1.ConversationPolicy{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: st.ns, Name: "governed"}, pol); err != nil {
		t.Fatal(err)
	}
	pol.Spec.MaxConcurrentTasksPerContext = n
	if err := k8s.Update(ctx, pol); err != nil {
		t.Fatalf("policy: %v", err)
	}
}

// awaitHeld waits until the gate holds n tasks and returns their (agent's) ids.
func awaitHeld(t testing.TB, ctx context.Context, g *gate, n int) []a2a.TaskID {
	t.Helper()
	var ids []a2a.TaskID
	deadline := time.After(30 * time.Second)
	for len(ids) < n {
		select {
		case id := <-g.arrived:
			ids = append(ids, id)
		case <-deadline:
			t.Fatalf("the agent holds %d tasks at once, want %d (were the calls serialized?)", len(ids), n)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
	return ids
}

// streamedTask reads a stream to its end and returns its task id, context id and last state.
func streamedTask(events iter.Seq2[a2a.Event, error]) (a2a.TaskID, string, a2a.TaskState, error) {
	var id a2a.TaskID
	var ctxID string
	var state a2a.TaskState
	for ev, err := range events {
		if err != nil {
			return id, ctxID, state, err
		}
		info := ev.TaskInfo()
		id, ctxID = info.TaskID, info.ContextID
		switch e := ev.(type) {
		case *a2a.Task:
			state = e.Status.State
		case *a2a.TaskStatusUpdateEvent:
			state = e.Status.State
		}
	}
	return id, ctxID, state, nil
}

// concurrentRun is the outcome of one of the two calls started at once.
type concurrentRun struct {
	id    a2a.TaskID
	ctxID string
	state a2a.TaskState
	err   error
}

// checkBothCompleted asserts that the SendMessage and the stream completed in ctxID as two tasks.
func checkBothCompleted(t testing.TB, ctxID string, sent, streamed concurrentRun) {
	t.Helper()
	for name, r := range map[string]concurrentRun{"SendMessage": sent, "SendStreamingMessage": streamed} {
		if r.err != nil || r.state != a2a.TaskStateCompleted || r.ctxID != ctxID || r.id == "" {
			t.Fatalf("%s: task %q %s in %q (%v), want completed in %s", name, r.id, r.state, r.ctxID, r.err, ctxID)
		}
	}
	if sent.id == streamed.id {
		t.Fatalf("both calls answered as task %s, want a task each", sent.id)
	}
}

// listedIDs are the ids of a ListTasks answer.
func listedIDs(list *a2a.ListTasksResponse) []a2a.TaskID {
	var ids []a2a.TaskID
	for _, task := range list.Tasks {
		ids = append(ids, task.ID)
	}
	return ids
}

// TestConcurrentTasksInOneContext: under a ConversationPolicy that allows two working tasks per
// context, two calls started at once in one context (a SendMessage and a SendStreamingMessage)
// are both working at the agent at the same time, a third is refused with -32061 as on MQTT, and
// both complete, each with its own task id, and are listed in the context: an HTTP caller
// through the gateway to an MQTT agent (the SDK's responder), and an MQTT requester to an HTTP
// agent behind the gateway (a2a-go's server, which makes its own task ids).
func TestConcurrentTasksInOneContext(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		httpGate, url := startHTTPGate(t)
		st := newStack(t, ctx, kind, url)
		st.allowConcurrentTasks(t, ctx, 2)
		mqttGate := st.startMQTTGate(t, ctx, "memory")
		gw, _ := st.gateway(t, ctx)

		t.Run("HTTP caller to an MQTT agent", func(t *testing.T) {
			token := st.token(t, ctx, "caller")
			c, _ := httpClient(t, ctx, gw, "memory", token)
			ctxID := uuid.NewString()
			var sent, streamed concurrentRun
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				res, err := c.SendMessage(ctx, userMsg(ctxID, "", "hold one"))
				sent.err = err
				if task, ok := res.(*a2a.Task); ok {
					sent.id, sent.ctxID, sent.state = task.ID, task.ContextID, task.Status.State
				} else if err == nil {
					sent.err = fmt.Errorf("result %T, want a Task", res)
				}
			}()
			go func() {
				defer wg.Done()
				streamed.id, streamed.ctxID, streamed.state, streamed.err = streamedTask(c.SendStreamingMessage(ctx, userMsg(ctxID, "", "hold two")))
			}()
			held := awaitHeld(t, ctx, mqttGate, 2)

			// A third working task is one too many: the service's refusal, as the HTTP response
			// (retried until the service has read the patched policy: unlimited before).
			endpoint := gw + "/agents/acme/sales/memory/"
			testenv.Eventually(t, 30*time.Second, "a third concurrent task refused with -32061", func() error {
				status, resp := post(t, ctx, endpoint, token, sendBody(ctxID, "", "third"))
				if status != http.StatusOK || resp.Error == nil || resp.Error.Code != codeConcurrencyLimit {
					return fmt.Errorf("third task: %d %+v %s", status, resp.Error, resp.Result)
				}
				return nil
			})
			mqttGate.open()
			wg.Wait()
			checkBothCompleted(t, ctxID, sent, streamed)
			if !slices.Contains(held, sent.id) || !slices.Contains(held, streamed.id) {
				t.Fatalf("the caller got tasks %s and %s, the agent held %v", sent.id, streamed.id, held)
			}

			list, err := c.ListTasks(ctx, &a2a.ListTasksRequest{ContextID: ctxID})
			if err != nil {
				t.Fatalf("ListTasks: %v", err)
			}
			if ids := listedIDs(list); !slices.Contains(ids, sent.id) || !slices.Contains(ids, streamed.id) {
				t.Fatalf("ListTasks in the context: %v, want %s and %s", ids, sent.id, streamed.id)
			}
			for _, r := range []concurrentRun{sent, streamed} {
				got, err := c.GetTask(ctx, &a2a.GetTaskRequest{ID: r.id})
				if err != nil || got.ContextID != ctxID || got.Status.State != a2a.TaskStateCompleted {
					t.Fatalf("GetTask %s: %+v %v", r.id, got, err)
				}
			}
		})

		t.Run("MQTT requester to an HTTP agent", func(t *testing.T) {
			mq := st.requesterAs(t, ctx, "mqttclient")
			tr := mq.Transport(ref("httpagent"))
			ctxID := uuid.NewString()
			var sent, streamed concurrentRun
			var wg sync.WaitGroup
			wg.Add(2)
			go func() {
				defer wg.Done()
				res, err := tr.SendMessage(ctx, nil, userMsg(ctxID, "", "hold one"))
				sent.err = err
				if task, ok := res.(*a2a.Task); ok {
					sent.id, sent.ctxID, sent.state = task.ID, task.ContextID, task.Status.State
				} else if err == nil {
					sent.err = fmt.Errorf("result %T, want a Task", res)
				}
			}()
			go func() {
				defer wg.Done()
				streamed.id, streamed.ctxID, streamed.state, streamed.err = streamedTask(tr.SendStreamingMessage(ctx, nil, userMsg(ctxID, "", "hold two")))
			}()
			held := awaitHeld(t, ctx, httpGate, 2)

			testenv.Eventually(t, 30*time.Second, "a third concurrent task refused with -32061", func() error {
				_, err := tr.SendMessage(ctx, nil, userMsg(ctxID, "", "third"))
				var refusal *rpcerr.Error
				if !errors.As(err, &refusal) || refusal.Code != codeConcurrencyLimit {
					return fmt.Errorf("third task: %v", err)
				}
				return nil
			})
			httpGate.open()
			wg.Wait()
			checkBothCompleted(t, ctxID, sent, streamed)
			// The HTTP agent made its own ids; the requester sees its own (the service translates).
			if slices.Contains(held, sent.id) || slices.Contains(held, streamed.id) {
				t.Fatalf("the requester got the HTTP agent's task ids %v", held)
			}

			// The context's history on the service lists both, as the requester that opened it reads it.
			list, err := mq.Transport(identity.Service).ListTasks(ctx, nil, &a2a.ListTasksRequest{Tenant: ref("httpagent").String(), ContextID: ctxID})
			if err != nil {
				t.Fatalf("ListTasks on the service: %v", err)
			}
			if ids := listedIDs(list); !slices.Contains(ids, sent.id) || !slices.Contains(ids, streamed.id) {
				t.Fatalf("ListTasks in the context: %v, want %s and %s", ids, sent.id, streamed.id)
			}
			for _, task := range list.Tasks {
				if (task.ID == sent.id || task.ID == streamed.id) && task.Status.State != a2a.TaskStateCompleted {
					t.Fatalf("listed %s %s, want completed", task.ID, task.Status.State)
				}
			}
		})
	})
}

// digestOf is the accepted_history_digest of a continuation hint in metadata (a status
// message's, or a task's as the service records it).
func digestOf(t testing.TB, what string, metadata map[string]any) string {
	t.Helper()
	h, ok, err := a2amqtt.ContinuationOf(&a2a.Message{Metadata: metadata})
	if err != nil || !ok || h.AcceptedHistoryDigest == "" {
		t.Fatalf("%s: hint %+v (present %t, %v), want one with an accepted_history_digest", what, h, ok, err)
	}
	return h.AcceptedHistoryDigest
}

// recomputed is the digest of a run shown no history: of the message as the requester sent it,
// with the task id the run got.
func recomputed(t testing.TB, sent *a2a.SendMessageRequest, id a2a.TaskID) string {
	t.Helper()
	m := *sent.Message
	m.TaskID = id
	d, err := a2amqtt.HistoryDigest(&m, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestHistoryDigestAcrossTheGateway: the conversation service's accepted_history_digest of a
// paused run reaches an HTTP caller through the gateway in the pause's status message, equal to
// the one the service records for the context and an MQTT caller reads there, and to the one
// recomputed from the message the caller sent; in the outbound direction, the pause of an HTTP
// agent behind the gateway carries the digest the MQTT requester reads in the context's history.
func TestHistoryDigestAcrossTheGateway(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		st := newStack(t, ctx, kind, startHTTPAgent(t))
		st.startMQTTAgent(t, ctx, "memory", true)
		gw, pool := st.gateway(t, ctx)

		t.Run("HTTP caller to an MQTT agent", func(t *testing.T) {
			c, _ := httpClient(t, ctx, gw, "memory", st.token(t, ctx, "caller"))
			ctxID := uuid.NewString()
			sent := userMsg(ctxID, "", "remind me to call Bob")
			paused := taskOf(t)(c.SendMessage(ctx, sent))
			if paused.Status.State != a2a.TaskStateInputRequired || said(paused) != agents.MemoryQuestion || paused.ContextID != ctxID {
				t.Fatalf("pause: %s %q in %s", paused.Status.State, said(paused), paused.ContextID)
			}
			overHTTP := digestOf(t, "the pause over HTTP", paused.Status.Message.Metadata)
			if want := recomputed(t, sent, paused.ID); overHTTP != want {
				t.Fatalf("digest over HTTP %s, recomputed from the message sent %s", overHTTP, want)
			}

			// The same caller on MQTT (the gateway's connection as that identity let go first:
			// one client id per identity) reads the context on the service.
			if sweepIdle(ctx, pool, 1) == 0 {
				t.Fatal("the gateway held no caller connection")
			}
			mq := st.requesterAs(t, ctx, "client")
			svc := mq.Transport(identity.Service)
			got, err := svc.GetTask(ctx, nil, &a2a.GetTaskRequest{Tenant: ref("memory").String(), ID: paused.ID})
			if err != nil || got.ContextID != ctxID || got.Status.State != a2a.TaskStateInputRequired {
				t.Fatalf("GetTask on the service: %+v %v", got, err)
			}
			if onMQTT := digestOf(t, "the task on the service", got.Metadata); onMQTT != overHTTP {
				t.Fatalf("digest on MQTT %s, over HTTP %s", onMQTT, overHTTP)
			}
			list, err := svc.ListTasks(ctx, nil, &a2a.ListTasksRequest{Tenant: ref("memory").String(), ContextID: ctxID})
			if err != nil || len(list.Tasks) != 1 || list.Tasks[0].ID != paused.ID {
				t.Fatalf("ListTasks on the service: %+v %v", list, err)
			}
			if listed := digestOf(t, "the listed task", list.Tasks[0].Metadata); listed != overHTTP {
				t.Fatalf("listed digest %s, over HTTP %s", listed, overHTTP)
			}
			_ = mq.Conn().Close(ctx) // the gateway connects as the caller again next

			resumed := taskOf(t)(c.SendMessage(ctx, userMsg(ctxID, paused.ID, "tomorrow")))
			if resumed.ID != paused.ID || resumed.Status.State != a2a.TaskStateCompleted {
				t.Fatalf("resume: %s %s %q", resumed.ID, resumed.Status.State, said(resumed))
			}
		})

		t.Run("MQTT requester to an HTTP agent", func(t *testing.T) {
			mq := st.requesterAs(t, ctx, "mqttclient")
			tr := mq.Transport(ref("httpagent"))
			ctxID := uuid.NewString()
			sent := userMsg(ctxID, "", "deploy v3")
			plan := taskOf(t)(tr.SendMessage(ctx, nil, sent))
			if plan.Status.State != a2a.TaskStateInputRequired || plan.ContextID != ctxID || !strings.Contains(said(plan), "Plan: deploy v3") {
				t.Fatalf("pause: %s %q in %s", plan.Status.State, said(plan), plan.ContextID)
			}
			relayed := digestOf(t, "the HTTP agent's pause", plan.Status.Message.Metadata)
			if want := recomputed(t, sent, plan.ID); relayed != want {
				t.Fatalf("digest %s, recomputed from the message sent %s", relayed, want)
			}
			svc := mq.Transport(identity.Service)
			got, err := svc.GetTask(ctx, nil, &a2a.GetTaskRequest{Tenant: ref("httpagent").String(), ID: plan.ID})
			if err != nil || got.ContextID != ctxID || got.Status.State != a2a.TaskStateInputRequired {
				t.Fatalf("GetTask on the service: %+v %v", got, err)
			}
			if recorded := digestOf(t, "the task on the service", got.Metadata); recorded != relayed {
				t.Fatalf("recorded digest %s, relayed %s", recorded, relayed)
			}
			done := taskOf(t)(tr.SendMessage(ctx, nil, userMsg(ctxID, plan.ID, "go ahead")))
			if done.ID != plan.ID || done.Status.State != a2a.TaskStateCompleted || said(done) != "Done: deploy v3" {
				t.Fatalf("resume: %s %s %q", done.ID, done.Status.State, said(done))
			}
		})
	})
}
