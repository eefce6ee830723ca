package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// SendMessage, the call most HTTP callers make, skips a2a-go's JSON-RPC server: the gateway reads
// the request's envelope and params itself and hands the agent's reply on as the agent encoded
// it (a2amqtt.Transport.SendMessageJSON), so a reply is neither decoded into a2a-go types nor
// encoded again (docs/benchmarks.md, gateway overhead). Everything else, and every SendMessage
// whose envelope or params a2a-go would refuse or read differently, goes through a2a-go's server
// as before; a failed call too, so that its error reaches the caller exactly as on that path.

// The JSON-RPC methods the gateway answers itself (A2A v1.0 names, as a2a-go's server reads them).
const (
	methodSendMessage          = "SendMessage"
	methodSendStreamingMessage = "SendStreamingMessage"
)

// rpcEnvelope is a JSON-RPC request, its id and params kept raw.
type rpcEnvelope struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
}

// callErrorKey carries the error of a call the fast path made to a2a-go's server, which answers
// with it (forwarder.SendMessage) instead of calling again.
type callErrorKey struct{}

func callErrorOf(ctx context.Context) error {
	err, _ := ctx.Value(callErrorKey{}).(error)
	return err
}

// sendFast answers a SendMessage request. answered false: the request is a2a-go's to answer,
// with callErr (when not nil) as the call's outcome.
func sendFast(ctx context.Context, w http.ResponseWriter, t *a2amqtt.Transport, env *rpcEnvelope, req *a2a.SendMessageRequest) (answered bool, callErr error) {
	result, err := t.SendMessageJSON(ctx, nil, req)
	if err != nil {
		return false, err
	}
	out := make([]byte, 0, len(result)+len(env.ID)+32)
	out = append(out, `{"jsonrpc":"2.0","id":`...)
	out = append(out, env.ID...)
	out = append(out, `,"result":`...)
	out = append(out, result...)
	out = append(out, "}\n"...)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
	return true, nil
}

// readSend reads a request's envelope and, for the two methods the gateway answers itself
// (SendMessage, SendStreamingMessage), its params; ok false: the request is a2a-go's to answer.
func readSend(body []byte) (env rpcEnvelope, req a2a.SendMessageRequest, ok bool) {
	if json.Unmarshal(body, &env) != nil || env.JSONRPC != "2.0" || !scalarID(env.ID) {
		return env, req, false
	}
	if env.Method != methodSendMessage && env.Method != methodSendStreamingMessage {
		return env, req, false
	}
	return env, req, json.Unmarshal(env.Params, &req) == nil
}

// scalarID reports whether a raw JSON-RPC id is a string or a number (a2a-go's server takes a
// null or missing id too, and answers it: those requests go its way).
func scalarID(id json.RawMessage) bool {
	id = bytes.TrimSpace(id)
	if len(id) == 0 {
		return false
	}
	switch c := id[0]; {
	case c == '"':
		return true
	case c == '-' || (c >= '0' && c <= '9'):
		return true
	}
	return false
}
