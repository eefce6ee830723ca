package a2amqtt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"runtime/debug"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/a2asrv"
)

// The responder's A2A v1.0 JSON-RPC front end. It does what a2a-go's a2asrv.NewJSONRPCHandler
// does (decode params into a2a-go's request types, call the a2asrv.RequestHandler, encode
// a2a-go's result types in a JSON-RPC response, map errors with A2A v1.0's code table and typed
// details) but straight from the MQTT payload: no in-process http.Request/ResponseWriter, no
// Server-Sent-Events framing and re-parsing, no producer goroutine per stream, and the
// envelope is parsed once (DecodeRequest). The wire format is a2a-go's own (the golden files
// in testdata/golden pin it). A2A v0.3 requests still go through a2a-go's a2acompat/a2av0
// handler.

// rpcResult is a JSON-RPC success response (a2a-go's jsonrpc.ServerResponse shape).
type rpcResult struct {
	JSONRPC string `json:"jsonrpc"`
	ID      any    `json:"id"`
	Result  any    `json:"result,omitempty"`
}

// paramsError maps a params decoding error as a2a-go's JSON-RPC handler does: a type mismatch
// is invalid params, anything else a parse error.
func paramsError(err error) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		return fmt.Errorf("%w: %w", a2a.ErrInvalidParams, err)
	}
	return fmt.Errorf("%w: %w", a2a.ErrParseError, err)
}

// decodeParams decodes req.Params into a new T (absent params decode as the zero value).
func decodeParams[T any](raw json.RawMessage) (*T, error) {
	var v T
	if len(raw) == 0 {
		return &v, nil
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, paramsError(err)
	}
	return &v, nil
}

// callContext attaches a2a-go's call context (service parameters from the MQTT user
// properties; a2a-authorization also as Authorization), as a2a-go's HTTP front ends do from
// request headers.
func callContext(ctx context.Context, in *inbound) context.Context {
	params := make(map[string][]string, len(in.user)+1)
	for _, up := range in.user {
		params[up.Key] = append(params[up.Key], up.Value)
		if up.Key == PropAuthorization {
			params["Authorization"] = []string{up.Value}
		}
	}
	ctx, _ = a2asrv.NewCallContext(ctx, a2asrv.NewServiceParams(params))
	return ctx
}

// serveV1 answers one A2A v1.0 request through the bridge.
func (r *Responder) serveV1(ctx context.Context, out *replier, in *inbound, req *InboundRequest) {
	ctx = callContext(context.WithValue(ctx, scopeKey{}, r.scope), in)
	defer func() {
		if v := recover(); v != nil {
			r.log.Error("request handler panicked", "method", req.Method, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			out.sendError(ctx, req.ID, rpcErrorFrom(fmt.Errorf("handler panic: %v", v)))
		}
	}()
	h := r.bridge
	switch req.Method {
	case MethodSendMessage, MethodSendStreamingMessage:
		p, err := req.send, req.sendErr
		if p == nil && err == nil {
			p, err = decodeParams[a2a.SendMessageRequest](req.Params)
		}
		if err != nil {
			out.sendError(ctx, req.ID, rpcErrorFrom(err))
			return
		}
		if req.Method == MethodSendStreamingMessage {
			r.stream(ctx, out, req.ID, h.SendStreamingMessage(ctx, p))
			return
		}
		res, err := h.SendMessage(ctx, p)
		if err != nil {
			out.sendError(ctx, req.ID, rpcErrorFrom(err))
			return
		}
		out.sendResult(ctx, req.ID, a2a.StreamResponse{Event: res}, false)
	case MethodSubscribeToTask:
		p, err := decodeParams[a2a.SubscribeToTaskRequest](req.Params)
		if err != nil {
			out.sendError(ctx, req.ID, rpcErrorFrom(err))
			return
		}
		r.stream(ctx, out, req.ID, h.SubscribeToTask(ctx, p))
	case MethodGetTask:
		unary(ctx, out, req, h.GetTask, asIs[*a2a.Task])
	case MethodListTasks:
		unary(ctx, out, req, h.ListTasks, asIs[*a2a.ListTasksResponse])
	case MethodCancelTask:
		unary(ctx, out, req, h.CancelTask, asIs[*a2a.Task])
	case MethodGetExtendedAgentCard:
		unary(ctx, out, req, h.GetExtendedAgentCard, asIs[*a2a.AgentCard])
	case "GetTaskPushNotificationConfig":
		unary(ctx, out, req, h.GetTaskPushConfig, asIs[*a2a.PushConfig])
	case "ListTaskPushNotificationConfigs":
		unary(ctx, out, req, h.ListTaskPushConfigs, asIs[*a2a.ListTaskPushConfigResponse])
	case "CreateTaskPushNotificationConfig":
		unary(ctx, out, req, h.CreateTaskPushConfig, asIs[*a2a.PushConfig])
	case "DeleteTaskPushNotificationConfig":
		unary(ctx, out, req, func(ctx context.Context, p *a2a.DeleteTaskPushConfigRequest) (any, error) {
			return nil, h.DeleteTaskPushConfig(ctx, p)
		}, asIs[any])
	default:
		out.sendError(ctx, req.ID, rpcErrorFrom(fmt.Errorf("method %q: %w", req.Method, a2a.ErrMethodNotFound)))
	}
}

func asIs[T any](v T) any { return v }

// unary decodes the params, calls the handler method and sends its result or error.
func unary[P, R any](ctx context.Context, out *replier, req *InboundRequest, call func(context.Context, *P) (R, error), wrap func(R) any) {
	p, err := decodeParams[P](req.Params)
	if err != nil {
		out.sendError(ctx, req.ID, rpcErrorFrom(err))
		return
	}
	res, err := call(ctx, p)
	if err != nil {
		out.sendError(ctx, req.ID, rpcErrorFrom(err))
		return
	}
	out.sendResult(ctx, req.ID, wrap(res), false)
}

// stream sends every event as its own reply (pipelined), an error as the last one.
func (r *Responder) stream(ctx context.Context, out *replier, id any, events iter.Seq2[a2a.Event, error]) {
	for ev, err := range events {
		if err != nil {
			out.sendErrorMode(ctx, id, rpcErrorFrom(err), true)
			return
		}
		out.sendResult(ctx, id, a2a.StreamResponse{Event: ev}, true)
	}
}

// sendResult encodes a JSON-RPC success response and publishes it.
func (o *replier) sendResult(ctx context.Context, id any, result any, async bool) {
	b, err := encodeResult(id, result)
	if err != nil {
		o.sendErrorMode(ctx, id, rpcErrorFrom(fmt.Errorf("encode result: %w", err)), async)
		return
	}
	o.sendMode(ctx, b, async)
}

// encodeResult renders {"jsonrpc":"2.0","id":ID,"result":RESULT} (rpcResult's JSON) with the
// envelope written directly: through json.Marshal of the envelope, the result's own
// MarshalJSON output (a2a-go's event types) would be validated and copied once more, a
// noticeable share of a stream item's CPU.
func encodeResult(id any, result any) ([]byte, error) {
	if result == nil {
		return json.Marshal(rpcResult{JSONRPC: jsonrpcVersion, ID: id})
	}
	idJSON, err := json.Marshal(id)
	if err != nil {
		return nil, err
	}
	if sr, ok := result.(a2a.StreamResponse); ok {
		// Its wire shape directly (events.go): a2a-go's MarshalJSON output would be validated
		// and copied once more.
		if result, err = wrapEvent(sr.Event); err != nil {
			return nil, err
		}
	}
	res, err := json.Marshal(result)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, len(res)+len(idJSON)+40)
	b = append(b, `{"jsonrpc":"2.0","id":`...)
	b = append(b, idJSON...)
	b = append(b, `,"result":`...)
	b = append(b, res...)
	return append(b, '}'), nil
}
