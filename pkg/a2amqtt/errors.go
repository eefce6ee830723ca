package a2amqtt

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/errordetails"
)

// Binding-specific JSON-RPC error codes of the A2A over MQTT profile
// ("Mandatory Binding-Specific Error Mapping"). They numerically overlap with
// A2A v1.0 codes (-32003 PushNotificationNotSupported, -32004
// UnsupportedOperation, -32005 ContentTypeNotSupported); the two are told
// apart by error.data.a2a_error, which only binding errors carry. See
// docs/protocol.md.
const (
	CodeRequestExpired         = -32003
	CodeResponderUnavailable   = -32004
	CodeTransportProtocolError = -32005
)

// error.data.a2a_error values for the binding codes.
const (
	A2AErrorRequestExpired         = "request_expired"
	A2AErrorResponderUnavailable   = "responder_unavailable"
	A2AErrorTransportProtocolError = "transport_protocol_error"
)

// Sentinel errors for binding failures; RPCError unwraps to them so callers
// can use errors.Is.
var (
	ErrRequestExpired       = errors.New("request expired before processing")
	ErrResponderUnavailable = errors.New("responder unavailable")
	ErrTransportProtocol    = errors.New("mqtt binding protocol metadata invalid")
	// ErrNoReply means no correlated reply arrived within the retry profile
	// (all attempts timed out).
	ErrNoReply = errors.New("no reply from responder")
	// ErrNoSubscribers means the broker accepted the request but reported
	// that nobody subscribes to the request topic (PUBACK 0x10): the agent is
	// offline or not registered.
	ErrNoSubscribers = errors.New("no responder subscribed to the request topic")
	// ErrStreamIdle means a stream stalled longer than the idle timeout and
	// the GetTask recovery did not yield a final state.
	ErrStreamIdle = errors.New("reply stream idle timeout")
)

// a2aCodes is A2A v1.0's JSON-RPC code table (specification §9; the same
// table a2a-go uses internally). Only used to encode/decode; the sentinels
// are a2a-go's.
var a2aCodes = []struct {
	code int
	err  error
}{
	{-32700, a2a.ErrParseError},
	{-32600, a2a.ErrInvalidRequest},
	{-32601, a2a.ErrMethodNotFound},
	{-32602, a2a.ErrInvalidParams},
	{-32603, a2a.ErrInternalError},
	{-32000, a2a.ErrServerError},
	{-32001, a2a.ErrTaskNotFound},
	{-32002, a2a.ErrTaskNotCancelable},
	{-32003, a2a.ErrPushNotificationNotSupported},
	{-32004, a2a.ErrUnsupportedOperation},
	{-32005, a2a.ErrUnsupportedContentType},
	{-32006, a2a.ErrInvalidAgentResponse},
	{-32007, a2a.ErrExtendedCardNotConfigured},
	{-32008, a2a.ErrExtensionSupportRequired},
	{-32009, a2a.ErrVersionNotSupported},
	{-31401, a2a.ErrUnauthenticated},
	{-31403, a2a.ErrUnauthorized},
}

// Errors of a2a-fleet's conversation service, which enforces ConversationPolicies in front of
// governed agents (codes -32060..-32062, docs/conversation.md); matched by error.data.a2a_error.
var (
	ErrContextExpired      = errors.New("conversation context expired")
	ErrConcurrencyLimit    = errors.New("conversation concurrency limit reached")
	ErrActiveContextsLimit = errors.New("active conversation contexts limit reached")
	// ErrContinuationMismatch: the message does not answer a paused task the way its responder
	// declared in the continuation hint (-32063, error.data.expected is the hint; see
	// ContinuationMismatchOf).
	ErrContinuationMismatch = errors.New("message does not continue the conversation the way the responder declared")
)

// CodeContinuationMismatch is the JSON-RPC code of a continuation_mismatch refusal (the
// conversation service enforces the hint a responder declared; docs/protocol.md).
const CodeContinuationMismatch = -32063

// A2AErrorContinuationMismatch is error.data.a2a_error of CodeContinuationMismatch.
const A2AErrorContinuationMismatch = "continuation_mismatch"

var conversationErrors = map[string]error{
	"context_expired":            ErrContextExpired,
	"concurrency_limit":          ErrConcurrencyLimit,
	"active_contexts_limit":      ErrActiveContextsLimit,
	A2AErrorContinuationMismatch: ErrContinuationMismatch,
}

var bindingErrors = map[string]struct {
	code int
	err  error
}{
	A2AErrorRequestExpired:         {CodeRequestExpired, ErrRequestExpired},
	A2AErrorResponderUnavailable:   {CodeResponderUnavailable, ErrResponderUnavailable},
	A2AErrorTransportProtocolError: {CodeTransportProtocolError, ErrTransportProtocol},
}

// RPCError is a JSON-RPC error object as carried on the MQTT reply path.
// Data is kept raw: A2A v1.0 errors carry an array of typed details
// (google.rpc.ErrorInfo etc.), binding errors carry {"a2a_error": "..."}.
type RPCError struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

// A2AError returns error.data.a2a_error ("" when absent).
func (e *RPCError) A2AError() string {
	if len(e.Data) == 0 || e.Data[0] != '{' {
		return ""
	}
	var d struct {
		A2AError string `json:"a2a_error"`
	}
	if err := json.Unmarshal(e.Data, &d); err != nil {
		return ""
	}
	return d.A2AError
}

// Error implements error.
func (e *RPCError) Error() string {
	if k := e.A2AError(); k != "" {
		return fmt.Sprintf("jsonrpc error %d (%s): %s", e.Code, k, e.Message)
	}
	return fmt.Sprintf("jsonrpc error %d: %s", e.Code, e.Message)
}

// Unwrap maps the code to a sentinel: a binding sentinel when
// error.data.a2a_error names one, otherwise a2a-go's A2A v1.0 sentinel, so
// errors.Is(err, a2a.ErrInvalidParams) works for errors from the wire.
func (e *RPCError) Unwrap() error {
	if k := e.A2AError(); k != "" {
		if b, ok := bindingErrors[k]; ok && b.code == e.Code {
			return b.err
		}
		if err, ok := conversationErrors[k]; ok {
			return err
		}
	}
	for _, c := range a2aCodes {
		if c.code == e.Code {
			return c.err
		}
	}
	return a2a.ErrInternalError
}

// Retryable reports whether the profile allows retrying at application
// level: -32003/-32004 binding errors are retry-eligible, -32005 is not.
func (e *RPCError) Retryable() bool {
	k := e.A2AError()
	if b, ok := bindingErrors[k]; !ok || b.code != e.Code {
		// Not a binding error: the same numbers are A2A v1.0 errors, which are not retried.
		return false
	}
	return k == A2AErrorRequestExpired || k == A2AErrorResponderUnavailable
}

// IsBindingError reports whether e is one of the profile's binding errors (-32003/-32004/-32005
// with the matching error.data.a2a_error), as opposed to the A2A v1.0 error with the same code
// (PushNotificationNotSupported, UnsupportedOperation, ContentTypeNotSupported).
func (e *RPCError) IsBindingError() bool {
	b, ok := bindingErrors[e.A2AError()]
	return ok && b.code == e.Code
}

// NewBindingError builds a -32003/-32004/-32005 error with
// error.data.a2a_error set exactly as the profile requires.
func NewBindingError(a2aError, message string) *RPCError {
	b, ok := bindingErrors[a2aError]
	if !ok {
		b.code = CodeTransportProtocolError
		a2aError = A2AErrorTransportProtocolError
	}
	data, _ := json.Marshal(map[string]string{"a2a_error": a2aError})
	return &RPCError{Code: b.code, Message: message, Data: data}
}

// rpcErrorFrom encodes any error the way a2a-go's JSON-RPC server does
// (code from the A2A v1.0 table, data = typed details ending with a
// google.rpc.ErrorInfo), so replies produced before the a2a-go handler is
// reached look the same as those produced by it. *RPCError passes through.
func rpcErrorFrom(err error) *RPCError {
	var rpcErr *RPCError
	if errors.As(err, &rpcErr) {
		return rpcErr
	}
	code, reason := -32603, "INTERNAL_ERROR"
	for _, c := range a2aCodes {
		if errors.Is(err, c.err) {
			code, reason = c.code, a2a.ErrorReason(c.err)
			break
		}
	}
	var details []*errordetails.Typed
	metadata := map[string]string{"timestamp": time.Now().UTC().Format(time.RFC3339)}
	var a2aErr *a2a.Error
	if errors.As(err, &a2aErr) {
		if len(a2aErr.Details) > 0 {
			details = append(details, errordetails.NewFromStruct(a2aErr.Details))
		}
		// As a2a-go does: an ErrorInfo's metadata merges into the one ErrorInfo that ends
		// the list; other typed details pass through.
		for _, d := range a2aErr.TypedDetails {
			if d == nil {
				continue
			}
			if d.TypeURL != errordetails.ErrorInfoType {
				details = append(details, d)
				continue
			}
			switch m := d.Value["metadata"].(type) {
			case map[string]string:
				maps.Copy(metadata, m)
			case map[string]any:
				for k, v := range m {
					if s, ok := v.(string); ok {
						metadata[k] = s
					}
				}
			}
		}
	}
	details = append(details, errordetails.NewErrorInfo(reason, a2a.ProtocolDomain, metadata))
	data, mErr := json.Marshal(details)
	if mErr != nil {
		data = nil
	}
	return &RPCError{Code: code, Message: err.Error(), Data: data}
}

// Short names for a2a-go sentinels used when wrapping decoder errors.
var (
	errParse          = a2a.ErrParseError
	errMethodNotFound = a2a.ErrMethodNotFound
	errInvalidParams  = a2a.ErrInvalidParams
)

// invalidRequest builds a -32600 error with optional structured details.
func invalidRequest(msg string, details map[string]any) *RPCError {
	e := a2a.NewError(a2a.ErrInvalidRequest, msg)
	if details != nil {
		e = e.WithDetails(details)
	}
	return rpcErrorFrom(e)
}
