package a2amqtt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/google/uuid"
)

// jsonrpcVersion is the only JSON-RPC version A2A uses.
const jsonrpcVersion = "2.0"

// A2A v1.0 JSON-RPC method names (a2a-go keeps its copies internal).
const (
	MethodSendMessage          = "SendMessage"
	MethodSendStreamingMessage = "SendStreamingMessage"
	MethodGetTask              = "GetTask"
	MethodListTasks            = "ListTasks"
	MethodCancelTask           = "CancelTask"
	MethodSubscribeToTask      = "SubscribeToTask"
	MethodGetExtendedAgentCard = "GetExtendedAgentCard"
)

// Dialect is the A2A protocol version a request speaks.
type Dialect int

const (
	// DialectV1 is A2A v1.0 (the profile's base): PascalCase methods,
	// ProtoJSON enums.
	DialectV1 Dialect = iota + 1
	// DialectV03 is A2A v0.3 ("message/send", "input-required"), served
	// through a2a-go's a2acompat/a2av0 handler.
	DialectV03
)

func (d Dialect) String() string {
	switch d {
	case DialectV1:
		return "a2a/1.0"
	case DialectV03:
		return "a2a/0.3"
	}
	return "unknown"
}

type methodInfo struct {
	dialect Dialect
	// send methods carry params.message (taskId/contextId/messageId).
	send bool
	// task methods carry params.id (a Task.id).
	task bool
}

var methods = map[string]methodInfo{
	MethodSendMessage:                  {dialect: DialectV1, send: true},
	MethodSendStreamingMessage:         {dialect: DialectV1, send: true},
	MethodGetTask:                      {dialect: DialectV1, task: true},
	MethodListTasks:                    {dialect: DialectV1},
	MethodCancelTask:                   {dialect: DialectV1, task: true},
	MethodSubscribeToTask:              {dialect: DialectV1, task: true},
	MethodGetExtendedAgentCard:         {dialect: DialectV1},
	"GetTaskPushNotificationConfig":    {dialect: DialectV1},
	"CreateTaskPushNotificationConfig": {dialect: DialectV1},
	"ListTaskPushNotificationConfigs":  {dialect: DialectV1},
	"DeleteTaskPushNotificationConfig": {dialect: DialectV1},

	"message/send":                        {dialect: DialectV03, send: true},
	"message/stream":                      {dialect: DialectV03, send: true},
	"tasks/get":                           {dialect: DialectV03, task: true},
	"tasks/cancel":                        {dialect: DialectV03, task: true},
	"tasks/resubscribe":                   {dialect: DialectV03, task: true},
	"tasks/pushNotificationConfig/get":    {dialect: DialectV03},
	"tasks/pushNotificationConfig/set":    {dialect: DialectV03},
	"tasks/pushNotificationConfig/list":   {dialect: DialectV03},
	"tasks/pushNotificationConfig/delete": {dialect: DialectV03},
	"agent/getAuthenticatedExtendedCard":  {dialect: DialectV03},
}

// rpcRequest is a JSON-RPC request as the requester sends it.
type rpcRequest struct {
	JSONRPC string `json:"jsonrpc"`
	ID      string `json:"id"`
	Method  string `json:"method"`
	Params  any    `json:"params,omitempty"`
}

// rpcResponse is a JSON-RPC response as it travels on the reply topic.
type rpcResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      any             `json:"id"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *RPCError       `json:"error,omitempty"`
}

// encodeError renders a JSON-RPC error response; id is the request id (nil
// when it could not be determined).
func encodeError(id any, e *RPCError) []byte {
	b, err := json.Marshal(rpcResponse{JSONRPC: jsonrpcVersion, ID: id, Error: e})
	if err != nil {
		// Only reachable with a non-JSON Data; drop data rather than fail.
		b, _ = json.Marshal(rpcResponse{JSONRPC: jsonrpcVersion, ID: id, Error: &RPCError{Code: e.Code, Message: e.Message}})
	}
	return b
}

// InboundRequest is a decoded, binding-validated request.
type InboundRequest struct {
	ID        any
	Method    string
	Dialect   Dialect
	Params    json.RawMessage
	TaskID    string
	ContextID string
	MessageID string
	// HasMessage is true for send methods with a params.message object.
	HasMessage bool

	// send is params already decoded into a2a-go's type (responder fast path); sendErr is why
	// that decode failed (reported after the binding checks, as a2a-go would).
	send    *a2a.SendMessageRequest
	sendErr error
}

// DecodeLimits bounds what the inbound decoder accepts.
type DecodeLimits struct {
	// MaxPayloadBytes rejects larger payloads before parsing them.
	MaxPayloadBytes int
	// RequireTaskID enforces the profile's requester-generated Task.id on
	// A2A v1.0 send methods (v0.3 peers predate the profile and may omit it).
	RequireTaskID bool
}

// DecodeError carries the JSON-RPC error to reply with and the request id
// if it was recovered.
type DecodeError struct {
	ID  any
	Err *RPCError
}

func (e *DecodeError) Error() string { return e.Err.Error() }

// DecodeRequest parses and validates an inbound request payload. It never
// panics: malformed, oversized or mistyped input yields a *DecodeError
// holding the JSON-RPC error to send back (exported for the fuzz test and
// for tools that want the same validation).
func DecodeRequest(payload []byte, lim DecodeLimits) (*InboundRequest, error) {
	return decodeRequest(payload, lim, false)
}

// decodeRequest is DecodeRequest; with full, A2A v1.0 send params are also decoded into
// a2a-go's SendMessageRequest (the responder's fast path), envelope and params in one pass
// when decodeSendOnePass can.
func decodeRequest(payload []byte, lim DecodeLimits, full bool) (*InboundRequest, error) {
	return decodeRequestVia(payload, lim, full, full)
}

// decodeRequestVia is decodeRequest with the one-pass decode of send requests on or off
// (FuzzDecodeRequest runs both and requires the same verdicts and results).
func decodeRequestVia(payload []byte, lim DecodeLimits, full, onePass bool) (*InboundRequest, error) {
	trimmed, err := checkPayload(payload, lim)
	if err != nil {
		return nil, err
	}
	if full && onePass {
		if req, ok := decodeSendOnePass(trimmed); ok {
			if err := checkSendIDs(req, lim); err != nil {
				return nil, err
			}
			return req, nil
		}
	}
	req, info, err := decodeEnvelope(trimmed)
	if err != nil {
		return nil, err
	}
	switch {
	case info.send:
		if err := decodeSendParams(req, full); err != nil {
			return nil, err
		}
		if err := checkSendIDs(req, lim); err != nil {
			return nil, err
		}
	case info.task:
		if err := decodeTaskParams(req); err != nil {
			return nil, err
		}
	}
	return req, nil
}

// checkPayload refuses what is not a single JSON-RPC request before parsing it: too large,
// empty, not UTF-8, or a batch. It returns the payload without surrounding whitespace.
func checkPayload(payload []byte, lim DecodeLimits) ([]byte, error) {
	if lim.MaxPayloadBytes > 0 && len(payload) > lim.MaxPayloadBytes {
		return nil, &DecodeError{Err: invalidRequest(fmt.Sprintf("payload of %d bytes exceeds the %d byte limit", len(payload), lim.MaxPayloadBytes),
			map[string]any{"limitBytes": lim.MaxPayloadBytes, "sizeBytes": len(payload)})}
	}
	trimmed := bytes.TrimSpace(payload)
	if len(trimmed) == 0 {
		return nil, &DecodeError{Err: rpcErrorFrom(fmt.Errorf("empty payload: %w", errParse))}
	}
	if !utf8.Valid(trimmed) {
		return nil, &DecodeError{Err: rpcErrorFrom(fmt.Errorf("payload is not valid UTF-8: %w", errParse))}
	}
	if trimmed[0] == '[' {
		// JSON-RPC batches have no meaning on a correlated MQTT reply path.
		return nil, &DecodeError{Err: invalidRequest("JSON-RPC batch requests are not supported over MQTT", nil)}
	}
	return trimmed, nil
}

// decodeEnvelope parses and validates the JSON-RPC envelope (jsonrpc, id, method, params an
// object) into a request whose params are still raw, with what the method table says of it.
func decodeEnvelope(payload []byte) (*InboundRequest, methodInfo, error) {
	var env struct {
		JSONRPC *string         `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Method  *string         `json:"method"`
		Params  json.RawMessage `json:"params"`
	}
	if err := json.Unmarshal(payload, &env); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return nil, methodInfo{}, &DecodeError{Err: invalidRequest("malformed JSON-RPC envelope: "+err.Error(), nil)}
		}
		return nil, methodInfo{}, &DecodeError{Err: rpcErrorFrom(fmt.Errorf("malformed JSON: %v: %w", err, errParse))}
	}
	id, ok := parseID(env.ID)
	if !ok {
		return nil, methodInfo{}, &DecodeError{Err: invalidRequest("JSON-RPC id must be a string, a number or null", nil)}
	}
	if env.JSONRPC == nil || *env.JSONRPC != jsonrpcVersion {
		return nil, methodInfo{}, &DecodeError{ID: id, Err: invalidRequest(`"jsonrpc" must be "2.0"`, nil)}
	}
	if env.Method == nil || *env.Method == "" {
		return nil, methodInfo{}, &DecodeError{ID: id, Err: invalidRequest(`"method" is required`, nil)}
	}
	info, known := methods[*env.Method]
	if !known {
		return nil, methodInfo{}, &DecodeError{ID: id, Err: rpcErrorFrom(fmt.Errorf("method %q: %w", *env.Method, errMethodNotFound))}
	}
	if p := bytes.TrimSpace(env.Params); len(p) > 0 && p[0] != '{' && !bytes.Equal(p, []byte("null")) {
		return nil, methodInfo{}, &DecodeError{ID: id, Err: rpcErrorFrom(fmt.Errorf("params must be an object: %w", errInvalidParams))}
	}
	return &InboundRequest{ID: id, Method: *env.Method, Dialect: info.dialect, Params: env.Params}, info, nil
}

// decodeSendParams reads a send method's params.message ids into req. With full (the
// responder), A2A v1.0 params are decoded into a2a-go's request type in the same pass: it gives
// both the ids to validate and what the handler needs. Only when that fails is the lenient id
// probe used, so the errors stay those of the probe (binding) first, then a2a-go's params error.
func decodeSendParams(req *InboundRequest, full bool) error {
	if full && req.Dialect == DialectV1 && len(req.Params) > 0 {
		var sp a2a.SendMessageRequest
		err := json.Unmarshal(req.Params, &sp)
		if err == nil {
			if sp.Message == nil {
				return &DecodeError{ID: req.ID, Err: rpcErrorFrom(fmt.Errorf("params.message is required: %w", errInvalidParams))}
			}
			req.send = &sp
			req.TaskID, req.ContextID, req.MessageID = string(sp.Message.TaskID), sp.Message.ContextID, sp.Message.ID
			return nil
		}
		req.sendErr = paramsError(err)
	}
	var p struct {
		Message *struct {
			TaskID    *string `json:"taskId"`
			ContextID *string `json:"contextId"`
			MessageID *string `json:"messageId"`
		} `json:"message"`
	}
	if len(req.Params) > 0 {
		if err := json.Unmarshal(req.Params, &p); err != nil {
			return &DecodeError{ID: req.ID, Err: rpcErrorFrom(fmt.Errorf("params: %v: %w", err, errInvalidParams))}
		}
	}
	if p.Message == nil {
		return &DecodeError{ID: req.ID, Err: rpcErrorFrom(fmt.Errorf("params.message is required: %w", errInvalidParams))}
	}
	req.TaskID = deref(p.Message.TaskID)
	req.ContextID = deref(p.Message.ContextID)
	req.MessageID = deref(p.Message.MessageID)
	return nil
}

// decodeTaskParams reads a task method's params.id (a Task.id) into req.
func decodeTaskParams(req *InboundRequest) error {
	var p struct {
		ID *string `json:"id"`
	}
	if len(req.Params) > 0 {
		if err := json.Unmarshal(req.Params, &p); err != nil {
			return &DecodeError{ID: req.ID, Err: rpcErrorFrom(fmt.Errorf("params: %v: %w", err, errInvalidParams))}
		}
	}
	req.TaskID = deref(p.ID)
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// decodeSendOnePass is the responder's hot path: an A2A v1.0 SendMessage/SendStreamingMessage
// request decoded envelope and params together into a2a-go's SendMessageRequest, one pass over
// the payload instead of the envelope first and its params again. Anything else (another
// method, params that do not decode, an invalid envelope) returns false and goes through the
// general path, which produces the errors. So does a payload whose top-level "params" key is
// repeated (or cannot be judged cheaply): encoding/json would merge the repeated objects into
// one SendMessageRequest where the general path keeps only the last.
func decodeSendOnePass(payload []byte) (*InboundRequest, bool) {
	if n, ok := topLevelKeyCount(payload, "params"); !ok || n != 1 {
		return nil, false
	}
	var env struct {
		JSONRPC *string                 `json:"jsonrpc"`
		ID      json.RawMessage         `json:"id"`
		Method  *string                 `json:"method"`
		Params  *a2a.SendMessageRequest `json:"params"`
	}
	if err := json.Unmarshal(payload, &env); err != nil {
		return nil, false
	}
	if env.JSONRPC == nil || *env.JSONRPC != jsonrpcVersion || env.Method == nil || env.Params == nil || env.Params.Message == nil {
		return nil, false
	}
	info := methods[*env.Method]
	if !info.send || info.dialect != DialectV1 {
		return nil, false
	}
	id, ok := parseID(env.ID)
	if !ok {
		return nil, false
	}
	m := env.Params.Message
	return &InboundRequest{ID: id, Method: *env.Method, Dialect: DialectV1, send: env.Params,
		TaskID: string(m.TaskID), ContextID: m.ContextID, MessageID: m.ID}, true
}

// checkSendIDs marks a send request and applies the binding's Task.id rules: required on A2A
// v1.0 (when lim says so), a UUID when present.
func checkSendIDs(req *InboundRequest, lim DecodeLimits) error {
	req.HasMessage = true
	if req.TaskID == "" {
		if lim.RequireTaskID && req.Dialect == DialectV1 {
			return &DecodeError{ID: req.ID, Err: NewBindingError(A2AErrorTransportProtocolError,
				"missing Task.id (params.message.taskId): the MQTT binding requires a requester-generated UUIDv4")}
		}
	} else if !validTaskID(req.TaskID) {
		return &DecodeError{ID: req.ID, Err: NewBindingError(A2AErrorTransportProtocolError,
			fmt.Sprintf("malformed Task.id %q: the MQTT binding requires a UUID", truncate(req.TaskID, 64)))}
	}
	return nil
}

// validTaskID accepts canonical UUID strings (36 characters). The profile
// asks requesters for UUIDv4; other versions (a2a-go's own NewTaskID makes
// v7) are accepted to stay interoperable, see docs/protocol.md.
func validTaskID(s string) bool {
	if len(s) != 36 {
		return false
	}
	_, err := uuid.Parse(s)
	return err == nil
}

func parseID(raw json.RawMessage) (any, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, true
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, false
	}
	switch v.(type) {
	case string, float64:
		return v, true
	}
	return nil, false
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
