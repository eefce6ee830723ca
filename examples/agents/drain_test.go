package agents

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"
	"github.com/google/uuid"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// echoBinary is examples/echo, built before the tests by `make tools-test` (make test does):
// the SIGTERM test runs the real program.
func echoBinary(t *testing.T) string {
	t.Helper()
	path, err := filepath.Abs(filepath.Join("..", "..", "bin", "echo"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("bin/echo is missing: run `make tools-test` (make test does) before this test: %v", err)
	}
	return path
}

// agentProcess is a running example agent program whose log lines the test can wait for.
type agentProcess struct {
	cmd   *exec.Cmd
	lines chan string
	done  chan error
}

func startEchoProcess(t *testing.T, b brokertest.Broker, ref a2amqtt.AgentRef, delay time.Duration) *agentProcess {
	t.Helper()
	cmd := exec.Command(echoBinary(t), "--broker", b.URL(), "--org", ref.Org, "--unit", ref.Unit, "--agent", ref.Agent,
		"--delay", delay.String(), "--session-expiry", "1m", "--drain-timeout", "20s")
	cmd.Env = append(os.Environ(), "OTEL_EXPORTER_OTLP_ENDPOINT=", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &agentProcess{cmd: cmd, lines: make(chan string, 256), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
	})
	return p
}

// waitLog waits for a log line containing substr (and fails on the way if the process ends).
func (p *agentProcess) waitLog(t *testing.T, substr string, d time.Duration) string {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case l := <-p.lines:
			t.Log("agent: " + l)
			if strings.Contains(l, substr) {
				return l
			}
		case err := <-p.done:
			p.done <- err
			t.Fatalf("agent exited (%v) before logging %q", err, substr)
		case <-deadline:
			t.Fatalf("agent did not log %q within %s", substr, d)
		}
	}
}

// request is a JSON-RPC request as a requester sends it.
func request(t *testing.T, method, taskID, text string) []byte {
	t.Helper()
	msg := a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart(text))
	msg.TaskID, msg.ContextID = a2a.TaskID(taskID), uuid.NewString()
	params, err := json.Marshal(&a2a.SendMessageRequest{Message: msg})
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Appendf(nil, `{"jsonrpc":"2.0","id":%q,"method":%q,"params":%s}`, uuid.NewString(), method, params)
}

// TestSIGTERMDrainsInFlightRequests runs the echo example as a program and sends it SIGTERM
// while it works on a request: the request in flight is finished and answered once by that
// process; a request sent during the drain stays in the agent's persistent session and is
// answered once by the next process. Counted on the wire by a raw MQTT requester.
func TestSIGTERMDrainsInFlightRequests(t *testing.T) {
	brokertest.ForEach(t, func(t *testing.T, b brokertest.Broker) {
		ref := a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "echo-sigterm"}
		requester := brokertest.MustDial(t, b.Addr(), brokertest.Options{ClientID: "acme/ops/requester"})
		reply := a2amqtt.AgentRef{Org: "acme", Unit: "ops", Agent: "requester"}.ReplyTopic("drain")
		requester.Subscribe(reply)
		send := func(method, taskID, text, corr string) {
			t.Helper()
			pr, err := requester.PublishWith(&paho.Publish{Topic: ref.RequestTopic(), QoS: 1, Payload: request(t, method, taskID, text),
				Properties: &paho.PublishProperties{ResponseTopic: reply, CorrelationData: []byte(corr)}})
			if err != nil || pr.ReasonCode >= 0x80 {
				t.Fatalf("publish %s: %v %v", corr, pr, err)
			}
		}
		// replies collects the next n replies by Correlation Data (skipping cards).
		type answer struct {
			corr   string
			state  string
			isErr  bool
			result json.RawMessage
		}
		next := func(d time.Duration) (answer, bool) {
			deadline := time.Now().Add(d)
			for {
				m, err := requester.Next(time.Until(deadline))
				if err != nil {
					return answer{}, false
				}
				if m.Topic != reply || strings.HasPrefix(string(m.Properties.CorrelationData), "warm-up") {
					continue
				}
				var env struct {
					Result json.RawMessage `json:"result"`
					Error  json.RawMessage `json:"error"`
				}
				if err := json.Unmarshal(m.Payload, &env); err != nil {
					t.Fatalf("reply is not JSON-RPC: %s", m.Payload)
				}
				var sr a2a.StreamResponse
				state := ""
				if env.Result != nil && json.Unmarshal(env.Result, &sr) == nil {
					switch ev := sr.Event.(type) {
					case *a2a.Task:
						state = string(ev.Status.State)
					case *a2a.TaskStatusUpdateEvent:
						state = string(ev.Status.State)
					case *a2a.TaskArtifactUpdateEvent:
						state = "artifact"
					}
				}
				return answer{corr: string(m.Properties.CorrelationData), state: state, isErr: env.Error != nil, result: env.Result}, true
			}
		}

		old := startEchoProcess(t, b, ref, 2*time.Second)
		old.waitLog(t, "starting example agent", 30*time.Second)
		// Serving once it answers (its online card comes before the responder subscribes).
		for i, served := 0, false; !served; i++ {
			if i == 20 {
				t.Fatal("the agent never answered a warm-up request")
			}
			corr := fmt.Sprintf("warm-up-%d", i)
			send(a2amqtt.MethodSendMessage, uuid.NewString(), "warm-up", corr)
			for deadline := time.Now().Add(3 * time.Second); !served && time.Now().Before(deadline); {
				m, err := requester.Next(time.Until(deadline))
				served = err == nil && m.Topic == reply
			}
		}

		inFlight, arriving := uuid.NewString(), uuid.NewString()
		send(a2amqtt.MethodSendStreamingMessage, inFlight, "in flight", "in-flight")
		if a, ok := next(10 * time.Second); !ok || a.corr != "in-flight" || a.state != string(a2a.TaskStateWorking) {
			t.Fatalf("first stream item: %+v %v, want the working update", a, ok)
		}
		// The executor now waits 2 s before it answers: SIGTERM.
		if err := old.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		old.waitLog(t, "responder draining", 10*time.Second)
		send(a2amqtt.MethodSendMessage, arriving, "during the drain", "arriving")

		got := map[string][]string{}
		for len(got["in-flight"]) < 2 {
			a, ok := next(15 * time.Second)
			if !ok {
				t.Fatalf("the request in flight was not finished by the draining process: %v", got)
			}
			if a.isErr {
				t.Fatalf("error reply for %s: %s", a.corr, a.result)
			}
			got[a.corr] = append(got[a.corr], a.state)
		}
		select {
		case err := <-old.done:
			if err != nil {
				t.Fatalf("the old process exited with %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the old process did not exit after its drain")
		}
		if len(got["arriving"]) != 0 {
			t.Fatalf("the draining process answered the request that arrived during the drain: %v", got)
		}

		fresh := startEchoProcess(t, b, ref, 0)
		for len(got["arriving"]) < 1 {
			a, ok := next(30 * time.Second)
			if !ok {
				t.Fatalf("the next process did not answer the request left in the session: %v", got)
			}
			if a.isErr {
				t.Fatalf("error reply for %s: %s", a.corr, a.result)
			}
			got[a.corr] = append(got[a.corr], a.state)
		}
		// A sentinel after everything: any duplicate reply would come before its answer.
		send(a2amqtt.MethodSendMessage, uuid.NewString(), "sentinel", "sentinel")
		for len(got["sentinel"]) < 1 {
			a, ok := next(10 * time.Second)
			if !ok {
				t.Fatalf("no answer to the sentinel: %v", got)
			}
			got[a.corr] = append(got[a.corr], a.state)
		}
		want := map[string][]string{
			"in-flight": {"artifact", string(a2a.TaskStateCompleted)},
			"arriving":  {string(a2a.TaskStateCompleted)},
			"sentinel":  {string(a2a.TaskStateCompleted)},
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("replies after the working update: %v, want %v (each request answered exactly once)", got, want)
		}
		_ = fresh.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-fresh.done:
		case <-time.After(20 * time.Second):
			t.Error("the fresh process did not stop on SIGTERM")
		}
	})
}
