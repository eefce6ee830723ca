package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2aclient"
	"github.com/a2aproject/a2a-go/v2/errordetails"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

// TestReplaceError: the bus's error object replaces a2a-go's in a JSON body and in an SSE event,
// keeping the id and the framing, its data as typed details; a result is left alone.
func TestReplaceError(t *testing.T) {
	re := rpcerr.New(a2amqtt.A2AErrorResponderUnavailable, "nobody there", nil)
	a2aGo := `{"jsonrpc":"2.0","id":7,"error":{"code":-32603,"message":"internal"}}`
	for name, tc := range map[string]struct{ in, prefix, suffix string }{
		"json body": {a2aGo + "\n", "", "\n"},
		"sse event": {"data: " + a2aGo + "\n\n", "data: ", "\n\n"},
	} {
		out, ok := replaceError([]byte(tc.in), re)
		if !ok || !strings.HasPrefix(string(out), tc.prefix) || !strings.HasSuffix(string(out), tc.suffix) {
			t.Fatalf("%s: %q %v", name, out, ok)
		}
		var resp struct {
			ID    int           `json:"id"`
			Error *rpcerr.Error `json:"error"`
		}
		body := strings.TrimSuffix(strings.TrimPrefix(string(out), tc.prefix), tc.suffix)
		if err := json.Unmarshal([]byte(body), &resp); err != nil {
			t.Fatalf("%s: %q: %v", name, body, err)
		}
		if resp.ID != 7 || resp.Error.Code != a2amqtt.CodeResponderUnavailable || resp.Error.Message != "nobody there" {
			t.Fatalf("%s: %+v", name, resp)
		}
		// error.data as A2A v1.0's typed details, the type a2a-go's HTTP client decodes it into;
		// the named error's members in its google.protobuf.Struct detail.
		var details []*errordetails.Typed
		if err := json.Unmarshal(resp.Error.Data, &details); err != nil {
			t.Fatalf("%s: error.data %s is not an array of typed details: %v", name, resp.Error.Data, err)
		}
		if len(details) != 1 || details[0].TypeURL != errordetails.StructType || details[0].Value["a2a_error"] != a2amqtt.A2AErrorResponderUnavailable {
			t.Fatalf("%s: error.data %s", name, resp.Error.Data)
		}
	}
	for _, in := range []string{`{"jsonrpc":"2.0","id":7,"result":{"kind":"task"}}` + "\n", ": keep-alive\n\n", "id: 123\n"} {
		if _, ok := replaceError([]byte(in), re); ok {
			t.Fatalf("%q was rewritten", in)
		}
	}
}

// TestServiceAccountOf: only a ServiceAccount's user name maps to a caller.
func TestServiceAccountOf(t *testing.T) {
	if c, ok := serviceAccountOf("system:serviceaccount:team-a:caller"); !ok || c != (Caller{Namespace: "team-a", ServiceAccount: "caller"}) {
		t.Fatalf("got %+v %v", c, ok)
	}
	for _, u := range []string{"alice", "system:serviceaccount:team-a", "system:serviceaccount::x", "system:node:n1", "system:serviceaccount:a:b:c"} {
		if c, ok := serviceAccountOf(u); ok {
			t.Fatalf("%q mapped to %+v", u, c)
		}
	}
}

// TestA2AGoClientReadsTheBusError: a2a-go's own HTTP client, given a response the gateway
// rewrote with a named bus error, gets that error (its code's sentinel, the message and the
// named error's members as details), not a failure to parse the response.
func TestA2AGoClientReadsTheBusError(t *testing.T) {
	re := rpcerr.New(a2amqtt.A2AErrorResponderUnavailable, "nobody there", map[string]any{"agent": "acme/sales/x"})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ID json.RawMessage `json:"id"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		a2aGo := fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"error":{"code":-32603,"message":"internal"}}`, req.ID)
		out, ok := replaceError([]byte(a2aGo), re)
		if !ok {
			t.Errorf("not rewritten: %s", a2aGo)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
	}))
	defer srv.Close()
	card := &a2a.AgentCard{Name: "x", SupportedInterfaces: []*a2a.AgentInterface{a2a.NewAgentInterface(srv.URL, a2a.TransportProtocolJSONRPC)}}
	c, err := a2aclient.NewFromCard(context.Background(), card, a2aclient.WithJSONRPCTransport(srv.Client()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Destroy() }()
	_, err = c.SendMessage(context.Background(), &a2a.SendMessageRequest{Message: a2a.NewMessage(a2a.MessageRoleUser, a2a.NewTextPart("hi"))})
	var ae *a2a.Error
	if !errors.As(err, &ae) || !errors.Is(err, a2a.ErrUnsupportedOperation) || ae.Message != "nobody there" ||
		ae.Details["a2a_error"] != a2amqtt.A2AErrorResponderUnavailable || ae.Details["agent"] != "acme/sales/x" {
		t.Fatalf("a2a-go's client got %v (%#v), want -32004 with the bus error's message and details", err, ae)
	}
}
