package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

// runJS runs a JS script (copied next to the installed node_modules, where Node resolves its
// imports) and returns its JSON lines.
func runJS(t *testing.T, ctx context.Context, script string, env ...string) []jsTurn {
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
	cmd := exec.CommandContext(ctx, "node", filepath.Join(dir, script))
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
