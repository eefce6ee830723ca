package interop

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/controllers"
	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/convservice"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/internal/registration"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/test/testenv"
)

const org, unit = "acme", "sales"

func ref(name string) a2amqtt.AgentRef { return a2amqtt.AgentRef{Org: org, Unit: unit, Agent: name} }

// The fleet: two requesters (JS and Go) and three governed responders: "js-deploy" (the JS SDK's
// DefaultRequestHandler), "confirm" (the Go example, continuation hint expecting an approval)
// and "recorder" (a Go executor that records the three inputs it gets, fetching history from
// the conversation service).
var fleet = []struct {
	name  string
	gated bool
	card  string
}{
	{"js-client", false, ""},
	{"go-client", false, ""},
	{"js-deploy", true, "capabilities: {streaming: true, extensions: [{uri: '" + a2amqtt.ContinuationExtensionURI + "', description: continuation hints}]}"},
	{"confirm", true, ""},
	{"recorder", true, ""},
}

type stack struct {
	kind      string
	brokerURL string
	ns        string
	usernames map[string]string
	passwords map[string]string
	glue      string
}

// newStack starts a broker of kind, the operator (gating on) and the conversation service
// (history mode Messages), registers the fleet and returns once every gated agent is served.
func newStack(t *testing.T, ctx context.Context, kind string) *stack {
	t.Helper()
	b := testenv.StartBroker(t, ctx, kind)
	st := &stack{kind: kind, brokerURL: b.URL, usernames: map[string]string{}, passwords: map[string]string{}, glue: glueDir(t)}
	st.ns = cp.StartOperator(t, ctx, "interop-", b.Backend, b.URL, controllers.Options{Gating: true})
	secretKey := client.ObjectKey{Namespace: st.ns, Name: "conversation-service-credentials"}
	if err := registration.EnsureServiceCredentials(ctx, k8s, b.Backend, secretKey); err != nil {
		t.Fatalf("service credentials: %v", err)
	}
	svcSecret := &corev1.Secret{}
	if err := k8s.Get(ctx, secretKey, svcSecret); err != nil {
		t.Fatal(err)
	}
	apply(t, ctx, st.ns, `apiVersion: a2a.fleet.dev/v1alpha1
kind: ConversationPolicy
metadata: {name: governed}
spec:
  agentSelector: {matchLabels: {role: gated}}
  history: {mode: Messages}
`)
	for _, a := range fleet {
		labels, card := "{}", ""
		if a.gated {
			labels = "{role: gated}"
		}
		if a.card != "" {
			card = ", " + a.card
		}
		apply(t, ctx, st.ns, fmt.Sprintf(`apiVersion: a2a.fleet.dev/v1alpha1
kind: Agent
metadata: {name: %s, labels: %s}
spec:
  orgID: %s
  unitID: %s
  card: {name: %s, description: interop agent%s}
  callers: {scope: SameUnit}
`, a.name, labels, org, unit, a.name, card))
	}
	testenv.Eventually(t, 60*time.Second, "agents Ready with credentials", func() error {
		for _, a := range fleet {
			ag := &a2av1.Agent{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: st.ns, Name: a.name}, ag); err != nil {
				return err
			}
			if !meta.IsStatusConditionTrue(ag.Status.Conditions, a2av1.ConditionReady) {
				return fmt.Errorf("%s not ready: %v", a.name, ag.Status.Conditions)
			}
			sec := &corev1.Secret{}
			if err := k8s.Get(ctx, client.ObjectKey{Namespace: st.ns, Name: ag.Status.CredentialsSecret}, sec); err != nil {
				return err
			}
			st.usernames[a.name], st.passwords[a.name] = string(sec.Data["username"]), string(sec.Data["password"])
		}
		return nil
	})
	svc, err := convservice.Start(ctx, convservice.Config{
		BrokerURL: b.URL, Username: string(svcSecret.Data["username"]), Password: string(svcSecret.Data["password"]),
		ReplicaID: "interop", Store: "bolt:" + filepath.Join(t.TempDir(), "state.db"), BoltNoSync: true,
		RestConfig: restCfg, Namespace: st.ns,
		SweepInterval: 100 * time.Millisecond, ResyncInterval: 500 * time.Millisecond, StatsInterval: time.Second,
	})
	if err != nil {
		t.Fatalf("start conversation service: %v", err)
	}
	t.Cleanup(func() { _ = svc.Close() })
	want := []string{ref("confirm").String(), ref("js-deploy").String(), ref("recorder").String()}
	testenv.Eventually(t, 30*time.Second, "the service consumes every gated agent", func() error {
		if got := svc.GatedAgents(); !slices.Equal(got, want) {
			return fmt.Errorf("gated agents %v, want %v", got, want)
		}
		return nil
	})
	return st
}

func apply(t *testing.T, ctx context.Context, ns, manifest string) {
	t.Helper()
	testenv.MustCreate(t, ctx, k8s, ns, manifest)
}

// glueDir copies js/*.mjs next to the installed node_modules (Node resolves ES module imports
// from the importing file's directory upwards).
func glueDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(nodeDeps, "glue-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	files, err := filepath.Glob(filepath.Join("js", "*.mjs"))
	if err != nil || len(files) == 0 {
		t.Fatalf("glue files: %v %v", files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// node runs a glue script as agent name; stderr goes to the test log.
func (st *stack) node(t *testing.T, ctx context.Context, script, name string, env ...string) (*exec.Cmd, io.ReadCloser) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "node", filepath.Join(st.glue, script))
	cmd.Env = append(os.Environ(), append([]string{
		"A2A_BROKER=" + st.brokerURL, "A2A_CLIENT_ID=" + ref(name).String(),
		"A2A_USERNAME=" + st.usernames[name], "A2A_PASSWORD=" + st.passwords[name],
	}, env...)...)
	cmd.Stderr = testLogWriter{t: t, prefix: script + ": "}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start node %s: %v", script, err)
	}
	return cmd, out
}

type testLogWriter struct {
	t      *testing.T
	prefix string
}

func (w testLogWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		w.t.Log(w.prefix + line)
	}
	return len(p), nil
}

// startJSResponder runs js/responder.mjs as js-deploy on its delivery topic.
func (st *stack) startJSResponder(t *testing.T, ctx context.Context) {
	t.Helper()
	rctx, cancel := context.WithCancel(context.Background())
	cmd, out := st.node(t, rctx, "responder.mjs", "js-deploy", "A2A_REQUEST_TOPIC="+identity.DeliveryTopic(ref("js-deploy")))
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
	})
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case ready <- sc.Text():
			default:
			}
		}
	}()
	select {
	case line := <-ready:
		if !strings.Contains(line, `"ready":true`) {
			t.Fatalf("JS responder: %s", line)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("JS responder did not start")
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
}

// jsTurn is one line of js/requester.mjs's output.
type jsTurn struct {
	Turn      int            `json:"turn"`
	Say       string         `json:"say"`
	Resumed   bool           `json:"resumed"`
	Events    []string       `json:"events"`
	TaskID    string         `json:"taskId"`
	ContextID string         `json:"contextId"`
	State     string         `json:"state"`
	Text      string         `json:"text"`
	Hint      map[string]any `json:"hint"`
	Mismatch  string         `json:"taskIdMismatch"`
	Error     *struct {
		Message string          `json:"message"`
		Code    int             `json:"code"`
		Name    string          `json:"name"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

// runJSRequester runs js/requester.mjs as js-client against target with turns; it returns the
// card's extensions and one result per turn.
func (st *stack) runJSRequester(t *testing.T, ctx context.Context, target string, turns string) ([]string, []jsTurn) {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd, out := st.node(t, rctx, "requester.mjs", "js-client", "A2A_TARGET="+ref(target).String(), "A2A_TURNS="+turns)
	var card struct {
		Extensions []string `json:"extensions"`
	}
	var got []jsTurn
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		t.Logf("js-client: %s", sc.Text())
		if strings.HasPrefix(sc.Text(), `{"card"`) {
			_ = json.Unmarshal(sc.Bytes(), &card)
			continue
		}
		var turn jsTurn
		if err := json.Unmarshal(sc.Bytes(), &turn); err != nil {
			t.Fatalf("JS requester output: %v: %s", err, sc.Text())
		}
		got = append(got, turn)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("JS requester: %v (%d of the turns done)", err, len(got))
	}
	return card.Extensions, got
}

func checkTurn(t *testing.T, got jsTurn, state, text string, events ...string) {
	t.Helper()
	if got.Error != nil {
		t.Fatalf("turn %d (%q): error %d %s: %s %s", got.Turn, got.Say, got.Error.Code, got.Error.Name, got.Error.Message, got.Error.Data)
	}
	if got.State != state || got.Text != text || got.Mismatch != "" {
		t.Fatalf("turn %d (%q): %s %q %s, want %s %q", got.Turn, got.Say, got.State, got.Text, got.Mismatch, state, text)
	}
	if events != nil && !slices.Equal(got.Events, events) {
		t.Fatalf("turn %d (%q): events %v, want %v", got.Turn, got.Say, got.Events, events)
	}
}

// TestJSInterop runs the JS SDK on both sides of the conversation service, on both brokers:
// multi-turn with input-required resumes, JS requester → JS responder, JS requester → Go
// responder and Go requester → JS responder.
func TestJSInterop(t *testing.T) {
	for _, kind := range testenv.BrokerKinds {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			st := newStack(t, ctx, kind)
			st.startJSResponder(t, ctx)
			startGoAgent(t, ctx, st, agents.KindConfirm, "confirm")
			recorder := startRecorder(t, ctx, st)

			t.Run("js-requester→js-responder", func(t *testing.T) {
				exts, turns := st.runJSRequester(t, ctx, "js-deploy", `[
					{"say": "api"},
					{"say": "maybe", "stream": true},
					{"say": "yes", "stream": true},
					{"say": "web", "stream": true},
					{"say": "no"}]`)
				if !slices.Contains(exts, a2amqtt.ContinuationExtensionURI) {
					t.Fatalf("the operator's card for js-deploy declares %v, want the continuation extension", exts)
				}
				if len(turns) != 5 {
					t.Fatalf("%d turns", len(turns))
				}
				checkTurn(t, turns[0], "TASK_STATE_INPUT_REQUIRED", "Deploy api? Answer yes or no.", "task")
				if turns[0].Hint["expected_input"] != "free_text" || turns[0].Hint["resume_scope"] != "same_task" {
					t.Fatalf("the JS agent's continuation hint did not reach the JS requester: %v", turns[0].Hint)
				}
				checkTurn(t, turns[1], "TASK_STATE_INPUT_REQUIRED", "Please answer yes or no.", "task", "statusUpdate")
				checkTurn(t, turns[2], "TASK_STATE_COMPLETED", "Deployed api.", "task", "statusUpdate", "artifactUpdate", "statusUpdate")
				checkTurn(t, turns[3], "TASK_STATE_INPUT_REQUIRED", "Deploy web? Answer yes or no.", "task", "statusUpdate")
				checkTurn(t, turns[4], "TASK_STATE_CANCELED", "Not deploying web.", "task")
				if turns[0].TaskID == turns[3].TaskID || turns[0].ContextID != turns[3].ContextID {
					t.Fatalf("two tasks of one context expected: %+v %+v", turns[0], turns[3])
				}
				for _, tr := range turns {
					if !tr.Resumed && tr.TaskID == "" {
						t.Fatalf("turn %d has no task id", tr.Turn)
					}
				}
			})

			t.Run("js-requester→go-responder", func(t *testing.T) {
				_, turns := st.runJSRequester(t, ctx, "confirm", `[
					{"say": "rename the bucket", "stream": true},
					{"say": "go ahead", "plain": true},
					{"say": "go ahead", "stream": true},
					{"say": "drop the table"},
					{"say": "no"}]`)
				if len(turns) != 5 {
					t.Fatalf("%d turns", len(turns))
				}
				checkTurn(t, turns[0], "TASK_STATE_INPUT_REQUIRED", agents.ConfirmPrompt("do rename the bucket"), "statusUpdate")
				if turns[0].Hint["expected_input"] != "approval" {
					t.Fatalf("hint %v", turns[0].Hint)
				}
				// Text alone does not answer an approval: the service refuses it (-32063).
				if e := turns[1].Error; e == nil || e.Code != a2amqtt.CodeContinuationMismatch || !strings.Contains(string(e.Data), "continuation_mismatch") {
					t.Fatalf("a text answer to an approval request: %+v", turns[1])
				}
				checkTurn(t, turns[2], "TASK_STATE_COMPLETED", "Done: do rename the bucket", "statusUpdate", "artifactUpdate", "statusUpdate")
				checkTurn(t, turns[3], "TASK_STATE_INPUT_REQUIRED", agents.ConfirmPrompt("do drop the table"), "task")
				checkTurn(t, turns[4], "TASK_STATE_CANCELED", "Not done: do drop the table (denied)", "task")
			})

			t.Run("go-requester→js-responder", func(t *testing.T) {
				conv := a2amqtt.NewConversation(goRequester(t, ctx, st).Transport(ref("js-deploy")))
				res, err := conv.Send(ctx, "db")
				if err != nil {
					t.Fatal(err)
				}
				p, ok := conv.Pending()
				if !ok || p.Question != "Deploy db? Answer yes or no." || p.Continuation == nil || p.Continuation.ExpectedInput != a2amqtt.ExpectFreeText {
					t.Fatalf("first turn: %+v %+v", p, res)
				}
				if task := res.(*a2a.Task); string(task.ID) != string(p.TaskID) || task.ContextID != conv.ContextID() {
					t.Fatalf("ids: task %s/%s, conversation %s/%s", task.ID, task.ContextID, p.TaskID, conv.ContextID())
				}
				// A resumed stream opens with the JS server's Task snapshot (still input-required);
				// the working, artifact and completed events follow on the same stream.
				var kinds []string
				var last a2a.Event
				for ev, err := range conv.Stream(ctx, a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("yes"))) {
					if err != nil {
						t.Fatal(err)
					}
					kinds = append(kinds, fmt.Sprintf("%T", ev))
					last = ev
				}
				if su, ok := last.(*a2a.TaskStatusUpdateEvent); !ok || su.Status.State != a2a.TaskStateCompleted || a2amqtt.TextOf(su.Status.Message) != "Deployed db." {
					t.Fatalf("resumed stream %v ended with %+v", kinds, last)
				}
				if _, pending := conv.Pending(); pending || len(kinds) != 4 {
					t.Fatalf("after the resume: pending %v, events %v", pending, kinds)
				}
				res, err = conv.Send(ctx, "cache")
				if err != nil || res.(*a2a.Task).Status.State != a2a.TaskStateInputRequired {
					t.Fatalf("second task: %v %+v", err, res)
				}
				res, err = conv.Send(ctx, "no")
				if err != nil || res.(*a2a.Task).Status.State != a2a.TaskStateCanceled || a2amqtt.ResultText(res) != "Not deploying cache." {
					t.Fatalf("second task answer: %v %+v", err, res)
				}
				if st := conv.State(); len(st.Tasks) != 2 {
					t.Fatalf("conversation tasks %v", st.Tasks)
				}
			})

			t.Run("three-inputs-from-the-service", func(t *testing.T) {
				// The JS requester talks to a Go executor that fetches prior turns from the
				// conversation service (history mode Messages): the instruction, the evidence
				// and the receipts arrive separately.
				_, turns := st.runJSRequester(t, ctx, "recorder", `[{"say": "I like tea"}, {"say": "and cake", "newTask": true}]`)
				if len(turns) != 2 {
					t.Fatalf("%d turns", len(turns))
				}
				checkTurn(t, turns[1], "TASK_STATE_COMPLETED", "noted: and cake")
				in := recorder.last(t)
				if in.Source != a2amqtt.SourceHistoryService || a2amqtt.TextOf(in.Instruction) != "and cake" {
					t.Fatalf("inputs from %s: instruction %q", in.Source, a2amqtt.TextOf(in.Instruction))
				}
				var evidence []string
				for _, m := range in.Evidence {
					evidence = append(evidence, a2amqtt.TextOf(m))
				}
				if !slices.Equal(evidence, []string{"I like tea", "noted: I like tea"}) || len(in.Receipts) != 1 {
					t.Fatalf("evidence %q, %d receipts", evidence, len(in.Receipts))
				}
			})
		})
	}
}

func goRequester(t *testing.T, ctx context.Context, st *stack) *a2amqtt.Requester {
	t.Helper()
	conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: st.brokerURL, Username: st.usernames["go-client"], Password: st.passwords["go-client"], Agent: ref("go-client")})
	if err != nil {
		t.Fatalf("requester connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	r, err := a2amqtt.NewRequester(ctx, conn, a2amqtt.RequesterOptions{Retry: a2amqtt.RetryPolicy{FirstReplyTimeout: 20 * time.Second, MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// startGoAgent runs an example agent on its delivery topic with its issued credentials.
func startGoAgent(t *testing.T, ctx context.Context, st *stack, kind agents.Kind, name string) {
	t.Helper()
	a, err := agents.Start(ctx, kind, agents.Options{
		BrokerURL: st.brokerURL, Username: st.usernames[name], Password: st.passwords[name],
		Agent: ref(name), RequestTopic: identity.DeliveryTopic(ref(name)),
	})
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
}

// recorderExec completes every message with "noted: <text>" and an artifact, recording the
// three inputs InputsOf gave it.
type recorderExec struct {
	mu   sync.Mutex
	seen []a2amqtt.Inputs
	errs []error
}

func (r *recorderExec) Execute(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		in, err := a2amqtt.InputsOf(ctx, ec)
		r.mu.Lock()
		r.seen, r.errs = append(r.seen, in), append(r.errs, err)
		r.mu.Unlock()
		text := "noted: " + a2amqtt.TextOf(ec.Message)
		if !yield(a2a.NewArtifactEvent(ec, a2a.NewTextPart(text)), nil) {
			return
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart(text))), nil)
	}
}

func (r *recorderExec) Cancel(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, nil), nil)
	}
}

func (r *recorderExec) last(t *testing.T) a2amqtt.Inputs {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.seen) == 0 {
		t.Fatal("the recorder never ran")
	}
	if err := r.errs[len(r.errs)-1]; err != nil {
		t.Fatalf("InputsOf: %v", err)
	}
	return r.seen[len(r.seen)-1]
}

func startRecorder(t *testing.T, ctx context.Context, st *stack) *recorderExec {
	t.Helper()
	id := ref("recorder")
	conn, err := a2amqtt.Connect(ctx, a2amqtt.Config{BrokerURL: st.brokerURL, Username: st.usernames["recorder"], Password: st.passwords["recorder"], Agent: id})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	exec := &recorderExec{}
	service := identity.Service
	resp, err := a2amqtt.NewResponder(ctx, conn, a2amqtt.ResponderOptions{
		Executor: exec, RequestTopic: identity.DeliveryTopic(id), HistoryFrom: &service,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Close(context.Background()) })
	return exec
}
