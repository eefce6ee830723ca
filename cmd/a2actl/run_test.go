package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/a2a-fleet/a2a-fleet/examples/agents"
	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt/a2amqtttest"
)

func startAgent(t *testing.T, b brokertest.Broker, kind agents.Kind, ref a2amqtt.AgentRef) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := agents.Start(ctx, kind, agents.Options{BrokerURL: b.URL(), Agent: ref, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })
}

func runCLI(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	code := run(ctx, args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestCLI(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		echo := a2amqtt.AgentRef{Org: "demo", Unit: "default", Agent: "echo"}
		confirm := a2amqtt.AgentRef{Org: "demo", Unit: "default", Agent: "confirm"}
		startAgent(t, b, agents.KindEcho, echo)
		startAgent(t, b, agents.KindConfirm, confirm)
		broker := "--broker=" + b.URL()
		testAgentsCommand(t, broker)
		testSendCommand(t, broker)
		testCLIErrors(t, broker)
		testChatCommand(t, broker)
		testSendApproval(t, broker)
	})
}

func testAgentsCommand(t *testing.T, broker string) {
	t.Helper()
	code, out, errOut := runCLI(t, "", "agents", broker, "--wait=500ms")
	if code != exitOK || !strings.Contains(out, "demo/default/echo") || !strings.Contains(out, "online") || !strings.Contains(out, "demo/default/confirm") {
		t.Fatalf("agents: %d\n%s\n%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, "", "agents", broker, "--wait=500ms", "--json")
	var rows []map[string]any
	if code != exitOK || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 2 || rows[1]["status"] != "online" {
		t.Fatalf("agents --json: %d %s", code, out)
	}
}

func testSendCommand(t *testing.T, broker string) {
	t.Helper()
	var code int
	var out, errOut string

	code, out, errOut = runCLI(t, "", "send", "demo/default/echo", "hello there", broker)
	if code != exitOK || !strings.Contains(out, "echo: hello there") || !strings.Contains(out, "completed") {
		t.Fatalf("send: %d\n%s\n%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, "", "send", broker, "--json", "demo/default/echo", "as json")
	var res map[string]map[string]any
	if code != exitOK || json.Unmarshal([]byte(out), &res) != nil || res["task"]["status"].(map[string]any)["state"] != "TASK_STATE_COMPLETED" {
		t.Fatalf("send --json: %d %s", code, out)
	}
	code, out, _ = runCLI(t, "", "send", broker, "--stream", "demo/default/echo", "streamed")
	if code != exitOK || !strings.Contains(out, "[working]") || !strings.Contains(out, "[artifact] streamed") || !strings.Contains(out, "[completed] echo: streamed") {
		t.Fatalf("send --stream: %d %s", code, out)
	}
}

func testCLIErrors(t *testing.T, broker string) {
	t.Helper()
	var code int
	var errOut string

	// Not registered → exit 4 with a clear message.
	code, _, errOut = runCLI(t, "", "send", broker, "--presence-wait=300ms", "demo/default/nobody", "hi")
	if code != exitOffline || !strings.Contains(errOut, "not registered") {
		t.Fatalf("unknown agent: %d %s", code, errOut)
	}
	// Broker unreachable → exit 3.
	code, _, errOut = runCLI(t, "", "send", "--broker=mqtt://127.0.0.1:1", "demo/default/echo", "hi")
	if code != exitUnreachable || !strings.Contains(errOut, "cannot connect to broker") {
		t.Fatalf("unreachable: %d %s", code, errOut)
	}
	// JSON-RPC error: a message to a finished task → code + data shown.
	code, _, errOut = runCLI(t, "", "send", broker, "--json", "--task-id", "0b9c2f4e-3a43-4d1c-9a55-7f0d1b2f6c11", "--context-id", "c1", "demo/default/confirm", "first")
	if code != exitOK {
		t.Fatalf("confirm first: %d %s", code, errOut)
	}
	code, _, errOut = runCLI(t, "", "send", broker, "--json", "--task-id", "0b9c2f4e-3a43-4d1c-9a55-7f0d1b2f6c11", "--context-id", "other", "demo/default/confirm", "hijack")
	if code != exitFailure || !strings.Contains(errOut, `"code":-32602`) {
		t.Fatalf("context mismatch: %d %s", code, errOut)
	}
}

func testChatCommand(t *testing.T, broker string) {
	t.Helper()
	var code int
	var out, errOut string

	// Interactive chat: the agent asks, the user answers, the task resumes.
	code, out, errOut = runCLI(t, "deploy v3\nnot yet\ngo ahead\n/quit\n", "chat", broker, "demo/default/confirm")
	if code != exitOK {
		t.Fatalf("chat: %d %s", code, errOut)
	}
	for _, want := range []string{"agent asks: " + agents.ConfirmPrompt("do deploy v3"), "you (answer)> ", "agent asks: " + agents.ConfirmReask, "[completed] Done: do deploy v3", "(task done)"} {
		if !strings.Contains(out, want) {
			t.Fatalf("chat output lacks %q:\n%s", want, out)
		}
	}
	// The continuation hint is shown, approvals are answered with words or /deny REASON.
	code, out, errOut = runCLI(t, "deploy v4\n/deny change freeze\ndeploy v5\nyes\n/quit\n", "chat", broker, "demo/default/confirm")
	if code != exitOK {
		t.Fatalf("chat approvals: %d %s", code, errOut)
	}
	for _, want := range []string{
		"[input-required] " + agents.ConfirmPrompt("do deploy v4") + " (approval expected: answer approve/deny)",
		"(answer approve, yes or go ahead to approve; deny or no to refuse; /approve or /deny REASON with a reason)",
		"[canceled] Not done: do deploy v4 (denied: change freeze)",
		"[completed] Done: do deploy v5",
	} {
		if !strings.Contains(out, want) {
			t.Fatalf("chat output lacks %q:\n%s", want, out)
		}
	}
}

func testSendApproval(t *testing.T, broker string) {
	t.Helper()
	// send --approve answers a pending approval by task id.
	const approvalTask = "5d6f2b7e-7c1a-4e0b-9a41-2b8c7d9e0f13"
	code, out, errOut := runCLI(t, "", "send", broker, "--task-id", approvalTask, "--context-id", "c-approve", "demo/default/confirm", "rotate keys")
	if code != exitOK || !strings.Contains(out, "(approval expected: answer approve/deny)") || !strings.Contains(out, `--approve|--deny "reason"`) {
		t.Fatalf("send to confirm: %d %s %s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "", "send", broker, "--approve", "--task-id", approvalTask, "--context-id", "c-approve", "demo/default/confirm", "checked the plan")
	if code != exitOK || !strings.Contains(out, "Done: do rotate keys") {
		t.Fatalf("send --approve: %d %s %s", code, out, errOut)
	}
}

func TestParseApproval(t *testing.T) {
	for line, want := range map[string]struct{ approve, ok bool }{
		"yes": {true, true}, "Go ahead!": {true, true}, "approve": {true, true}, "/approve": {true, true},
		"no": {false, true}, "Deny.": {false, true}, "/deny too risky": {false, true},
		"not yet": {false, false}, "yes but later": {false, false},
	} {
		approve, _, ok := parseApproval(line)
		if approve != want.approve || ok != want.ok {
			t.Errorf("parseApproval(%q) = %v %v, want %v %v", line, approve, ok, want.approve, want.ok)
		}
	}
	if _, reason, _ := parseApproval("/deny  too risky "); reason != "too risky" {
		t.Errorf("reason %q", reason)
	}
}

func TestUsage(t *testing.T) {
	if code, _, _ := runCLI(t, ""); code != exitUsage {
		t.Fatalf("no args: %d", code)
	}
	if code, _, errOut := runCLI(t, "", "send", "bad ref", "x"); code != exitUsage || !strings.Contains(errOut, "ORG/UNIT/AGENT") {
		t.Fatalf("bad ref: %d %s", code, errOut)
	}
	if code, _, _ := runCLI(t, "", "frobnicate"); code != exitUsage {
		t.Fatalf("unknown command: %d", code)
	}
}

// TestCommandHelp: `a2actl COMMAND -h` (and `a2actl help COMMAND`) prints the command's
// synopsis, an example and the environment variables it reads, on stdout, with exit 0.
func TestCommandHelp(t *testing.T) {
	for _, cmd := range commands() {
		for _, args := range [][]string{{cmd.name, "-h"}, {"--json", cmd.name, "--help"}, {"help", cmd.name}} {
			code, out, errOut := runCLI(t, "", args...)
			if code != exitOK || errOut != "" || !strings.HasPrefix(out, "Usage: a2actl "+cmd.synopsis+"\n") || !strings.Contains(out, "\nExamples:\n  ") {
				t.Fatalf("%q: exit %d\n%s\n%s", args, code, out, errOut)
			}
			if cmd.connects && (!strings.Contains(out, "A2A_BROKER") || !strings.Contains(out, envAsAgent) || !strings.Contains(out, "KUBECONFIG")) {
				t.Fatalf("%q does not name the environment variables:\n%s", args, out)
			}
		}
	}
	code, out, _ := runCLI(t, "", "-h")
	if code != exitOK || !strings.Contains(out, "a2actl chat ORG/UNIT/AGENT") || !strings.Contains(out, "--as-agent NAME") {
		t.Fatalf("a2actl -h: %d\n%s", code, out)
	}
	if code, out, _ := runCLI(t, "", "version"); code != exitOK || !strings.HasPrefix(out, "a2actl ") {
		t.Fatalf("a2actl version: %d %s", code, out)
	}
	// A flag the command does not take: its help on stderr, exit 2.
	if code, _, errOut := runCLI(t, "", "agents", "--stream"); code != exitUsage || !strings.Contains(errOut, "Usage: a2actl agents") {
		t.Fatalf("agents --stream: %d %s", code, errOut)
	}
}

// TestCLIOfflineAgent: an agent whose connection died (LWT: offline) is
// reported as offline (Mosquitto answers PUBACK 0x10, exit 4) or as a
// timeout (mochi never reports "no subscribers", exit 5).
func TestCLIOfflineAgent(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		ref := a2amqtt.AgentRef{Org: "demo", Unit: "default", Agent: "flaky"}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a, err := agents.Start(ctx, agents.KindEcho, agents.Options{BrokerURL: b.URL(), Agent: ref, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Responder.Close(context.Background()) })
		a.Conn.Abort()
		// Wait for the broker to publish the LWT.
		deadline := time.Now().Add(5 * time.Second)
		for {
			code, out, _ := runCLI(t, "", "agents", "--broker="+b.URL(), "--wait=200ms")
			if code == exitOK && strings.Contains(out, "offline") && strings.Contains(out, "lwt") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("LWT not visible: %s", out)
			}
		}
		code, _, errOut := runCLI(t, "", "send", "--broker="+b.URL(), "--attempts=1", "--timeout=300ms", "demo/default/flaky", "hello?")
		if !strings.Contains(errOut, "marked offline (source lwt)") {
			t.Fatalf("no offline warning: %s", errOut)
		}
		want, wantText := exitTimeout, "timeout waiting for demo/default/flaky"
		if b.Name() == "mosquitto" {
			want, wantText = exitOffline, "is offline: nobody subscribes"
		}
		if code != want || !strings.Contains(errOut, wantText) {
			t.Fatalf("exit %d (want %d): %s", code, want, errOut)
		}
	})
}

func TestCommandIndexSkipsGlobalFlags(t *testing.T) {
	cases := []struct {
		args []string
		want int
	}{
		{[]string{"send", "a/b/c", "hi"}, 0},
		{[]string{"--broker", "mqtt://x:1", "send", "a/b/c", "hi"}, 2},
		{[]string{"--json", "agents"}, 1},
		{[]string{"--broker=mqtt://x:1", "-v", "chat", "a/b/c"}, 2},
		{[]string{"--broker", "mqtt://x:1"}, -1},
	}
	for _, tc := range cases {
		if got := commandIndex(tc.args); got != tc.want {
			t.Errorf("commandIndex(%q) = %d, want %d", tc.args, got, tc.want)
		}
	}
}

// TestCLITLS: a2actl reaches an agent through Mosquitto's TLS listener (client certificate
// required) with the A2A_TLS_* environment, and says why when the certificate is missing.
func TestCLITLS(t *testing.T) {
	pki := a2amqtttest.NewPKI(t, "a2actl test CA")
	_, url := a2amqtttest.StartTLSMosquitto(t, pki)
	agentCert, agentKey := pki.Issue(t, "echo", false)
	cliCert, cliKey := pki.Issue(t, "a2actl", false)
	ref := a2amqtt.AgentRef{Org: "demo", Unit: "default", Agent: "echo"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := agents.Start(ctx, agents.KindEcho, agents.Options{BrokerURL: url, Agent: ref, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		TLS: a2amqtt.TLSFiles{CA: pki.CAFile(), Cert: agentCert, Key: agentKey}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close(context.Background()) })

	t.Setenv(a2amqtt.EnvTLSCA, pki.CAFile())
	code, _, errOut := runCLI(t, "", "send", "--broker="+url, "demo/default/echo", "no cert")
	if code != exitUnreachable || !strings.Contains(errOut, "cannot connect to broker") {
		t.Fatalf("without a client certificate: %d %s", code, errOut)
	}
	t.Setenv(a2amqtt.EnvTLSCert, cliCert)
	t.Setenv(a2amqtt.EnvTLSKey, cliKey)
	code, out, errOut := runCLI(t, "", "send", "--broker="+url, "demo/default/echo", "over tls")
	if code != exitOK || !strings.Contains(out, "echo: over tls") {
		t.Fatalf("send over TLS: %d\n%s\n%s", code, out, errOut)
	}
	code, _, errOut = runCLI(t, "", "send", "--broker="+url, "--tls-key=", "demo/default/echo", "half")
	if code != exitUsage || !strings.Contains(errOut, "without its key") {
		t.Fatalf("certificate without key: %d %s", code, errOut)
	}
}

// TestChatResumesCoreStyleAgent (issue 12 item 6): chatting with an agent that opens every
// stream with a Task event (core A2A servers do; on a resume it still shows input-required),
// a2actl follows the resumed stream to its end instead of stopping at the opening event.
func TestChatResumesCoreStyleAgent(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		ref := a2amqtt.AgentRef{Org: "demo", Unit: "default", Agent: "core"}
		a2amqtttest.StartCoreStyleAgent(t, b.URL(), ref)
		code, out, errOut := runCLI(t, "deploy\nv3\n/quit\n", "chat", "--broker="+b.URL(), "demo/default/core")
		if code != exitOK {
			t.Fatalf("chat: %d %s", code, errOut)
		}
		for _, want := range []string{"agent asks: " + a2amqtttest.CoreStyleQuestion, "[working] deploying v3", "[completed] deployed v3", "(task done)"} {
			if !strings.Contains(out, want) {
				t.Fatalf("chat output lacks %q:\n%s\n%s", want, out, errOut)
			}
		}
	})
}

// TestCLIWaitsForACardBeingRepublished (issue 9.3): right after a broker restart without
// persistence the agent's retained card is gone until the agent has reconnected; a2actl waits
// for it (up to --presence-wait) instead of calling a registered agent "not registered".
func TestCLIWaitsForACardBeingRepublished(t *testing.T) {
	b := brokertest.StartMochi(t)
	ref := a2amqtt.AgentRef{Org: "demo", Unit: "default", Agent: "late"}
	go func() {
		time.Sleep(1500 * time.Millisecond) // longer than the old 1 s wait
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		a, err := agents.Start(ctx, agents.KindEcho, agents.Options{BrokerURL: b.URL(), Agent: ref, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err == nil {
			t.Cleanup(func() { _ = a.Close(context.Background()) })
		}
	}()
	code, out, errOut := runCLI(t, "", "send", "--broker="+b.URL(), "demo/default/late", "you there?")
	if code != exitOK || !strings.Contains(out, "echo: you there?") {
		t.Fatalf("send to an agent whose card comes back after 1.5 s: %d\n%s\n%s", code, out, errOut)
	}
}
