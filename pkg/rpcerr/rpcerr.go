// Package rpcerr is the one home of the JSON-RPC errors a2a-fleet sends and reads on the MQTT
// reply path: the wire object ([Error]), every code and error.data.a2a_error name (A2A v1.0's,
// the A2A over MQTT profile's binding errors, the conversation rules' and the conversation
// service's), their errors.Is sentinels, the constructors, and the label the service's
// rejections metric counts them by ([Error.Reason]).
//
// The SDK (pkg/a2amqtt: RPCError is this Error), the pure conversation engine
// (internal/conversation) and the conversation service (internal/convservice) all build and
// read errors here, so a new error is one row of [Table] plus its constants. It imports only
// a2a-go: the engine may use it without the SDK.
//
// Numbering: A2A v1.0 uses -32700..-32600, -32000..-32009 and -31401/-31403. The profile's
// binding errors reuse -32003..-32005 and are told apart by error.data.a2a_error, which only
// named errors carry. a2a-fleet's own codes sit in JSON-RPC's server-error range clear of both:
// -32060..-32069 for the conversation rules, -32070.. for the service's own refusals.
package rpcerr

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/errordetails"
)

// Kind says who defines a code.
type Kind int

const (
	// A2A: A2A v1.0 (specification §9); error.data is a2a-go's typed-details array.
	A2A Kind = iota
	// Binding: the A2A over MQTT profile's binding errors; error.data {"a2a_error": ...}.
	Binding
	// Conversation: the conversation rules (ConversationPolicy), enforced by the service.
	Conversation
	// Service: the conversation service's own refusals (fairness between callers).
	Service
)

// A2A v1.0 codes that code outside this package compares with (the rest are in Table only).
const (
	CodeTaskNotFound = -32001
)

// Binding codes of the A2A over MQTT profile ("Mandatory Binding-Specific Error Mapping").
const (
	CodeRequestExpired         = -32003
	CodeResponderUnavailable   = -32004
	CodeTransportProtocolError = -32005
)

// Conversation and service codes (docs/conversation.md, docs/conversation-service.md).
const (
	CodeContextExpired       = -32060
	CodeConcurrencyLimit     = -32061
	CodeActiveContextsLimit  = -32062
	CodeContinuationMismatch = -32063
	CodeRateLimited          = -32070
)

// error.data.a2a_error names of the named (non-A2A) codes.
const (
	NameRequestExpired         = "request_expired"
	NameResponderUnavailable   = "responder_unavailable"
	NameTransportProtocolError = "transport_protocol_error"
	NameContextExpired         = "context_expired"
	NameConcurrencyLimit       = "concurrency_limit"
	NameActiveContextsLimit    = "active_contexts_limit"
	NameContinuationMismatch   = "continuation_mismatch"
	NameRateLimited            = "rate_limited"
)

// Sentinels of the named codes: Error unwraps to them (errors.Is). A2A codes unwrap to
// a2a-go's own sentinels (a2a.ErrInvalidParams, ...).
var (
	ErrRequestExpired       = errors.New("request expired before processing")
	ErrResponderUnavailable = errors.New("responder unavailable")
	ErrTransportProtocol    = errors.New("mqtt binding protocol metadata invalid")
	ErrContextExpired       = errors.New("conversation context expired")
	ErrConcurrencyLimit     = errors.New("conversation concurrency limit reached")
	ErrActiveContextsLimit  = errors.New("active conversation contexts limit reached")
	ErrContinuationMismatch = errors.New("message does not continue the conversation the way the responder declared")
	ErrRateLimited          = errors.New("caller's request rate limit reached")
)

// Def is one JSON-RPC error a2a-fleet knows.
type Def struct {
	Code int
	// Name is error.data.a2a_error; empty for A2A v1.0 codes.
	Name string
	Kind Kind
	// Err is the errors.Is sentinel.
	Err error
	// Reason labels the error in the service's rejections metric (Name when there is one).
	Reason string
	// Retryable: the profile lets a requester retry it at application level.
	Retryable bool
}

// Table is every code and name, each declared once (TestTable keeps it so).
var Table = []Def{
	{Code: -32700, Kind: A2A, Err: a2a.ErrParseError, Reason: "parse_error"},
	{Code: -32600, Kind: A2A, Err: a2a.ErrInvalidRequest, Reason: "invalid_request"},
	{Code: -32601, Kind: A2A, Err: a2a.ErrMethodNotFound, Reason: "method_not_found"},
	{Code: -32602, Kind: A2A, Err: a2a.ErrInvalidParams, Reason: "invalid_params"},
	{Code: -32603, Kind: A2A, Err: a2a.ErrInternalError, Reason: "internal_error"},
	{Code: -32000, Kind: A2A, Err: a2a.ErrServerError, Reason: "server_error"},
	{Code: CodeTaskNotFound, Kind: A2A, Err: a2a.ErrTaskNotFound, Reason: "task_not_found"},
	{Code: -32002, Kind: A2A, Err: a2a.ErrTaskNotCancelable, Reason: "task_not_cancelable"},
	{Code: -32003, Kind: A2A, Err: a2a.ErrPushNotificationNotSupported, Reason: "push_notification_not_supported"},
	{Code: -32004, Kind: A2A, Err: a2a.ErrUnsupportedOperation, Reason: "unsupported_operation"},
	{Code: -32005, Kind: A2A, Err: a2a.ErrUnsupportedContentType, Reason: "content_type_not_supported"},
	{Code: -32006, Kind: A2A, Err: a2a.ErrInvalidAgentResponse, Reason: "invalid_agent_response"},
	{Code: -32007, Kind: A2A, Err: a2a.ErrExtendedCardNotConfigured, Reason: "extended_card_not_configured"},
	{Code: -32008, Kind: A2A, Err: a2a.ErrExtensionSupportRequired, Reason: "extension_support_required"},
	{Code: -32009, Kind: A2A, Err: a2a.ErrVersionNotSupported, Reason: "version_not_supported"},
	{Code: -31401, Kind: A2A, Err: a2a.ErrUnauthenticated, Reason: "unauthenticated"},
	{Code: -31403, Kind: A2A, Err: a2a.ErrUnauthorized, Reason: "unauthorized"},

	{Code: CodeRequestExpired, Name: NameRequestExpired, Kind: Binding, Err: ErrRequestExpired, Retryable: true},
	{Code: CodeResponderUnavailable, Name: NameResponderUnavailable, Kind: Binding, Err: ErrResponderUnavailable, Retryable: true},
	{Code: CodeTransportProtocolError, Name: NameTransportProtocolError, Kind: Binding, Err: ErrTransportProtocol},

	{Code: CodeContextExpired, Name: NameContextExpired, Kind: Conversation, Err: ErrContextExpired},
	{Code: CodeConcurrencyLimit, Name: NameConcurrencyLimit, Kind: Conversation, Err: ErrConcurrencyLimit},
	// -32062 carries data.scope "agent" (the agent's limit) or "caller" (the caller's share).
	{Code: CodeActiveContextsLimit, Name: NameActiveContextsLimit, Kind: Conversation, Err: ErrActiveContextsLimit},
	{Code: CodeContinuationMismatch, Name: NameContinuationMismatch, Kind: Conversation, Err: ErrContinuationMismatch},

	{Code: CodeRateLimited, Name: NameRateLimited, Kind: Service, Err: ErrRateLimited, Retryable: true},
}

var (
	byName = map[string]*Def{}
	byA2A  = map[int]*Def{}
)

func init() {
	for i := range Table {
		d := &Table[i]
		if d.Name != "" {
			d.Reason = d.Name
			byName[d.Name] = d
		} else {
			byA2A[d.Code] = d
		}
	}
}

// Named returns the definition of an error.data.a2a_error name.
func Named(name string) (Def, bool) {
	d, ok := byName[name]
	if !ok {
		return Def{}, false
	}
	return *d, true
}

// Error is a JSON-RPC error object as carried on the MQTT reply path. Data is kept raw: A2A
// v1.0 errors carry an array of typed details (google.rpc.ErrorInfo etc.), named errors an
// object {"a2a_error": "...", <details>}.
type Error struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
	// reason overrides the metric label (WithReason); never on the wire.
	reason string
}

// WithReason sets the label Reason returns, for a refusal whose code is shared by several
// causes (the engine's -32602 for a task of another context: context_mismatch).
func (e *Error) WithReason(reason string) *Error {
	e.reason = reason
	return e
}

// A2AError returns error.data.a2a_error ("" when absent).
func (e *Error) A2AError() string {
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

// def returns e's definition: the named one when error.data.a2a_error names a code of e's
// number, else A2A v1.0's for the number.
func (e *Error) def() (*Def, bool) {
	if k := e.A2AError(); k != "" {
		if d, ok := byName[k]; ok && d.Code == e.Code {
			return d, true
		}
	}
	d, ok := byA2A[e.Code]
	return d, ok
}

// Error implements error.
func (e *Error) Error() string {
	if k := e.A2AError(); k != "" {
		return fmt.Sprintf("jsonrpc error %d (%s): %s", e.Code, k, e.Message)
	}
	return fmt.Sprintf("jsonrpc error %d: %s", e.Code, e.Message)
}

// Unwrap returns the sentinel: a named code's when error.data.a2a_error names it, otherwise
// a2a-go's A2A v1.0 sentinel, so errors.Is(err, a2a.ErrInvalidParams) works for errors from
// the wire.
func (e *Error) Unwrap() error {
	if d, ok := e.def(); ok {
		return d.Err
	}
	return a2a.ErrInternalError
}

// Retryable reports whether the profile allows retrying at application level (-32003/-32004
// binding errors, -32070 after its retry_after); A2A v1.0 errors of the same numbers are not.
func (e *Error) Retryable() bool {
	d, ok := e.def()
	return ok && d.Retryable
}

// IsBindingError reports whether e is one of the profile's binding errors (-32003/-32004/-32005
// with the matching error.data.a2a_error), as opposed to the A2A v1.0 error with the same code.
func (e *Error) IsBindingError() bool {
	d, ok := e.def()
	return ok && d.Kind == Binding
}

// Reason labels e for the service's rejections metric: the label WithReason set, its a2a_error
// name, A2A v1.0's name of its code, or code_N.
func (e *Error) Reason() string {
	if e.reason != "" {
		return e.reason
	}
	if k := e.A2AError(); k != "" {
		return k
	}
	if d, ok := byA2A[e.Code]; ok {
		return d.Reason
	}
	return fmt.Sprintf("code_%d", e.Code)
}

// Details returns the structured fields of error.data: the object without a2a_error (named
// codes) or the google.protobuf.Struct detail (A2A codes); nil when there are none. Numbers
// decode as float64 (encoding/json).
func (e *Error) Details() map[string]any {
	if len(e.Data) == 0 {
		return nil
	}
	if e.Data[0] == '{' {
		var obj map[string]any
		if json.Unmarshal(e.Data, &obj) != nil {
			return nil
		}
		delete(obj, "a2a_error")
		return obj
	}
	var typed []map[string]any
	if json.Unmarshal(e.Data, &typed) != nil {
		return nil
	}
	for _, t := range typed {
		if t["@type"] == errordetails.StructType {
			delete(t, "@type")
			return t
		}
	}
	return nil
}

// New builds a named error (binding, conversation or service code): error.data is
// {"a2a_error": name, <details>}. An unknown name is a programming error and becomes the
// profile's -32005 transport_protocol_error, as the profile requires for undefined binding
// failures.
func New(name, message string, details map[string]any) *Error {
	d, ok := byName[name]
	if !ok {
		d = byName[NameTransportProtocolError]
	}
	obj := make(map[string]any, len(details)+1)
	maps.Copy(obj, details)
	obj["a2a_error"] = d.Name
	data, err := json.Marshal(obj)
	if err != nil {
		data, _ = json.Marshal(map[string]string{"a2a_error": d.Name})
	}
	return &Error{Code: d.Code, Message: message, Data: data}
}

// NewA2A builds an A2A v1.0 error of sentinel (a2a.ErrInvalidParams, ...) as a2a-go's JSON-RPC
// server encodes it: the code of the sentinel and error.data the typed-details array (a
// google.protobuf.Struct with details, then a google.rpc.ErrorInfo whose metadata.timestamp is
// now), so a refusal by the conversation service reads like the same refusal by an SDK
// responder.
func NewA2A(sentinel error, message string, details map[string]any, now time.Time) *Error {
	code, reason := -32603, a2a.ErrorReason(a2a.ErrInternalError)
	for c, d := range byA2A {
		if d.Err == sentinel {
			code, reason = c, a2a.ErrorReason(sentinel)
			break
		}
	}
	var typed []*errordetails.Typed
	if len(details) > 0 {
		typed = append(typed, errordetails.NewFromStruct(details))
	}
	typed = append(typed, errordetails.NewErrorInfo(reason, a2a.ProtocolDomain,
		map[string]string{"timestamp": now.UTC().Format(time.RFC3339)}))
	data, err := json.Marshal(typed)
	if err != nil {
		data = nil
	}
	return &Error{Code: code, Message: message, Data: data}
}

// From encodes any error the way a2a-go's JSON-RPC server does (code from the A2A v1.0 table,
// data = typed details ending with a google.rpc.ErrorInfo), so replies produced before the
// a2a-go handler is reached look the same as those produced by it. An *Error passes through.
func From(err error) *Error {
	var rpcErr *Error
	if errors.As(err, &rpcErr) {
		return rpcErr
	}
	code, reason := -32603, "INTERNAL_ERROR"
	for i := range Table {
		if d := &Table[i]; d.Kind == A2A && errors.Is(err, d.Err) {
			code, reason = d.Code, a2a.ErrorReason(d.Err)
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
	return &Error{Code: code, Message: err.Error(), Data: data}
}

// A2A returns e as an a2a-go error, for handlers built on a2a-go that encode errors
// themselves. Named codes have no a2a-go sentinel: they map to a2a.ErrServerError with
// a2a_error among the details, so prefer Code/Data on the wire.
func (e *Error) A2A() *a2a.Error {
	details := e.Details()
	sentinel := e.Unwrap()
	if k := e.A2AError(); k != "" {
		sentinel = a2a.ErrServerError
		if details == nil {
			details = map[string]any{}
		}
		details["a2a_error"] = k
	}
	return a2a.NewError(sentinel, e.Message).WithDetails(details)
}
