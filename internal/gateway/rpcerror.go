package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/errordetails"

	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

// a2a-go's JSON-RPC server encodes an error from its table of A2A v1.0 codes; a code it does not
// know (the profile's binding errors, the conversation service's -32060..-32070) would reach an
// HTTP caller as -32603. The gateway keeps the bus's error object instead: forwarder records it
// in the request's errorSlot and errorWriter puts it, whole (code, message, data), in place of
// a2a-go's error object in the response (a JSON body or the SSE stream's last event).

type errorSlotKey struct{}

// errorSlot holds the JSON-RPC error of one HTTP request.
type errorSlot struct {
	mu  sync.Mutex
	err *rpcerr.Error
}

func (s *errorSlot) get() *rpcerr.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// notAuthorized reports whether err is the broker's PUBACK 0x87 (Not authorized): its ACLs refuse
// the caller the target's request topic (callers rules, grants). The SDK passes it on as text:
// paho's "The PUBLISH is not authorized", or the SDK's "refused by broker: reason 0x87".
func notAuthorized(err error) bool {
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "publish is not authorized") || strings.Contains(msg, "refused by broker: reason 0x87")
}

// busError turns an error of the bus into the JSON-RPC error an HTTP caller gets: a JSON-RPC
// error from the agent or the conversation service as it is; the broker refusing the caller as
// A2A's -31403 (unauthorized); no agent subscribed, or none answering, as the profile's
// responder_unavailable.
func busError(err error) *rpcerr.Error {
	var re *rpcerr.Error
	switch {
	case errors.As(err, &re):
		return re
	case notAuthorized(err):
		return rpcerr.NewA2A(a2a.ErrUnauthorized, "the caller may not call this agent (the broker refused the request: its callers rules)", nil, time.Now())
	case errors.Is(err, a2amqtt.ErrNoSubscribers), errors.Is(err, a2amqtt.ErrNoReply):
		return rpcerr.New(a2amqtt.A2AErrorResponderUnavailable, err.Error(), nil)
	default:
		return nil
	}
}

// recordError keeps err's JSON-RPC form for the response and returns an error a2a-go encodes
// with the same code (the writer then restores message and data).
func recordError(ctx context.Context, err error) error {
	re := busError(err)
	if re == nil {
		return err
	}
	if s, ok := ctx.Value(errorSlotKey{}).(*errorSlot); ok {
		s.mu.Lock()
		s.err = re
		s.mu.Unlock()
	}
	return re
}

// errorWriter replaces the error object of a JSON-RPC response (a JSON body or an SSE data
// event) with the recorded one.
type errorWriter struct {
	http.ResponseWriter
	slot *errorSlot
}

func (w *errorWriter) Write(p []byte) (int, error) {
	if re := w.slot.get(); re != nil {
		if q, ok := replaceError(p, re); ok {
			if _, err := w.ResponseWriter.Write(q); err != nil {
				return 0, err
			}
			return len(p), nil
		}
	}
	return w.ResponseWriter.Write(p)
}

// Flush keeps SSE streaming through the wrapper.
func (w *errorWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (w *errorWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// replaceError rewrites one JSON-RPC error response, bare or as an SSE "data: " line.
func replaceError(p []byte, re *rpcerr.Error) ([]byte, bool) {
	prefix := []byte("data: ")
	body, sse := bytes.CutPrefix(p, prefix)
	trimmed := bytes.TrimRight(body, "\r\n")
	if !bytes.HasPrefix(trimmed, []byte("{")) || !bytes.Contains(trimmed, []byte(`"error"`)) {
		return nil, false
	}
	var resp map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &resp); err != nil {
		return nil, false
	}
	if _, ok := resp["error"]; !ok {
		return nil, false
	}
	encoded, err := json.Marshal(&rpcerr.Error{Code: re.Code, Message: re.Message, Data: typedDetails(re.Data)})
	if err != nil {
		return nil, false
	}
	resp["error"] = encoded
	out, err := json.Marshal(resp)
	if err != nil {
		return nil, false
	}
	var b bytes.Buffer
	if sse {
		b.Write(prefix)
	}
	b.Write(out)
	b.Write(body[len(trimmed):])
	return b.Bytes(), true
}

// typedDetails gives error.data the form of A2A v1.0's JSON-RPC binding, an array of typed
// details, which A2A HTTP clients decode (a2a-go's client fails on anything else and reports a
// parse error instead of the error). A named error's object {"a2a_error": ..., <details>}
// becomes one google.protobuf.Struct detail with the same members; an array, or nothing, stays.
func typedDetails(data json.RawMessage) json.RawMessage {
	var obj map[string]any
	if len(data) == 0 || data[0] != '{' || json.Unmarshal(data, &obj) != nil {
		return data
	}
	out, err := json.Marshal([]*errordetails.Typed{errordetails.NewFromStruct(obj)})
	if err != nil {
		return data
	}
	return out
}
