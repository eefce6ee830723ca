package a2amqtt

import (
	"context"
	"iter"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// inputsRecorder is an executor that records what InputsOf gave it: "ask" stops at
// input-required with a hint, anything else completes with an artifact.
type inputsRecorder struct {
	mu     sync.Mutex
	seen   []Inputs
	errs   []error
	policy HistoryPolicy
}

func (e *inputsRecorder) Execute(ctx context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		in, err := InputsOf(ctx, ec)
		e.mu.Lock()
		e.seen, e.errs = append(e.seen, in), append(e.errs, err)
		e.mu.Unlock()
		text := messageText(ec.Message)
		if text == "ask" {
			yield(InputRequired(ec, a2a.NewMessage(a2a.MessageRoleAgent, a2a.NewTextPart("when?")),
				Continuation{ExpectedInput: ExpectFreeText, ResumeScope: ResumeSameTask, HistoryPolicy: e.policy}), nil)
			return
		}
		if !yield(a2a.NewArtifactEvent(ec, a2a.NewTextPart("done: "+text)), nil) {
			return
		}
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCompleted, a2a.NewMessageForTask(a2a.MessageRoleAgent, ec, a2a.NewTextPart("ok: "+text))), nil)
	}
}

func (e *inputsRecorder) Cancel(_ context.Context, ec *a2asrv.ExecutorContext) iter.Seq2[a2a.Event, error] {
	return func(yield func(a2a.Event, error) bool) {
		yield(a2a.NewStatusUpdateEvent(ec, a2a.TaskStateCanceled, nil), nil)
	}
}

func (e *inputsRecorder) last(t *testing.T) Inputs {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.seen) == 0 {
		t.Fatal("executor never ran")
	}
	if err := e.errs[len(e.errs)-1]; err != nil {
		t.Fatalf("InputsOf: %v", err)
	}
	return e.seen[len(e.seen)-1]
}

func texts(ms []*a2a.Message) []string {
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, messageText(m))
	}
	return out
}

func receiptTexts(rs []Receipt) []string {
	var out []string
	for _, r := range rs {
		var b strings.Builder
		for _, p := range r.Artifact.Parts {
			b.WriteString(p.Text())
		}
		out = append(out, b.String())
	}
	return out
}

// threeTurns runs alpha (completes), ask (input-required), beta (resumes ask) and checks the
// three inputs of each turn: the instruction alone, the prior messages as evidence (the resumed
// task's own question included) and the prior artifacts as receipts.
func threeTurns(t *testing.T, conv *Conversation, exec *inputsRecorder, policy HistoryPolicy, source EvidenceSource) {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	if _, err := conv.Send(ctx, "alpha"); err != nil {
		t.Fatal(err)
	}
	in := exec.last(t)
	if messageText(in.Instruction) != "alpha" || len(in.Evidence) != 0 || len(in.Receipts) != 0 {
		t.Fatalf("turn 1: instruction %q evidence %q receipts %q", messageText(in.Instruction), texts(in.Evidence), receiptTexts(in.Receipts))
	}
	res, err := conv.Send(ctx, "ask")
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := conv.Pending(); !ok || p.Continuation == nil || p.Continuation.ExpectedInput != ExpectFreeText || p.Continuation.ResumeScope != ResumeSameTask {
		t.Fatalf("pending after ask: %+v %v (result %+v)", p, ok, res)
	}
	in = exec.last(t)
	if want := []string{"alpha", "ok: alpha"}; messageText(in.Instruction) != "ask" || !slices.Equal(texts(in.Evidence), want) {
		t.Fatalf("turn 2: instruction %q evidence %q, want %q", messageText(in.Instruction), texts(in.Evidence), want)
	}
	if got := receiptTexts(in.Receipts); !slices.Equal(got, []string{"done: alpha"}) {
		t.Fatalf("turn 2 receipts %q", got)
	}
	if _, err := conv.Send(ctx, "beta"); err != nil {
		t.Fatal(err)
	}
	in = exec.last(t)
	if want := []string{"alpha", "ok: alpha", "ask", "when?"}; messageText(in.Instruction) != "beta" || !slices.Equal(texts(in.Evidence), want) {
		t.Fatalf("turn 3: instruction %q evidence %q, want %q", messageText(in.Instruction), texts(in.Evidence), want)
	}
	if in.Policy != policy || in.Source != source {
		t.Fatalf("turn 3 came from %s/%s, want %s/%s", in.Policy, in.Source, policy, source)
	}
	checkThirdTurnInputs(t, in)
}

// checkThirdTurnInputs: the instruction is never evidence, the receipt is the first task's
// artifact, and the digest is HistoryDigest of the three inputs.
func checkThirdTurnInputs(t *testing.T, in Inputs) {
	t.Helper()
	for _, m := range in.Evidence {
		if m.ID == in.Instruction.ID {
			t.Fatal("the instruction must never be evidence")
		}
	}
	if ids := in.ArtifactIDs(); len(ids) != 1 || string(in.Receipts[0].Artifact.ID) != ids[0] || in.Receipts[0].TaskID == in.Instruction.TaskID {
		t.Fatalf("receipt ids %v %+v", ids, in.Receipts)
	}
	d1, err := in.Digest()
	if err != nil || !strings.HasPrefix(d1, "sha256:") {
		t.Fatalf("digest %q %v", d1, err)
	}
	if d2, _ := HistoryDigest(in.Instruction, in.Evidence, in.ArtifactIDs()); d1 != d2 {
		t.Fatal("Inputs.Digest must be HistoryDigest of the three inputs")
	}
}

// TestThreeInputsFromTheTaskStore: the default source, the responder's own task store, under
// both request handlers and on both brokers.
func TestThreeInputsFromTheTaskStore(t *testing.T) {
	forEachMode(t, func(t *testing.T, b brokertest.Broker, mode func(*ResponderOptions)) {
		exec := &inputsRecorder{policy: HistoryAgentFetched}
		serveT(t, b, agentB, exec, mode)
		conv := NewConversation(requesterT(t, b, agentA, nil).Transport(agentB))
		threeTurns(t, conv, exec, HistoryAgentFetched, SourceTaskStore)
	})
}

// TestThreeInputsSources: evidence fetched over MQTT from a history service (ListTasks with
// historyLength and includeArtifacts; here the agent's own responder serves it, as the
// conversation service does for governed agents), supplied by the requester
// (history_policy client_supplied), and none.
func TestThreeInputsSources(t *testing.T) {
	b := brokertest.StartMochi(t)
	t.Run("history-service", func(t *testing.T) {
		ref := AgentRef{Org: "acme", Unit: "ops", Agent: "historian"}
		exec := &inputsRecorder{policy: HistoryAgentFetched}
		serveT(t, b, ref, exec, func(o *ResponderOptions) { o.HistoryFrom = &ref })
		conv := NewConversation(requesterT(t, b, agentA, nil).Transport(ref))
		threeTurns(t, conv, exec, HistoryAgentFetched, SourceHistoryService)
	})
	t.Run("client-supplied", func(t *testing.T) {
		ref := AgentRef{Org: "acme", Unit: "ops", Agent: "stateless"}
		exec := &inputsRecorder{policy: HistoryClientSupplied}
		serveT(t, b, ref, exec, func(o *ResponderOptions) { o.History = HistoryClientSupplied })
		conv := NewConversation(requesterT(t, b, agentA, nil).Transport(ref))
		conv.SetSupplyHistory(true)
		threeTurns(t, conv, exec, HistoryClientSupplied, SourceRequest)
		if st := conv.State(); !st.SupplyHistory || len(st.Transcript) != 2 || len(st.Transcript[1].History) != 4 {
			t.Fatalf("transcript: %+v", st.Transcript)
		}
	})
	t.Run("client-supplied-on-request", func(t *testing.T) {
		// The hint history_policy client_supplied turns supplying on by itself.
		ref := AgentRef{Org: "acme", Unit: "ops", Agent: "asker"}
		exec := &inputsRecorder{policy: HistoryClientSupplied}
		serveT(t, b, ref, exec, func(o *ResponderOptions) { o.History = HistoryClientSupplied })
		conv := NewConversation(requesterT(t, b, agentA, nil).Transport(ref))
		ctx := ctxT(t, 10*time.Second)
		if _, err := conv.Send(ctx, "alpha"); err != nil {
			t.Fatal(err)
		}
		if _, err := conv.Send(ctx, "ask"); err != nil {
			t.Fatal(err)
		}
		if in := exec.last(t); len(in.Evidence) != 0 {
			t.Fatalf("nothing supplied yet, so no evidence: %q", texts(in.Evidence))
		}
		if _, err := conv.Send(ctx, "beta"); err != nil {
			t.Fatal(err)
		}
		if in := exec.last(t); !slices.Equal(texts(in.Evidence), []string{"alpha", "ok: alpha", "ask", "when?"}) {
			t.Fatalf("after the hint: %q", texts(in.Evidence))
		}
	})
	t.Run("none", func(t *testing.T) {
		ref := AgentRef{Org: "acme", Unit: "ops", Agent: "forgetful"}
		exec := &inputsRecorder{policy: HistoryNone}
		serveT(t, b, ref, exec, func(o *ResponderOptions) { o.History = HistoryNone })
		conv := NewConversation(requesterT(t, b, agentA, nil).Transport(ref))
		ctx := ctxT(t, 10*time.Second)
		for _, s := range []string{"alpha", "beta"} {
			if _, err := conv.Send(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		if in := exec.last(t); in.Policy != HistoryNone || len(in.Evidence) != 0 || len(in.Receipts) != 0 || messageText(in.Instruction) != "beta" {
			t.Fatalf("none: %+v", in)
		}
	})
	t.Run("history-length", func(t *testing.T) {
		ref := AgentRef{Org: "acme", Unit: "ops", Agent: "short"}
		exec := &inputsRecorder{}
		serveT(t, b, ref, exec, func(o *ResponderOptions) { o.HistoryLength = 3 })
		conv := NewConversation(requesterT(t, b, agentA, nil).Transport(ref))
		ctx := ctxT(t, 10*time.Second)
		for _, s := range []string{"one", "two", "three"} {
			if _, err := conv.Send(ctx, s); err != nil {
				t.Fatal(err)
			}
		}
		if in := exec.last(t); !slices.Equal(texts(in.Evidence), []string{"ok: one", "two", "ok: two"}) || len(in.Receipts) != 2 {
			t.Fatalf("bounded evidence: %q receipts %d", texts(in.Evidence), len(in.Receipts))
		}
	})
}

func TestInputsOfOutsideAResponder(t *testing.T) {
	if _, err := InputsOf(context.Background(), &a2asrv.ExecutorContext{}); err == nil {
		t.Fatal("InputsOf outside a responder must fail")
	}
	if _, err := NewResponder(context.Background(), nil, ResponderOptions{Executor: &inputsRecorder{}, History: "telepathy"}); err == nil {
		t.Fatal("an unknown history policy must be refused")
	}
	_, ok, err := SuppliedHistoryOf(map[string]any{ContinuationExtensionURI: "not an object"})
	if !ok || err == nil {
		t.Fatalf("malformed supplied history: ok=%v err=%v", ok, err)
	}
}
