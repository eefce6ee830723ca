package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"

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

// rpcEnvelope is a JSON-RPC request, its id kept raw.
type rpcEnvelope struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  string          `json:"method"`
}

// sendEnvelope is a JSON-RPC request whose params are read as a SendMessage's, in the same pass
// as the envelope (the params are not copied out and scanned a second time).
type sendEnvelope struct {
	rpcEnvelope
	Params *a2a.SendMessageRequest `json:"params"`
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
	// The response in four writes to net/http's buffered writer (no copy of the result), with
	// its length given: a result larger than the writer's buffer still goes out in one piece,
	// not chunked.
	const head, mid, tail = `{"jsonrpc":"2.0","id":`, `,"result":`, "}\n"
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(head)+len(env.ID)+len(mid)+len(result)+len(tail)))
	_, _ = io.WriteString(w, head)
	_, _ = w.Write(env.ID)
	_, _ = io.WriteString(w, mid)
	_, _ = w.Write(result)
	_, _ = io.WriteString(w, tail)
	// Out now, not once the handler has returned: releasing the caller's requester, ending the
	// request's context and net/http's own bookkeeping come after the caller has its answer.
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	return true, nil
}

// readSend reads a request's envelope and, for the two methods the gateway answers itself
// (SendMessage, SendStreamingMessage), its params; ok false: the request is a2a-go's to answer.
func readSend(body []byte) (env rpcEnvelope, req *a2a.SendMessageRequest, ok bool) {
	// One pass: the params of another method, read as a SendMessage's, are dropped (that
	// request goes to a2a-go's server, which reads the body again).
	var send sendEnvelope
	if json.Unmarshal(body, &send) != nil || send.JSONRPC != "2.0" || !scalarID(send.ID) || send.Params == nil {
		return send.rpcEnvelope, nil, false
	}
	if send.Method != methodSendMessage && send.Method != methodSendStreamingMessage {
		return send.rpcEnvelope, nil, false
	}
	return send.rpcEnvelope, send.Params, true
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
