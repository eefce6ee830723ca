package gateway

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

// TestReplaceError: the bus's error object replaces a2a-go's in a JSON body and in an SSE event,
// keeping the id and the framing; a result is left alone.
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
		if resp.ID != 7 || resp.Error.Code != a2amqtt.CodeResponderUnavailable || resp.Error.A2AError() != a2amqtt.A2AErrorResponderUnavailable || resp.Error.Message != "nobody there" {
			t.Fatalf("%s: %+v", name, resp)
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
