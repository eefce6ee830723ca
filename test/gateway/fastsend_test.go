package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/brokertest"
)

// TestSendMessageReplyHandedOn: an HTTP caller's SendMessage gets the agent's reply as the agent
// encoded it (a plain-paho agent's Task, with a member a2a-go does not know), with the caller's
// own JSON-RPC id; an agent's error reaches the caller with its code, message and data.
func TestSendMessageReplyHandedOn(t *testing.T) {
	onBothBrokers(t, func(t *testing.T, kind string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		st := newStack(t, ctx, kind, startHTTPAgent(t))
		agent := st.plainPahoAgent(t, "direct")
		go func() {
			for p := range agent.Messages() {
				var req struct {
					ID     any `json:"id"`
					Params struct {
						Message struct {
							TaskID    string `json:"taskId"`
							ContextID string `json:"contextId"`
							Parts     []struct {
								Text string `json:"text"`
							} `json:"parts"`
						} `json:"message"`
					} `json:"params"`
				}
				_ = json.Unmarshal(p.Payload, &req)
				id, _ := json.Marshal(req.ID)
				m := req.Params.Message
				note := "kept"
				if len(m.Parts) > 0 && m.Parts[0].Text == "big" {
					note = strings.Repeat("k", 16<<10)
				}
				body := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":{"task":{"id":%q,"contextId":%q,"status":{"state":"TASK_STATE_COMPLETED"},"xVendorNote":%q}}}`, id, m.TaskID, m.ContextID, note)
				if len(m.Parts) > 0 && m.Parts[0].Text == "fail" {
					body = fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":{"code":-32001,"message":"no such task here","data":{"hint":"ask again"}}}`, id)
				}
				_, _ = agent.PublishWith(&paho.Publish{Topic: p.Properties.ResponseTopic, QoS: 1, Payload: []byte(body),
					Properties: &paho.PublishProperties{CorrelationData: p.Properties.CorrelationData}})
			}
		}()
		gw, _ := st.gateway(t, ctx)
		endpoint := fmt.Sprintf("%s/agents/%s/%s/direct/", gw, org, unit)
		token := st.token(t, ctx, "caller")

		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": "call-7", "method": "SendMessage", "params": userMsg("", "", "hello")})
		status, resp, raw := postRaw(t, ctx, endpoint, token, body)
		if status != 200 || resp.Error != nil || !bytes.Contains(resp.Result, []byte(`"xVendorNote":"kept"`)) {
			t.Fatalf("SendMessage: %d %s", status, raw)
		}
		var envelope struct {
			ID any `json:"id"`
		}
		if err := json.Unmarshal(raw, &envelope); err != nil || envelope.ID != "call-7" {
			t.Fatalf("id %v (%v), want the caller's", envelope.ID, err)
		}

		status, resp, raw = postRaw(t, ctx, endpoint, token, sendBody("", "", "fail"))
		if resp.Error == nil || resp.Error.Code != -32001 || resp.Error.Message != "no such task here" || !bytes.Contains(resp.Error.Data, []byte("ask again")) {
			t.Fatalf("an agent's error: %d %s", status, raw)
		}

		// A result larger than net/http's response buffer goes out with its length, not chunked.
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(sendBody("", "", "big")))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+token)
		big, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer big.Body.Close()
		raw, _ = io.ReadAll(big.Body)
		if big.StatusCode != 200 || big.ContentLength != int64(len(raw)) || len(big.TransferEncoding) != 0 || !bytes.Contains(raw, []byte(strings.Repeat("k", 16<<10))) {
			t.Fatalf("a large result: status %d, Content-Length %d, Transfer-Encoding %v, %d bytes read", big.StatusCode, big.ContentLength, big.TransferEncoding, len(raw))
		}
	})
}

// postRaw is post with the raw response body.
func postRaw(t testing.TB, ctx context.Context, url, token string, body []byte) (int, rpcResponse, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out rpcResponse
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("POST %s: status %d, body %q is not JSON-RPC: %v", url, resp.StatusCode, raw, err)
	}
	return resp.StatusCode, out, raw
}

// plainPahoAgent connects a plain paho client (not the SDK) as the stack's agent name and
// subscribes it to that agent's request topic: the responder the gateway's relays are proven
// against.
func (st *stack) plainPahoAgent(t *testing.T, name string) *brokertest.Client {
	t.Helper()
	u, err := url.Parse(st.brokerURL)
	if err != nil {
		t.Fatal(err)
	}
	agent := brokertest.MustDial(t, u.Host, brokertest.Options{Username: st.usernames[name], Password: st.passwords[name], ClientID: ref(name).ClientID()})
	if rc := agent.Subscribe(ref(name).RequestTopic()); rc >= 0x80 {
		t.Fatalf("subscribe: %#x", rc)
	}
	return agent
}
