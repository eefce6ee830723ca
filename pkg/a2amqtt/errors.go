package a2amqtt

import (
	"errors"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

// The JSON-RPC errors of the MQTT reply path are pkg/rpcerr's (one table of codes, a2a_error
// names and sentinels for the SDK, the conversation engine and the service); the names below
// are that package's, re-exported so that SDK users need one import.

// Binding-specific JSON-RPC error codes of the A2A over MQTT profile ("Mandatory
// Binding-Specific Error Mapping"). They numerically overlap with A2A v1.0 codes (-32003
// PushNotificationNotSupported, -32004 UnsupportedOperation, -32005 ContentTypeNotSupported);
// the two are told apart by error.data.a2a_error, which only binding errors carry. See
// docs/protocol.md.
const (
	CodeRequestExpired         = rpcerr.CodeRequestExpired
	CodeResponderUnavailable   = rpcerr.CodeResponderUnavailable
	CodeTransportProtocolError = rpcerr.CodeTransportProtocolError
)

// error.data.a2a_error values for the binding codes.
const (
	A2AErrorRequestExpired         = rpcerr.NameRequestExpired
	A2AErrorResponderUnavailable   = rpcerr.NameResponderUnavailable
	A2AErrorTransportProtocolError = rpcerr.NameTransportProtocolError
)

// Sentinel errors for binding failures; RPCError unwraps to them so callers
// can use errors.Is.
var (
	ErrRequestExpired       = rpcerr.ErrRequestExpired
	ErrResponderUnavailable = rpcerr.ErrResponderUnavailable
	ErrTransportProtocol    = rpcerr.ErrTransportProtocol
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

// Errors of a2a-fleet's conversation service, which enforces ConversationPolicies in front of
// governed agents (codes -32060..-32063 and -32070, docs/conversation.md); matched by
// error.data.a2a_error.
var (
	ErrContextExpired      = rpcerr.ErrContextExpired
	ErrConcurrencyLimit    = rpcerr.ErrConcurrencyLimit
	ErrActiveContextsLimit = rpcerr.ErrActiveContextsLimit
	// ErrContinuationMismatch: the message does not answer a paused task the way its responder
	// declared in the continuation hint (error.data.expected is the hint; see
	// ContinuationMismatchOf).
	ErrContinuationMismatch = rpcerr.ErrContinuationMismatch
	// ErrRateLimited: the caller sent faster than the service's per-caller rate
	// (error.data.retry_after, seconds; RetryAfterOf). The requester waits retry_after and sends
	// the request again (RetryPolicy.RateLimitRetries); a call returns it only when the wait
	// would pass the call's deadline or its retries are used up.
	ErrRateLimited = rpcerr.ErrRateLimited
)

// CodeRateLimited is the JSON-RPC code of a rate_limited refusal (ErrRateLimited).
const CodeRateLimited = rpcerr.CodeRateLimited

// CodeContinuationMismatch is the JSON-RPC code of a continuation_mismatch refusal (the
// conversation service enforces the hint a responder declared; docs/protocol.md).
const CodeContinuationMismatch = rpcerr.CodeContinuationMismatch

// A2AErrorContinuationMismatch is error.data.a2a_error of CodeContinuationMismatch.
const A2AErrorContinuationMismatch = rpcerr.NameContinuationMismatch

// RPCError is a JSON-RPC error object as carried on the MQTT reply path.
// Data is kept raw: A2A v1.0 errors carry an array of typed details
// (google.rpc.ErrorInfo etc.), binding errors carry {"a2a_error": "..."}.
type RPCError = rpcerr.Error

// NewBindingError builds a -32003/-32004/-32005 error with
// error.data.a2a_error set exactly as the profile requires.
func NewBindingError(a2aError, message string) *RPCError {
	return rpcerr.New(a2aError, message, nil)
}

// rpcErrorFrom encodes any error the way a2a-go's JSON-RPC server does (rpcerr.From).
func rpcErrorFrom(err error) *RPCError { return rpcerr.From(err) }

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
