package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// nodeDeps is where hack/install-node-deps.sh installed the JS SDK (A2A_NODE_DEPS or bin/node-deps).
func nodeDeps(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("bash", filepath.Join("..", "..", "hack", "install-node-deps.sh"), "--print-dir").Output()
	if err != nil {
		t.Fatalf("node deps dir: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@a2a-js", "sdk")); err != nil {
		t.Fatalf("the A2A JS SDK is not installed in %s: run hack/install-node-deps.sh (make tools-test): %v", dir, err)
	}
	return dir
}

// jsTurn is one line of js/http-requester.mjs.
type jsTurn struct {
	Turn        int      `json:"turn"`
	Events      []string `json:"events"`
	TaskID      string   `json:"taskId"`
	State       string   `json:"state"`
	Text        string   `json:"text"`
	SameContext bool     `json:"sameContext"`
	Error       *struct {
		Message string `json:"message"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// jsScript copies a JS script next to the installed node_modules (where Node resolves its
// imports) and returns its path.
func jsScript(t *testing.T, script string) string {
	t.Helper()
	dir, err := os.MkdirTemp(nodeDeps(t), "gateway-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	src, err := os.ReadFile(filepath.Join("js", script))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, script), src, 0o644); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, script)
}

// startJSAgent runs js/http-responder.mjs (the JS SDK's server) and returns its URL.
func startJSAgent(t *testing.T, ctx context.Context) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, "node", jsScript(t, "http-responder.mjs"))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the JS agent: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadBytes('\n')
	var ready struct{ URL string }
	if err != nil || json.Unmarshal(line, &ready) != nil || ready.URL == "" {
		t.Fatalf("the JS agent did not start: %q %v", line, err)
	}
	return ready.URL
}

// runJS runs a JS script to its end and returns its JSON lines.
func runJS(t *testing.T, ctx context.Context, script string, env ...string) []jsTurn {
	t.Helper()
	cmd := exec.CommandContext(ctx, "node", jsScript(t, script))
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %s: %v\n%s", script, err, stderr.String())
	}
	var turns []jsTurn
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		var tr jsTurn
		if err := json.Unmarshal(sc.Bytes(), &tr); err != nil {
			t.Fatalf("node %s: line %q: %v", script, sc.Text(), err)
		}
		turns = append(turns, tr)
	}
	return turns
}

// TestJSClientCallsAnMQTTAgent: the official A2A JS SDK's HTTP client (ClientFactory from the
// card, JSON-RPC transport, SSE) calls the governed MQTT memory agent through the gateway with a
// ServiceAccount token: follow-ups in one context, input-required and resume, a stream, and a
// mismatched context refused with -32602.
func TestJSClientCallsAnMQTTAgent(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		st := newStack(t, ctx, kind, startHTTPAgent(t))
		st.startMQTTAgent(t, ctx, "memory", true)
		gw, _ := st.gateway(t, ctx)
		turns := runJS(t, ctx, "http-requester.mjs",
			"A2A_CARD_URL="+gw+"/agents/acme/sales/memory/.well-known/agent-card.json", "A2A_TOKEN="+st.token(t, ctx, "caller"),
			`A2A_TURNS=[{"say":"hello"},{"say":"what did I say?"},{"say":"remind me to call Bob"},{"say":"tomorrow","resume":true},`+
				`{"say":"stream it","stream":true},{"say":"again","resume":true,"otherContext":true}]`)
		if len(turns) != 6 {
			t.Fatalf("turns %+v", turns)
		}
		want := []struct{ state, text string }{
			{"TASK_STATE_COMPLETED", "Turn 1"},
			{"TASK_STATE_COMPLETED", `Turn 2. You said "what did I say?". Earlier in this conversation you said: "hello"`},
			{"TASK_STATE_INPUT_REQUIRED", "When should I remind you?"},
			{"TASK_STATE_COMPLETED", "OK, I will remind you to call Bob tomorrow."},
			{"TASK_STATE_COMPLETED", "Turn 4"},
		}
		for i, w := range want {
			got := turns[i]
			if got.Error != nil || got.State != w.state || !strings.Contains(got.Text, w.text) || !got.SameContext {
				t.Fatalf("turn %d: %+v, want %s %q in the same context", i+1, got, w.state, w.text)
			}
		}
		if turns[3].TaskID != turns[2].TaskID {
			t.Fatalf("resume answered task %s, want %s", turns[3].TaskID, turns[2].TaskID)
		}
		if ev := turns[4].Events; len(ev) < 2 || ev[len(ev)-1] != "statusUpdate" {
			t.Fatalf("stream events %v, want several ending with a status update", ev)
		}
		if e := turns[5].Error; e == nil || e.Code != -32602 {
			t.Fatalf("mismatched context: %+v, want -32602", turns[5])
		}
	})
}

// TestMQTTRequesterCallsAJSHTTPAgent: the SDK's requester calls an agent served by the official
// A2A JS SDK's server over HTTP, which the gateway holds on the bus (governed: through the
// conversation service): input-required and resume, a follow-up task in the same context, a
// streamed resume (the JS server opens it with a snapshot still showing input-required), and a
// mismatched context refused with -32602.
func TestMQTTRequesterCallsAJSHTTPAgent(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		st := newStack(t, ctx, kind, startJSAgent(t, ctx))
		st.gateway(t, ctx)
		tr := st.requesterAs(t, ctx, "mqttclient").Transport(ref("httpagent"))

		ctxID := uuid.NewString()
		ask := taskOf(t)(tr.SendMessage(ctx, nil, userMsg(ctxID, "", "v2")))
		if ask.Status.State != a2a.TaskStateInputRequired || ask.ContextID != ctxID || said(ask) != "Turn 1. Deploy v2? Answer yes or no." {
			t.Fatalf("turn 1: %s %q in %s", ask.Status.State, said(ask), ask.ContextID)
		}
		done := taskOf(t)(tr.SendMessage(ctx, nil, userMsg(ctxID, ask.ID, "yes")))
		if done.ID != ask.ID || done.Status.State != a2a.TaskStateCompleted || said(done) != "Deployed v2." {
			t.Fatalf("resume: %s %s %q", done.ID, done.Status.State, said(done))
		}

		var second *a2a.TaskStatusUpdateEvent
		for ev, err := range tr.SendStreamingMessage(ctx, nil, userMsg(ctxID, "", "v3")) {
			if err != nil {
				t.Fatalf("stream: %v", err)
			}
			if su, ok := ev.(*a2a.TaskStatusUpdateEvent); ok {
				second = su
			}
		}
		if second == nil || second.Status.State != a2a.TaskStateInputRequired || a2amqtt.TextOf(second.Status.Message) != "Turn 2. Deploy v3? Answer yes or no." {
			t.Fatalf("stream: last status %+v, want turn 2 of the same context", second)
		}
		var states []a2a.TaskState
		for ev, err := range tr.SendStreamingMessage(ctx, nil, userMsg(ctxID, second.TaskID, "yes")) {
			if err != nil {
				t.Fatalf("streamed resume: %v", err)
			}
			if su, ok := ev.(*a2a.TaskStatusUpdateEvent); ok {
				states = append(states, su.Status.State)
			}
		}
		if len(states) == 0 || states[len(states)-1] != a2a.TaskStateCompleted || slices.Contains(states, a2a.TaskStateInputRequired) {
			t.Fatalf("streamed resume: states %v, want working then completed (not the opening snapshot's input-required)", states)
		}
		if _, err := tr.SendMessage(ctx, nil, userMsg(uuid.NewString(), ask.ID, "again")); !errors.Is(err, a2a.ErrInvalidParams) {
			t.Fatalf("mismatched context: %v, want InvalidParams", err)
		}
	})
}
