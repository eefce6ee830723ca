package conversation

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/a2aproject/a2a-go/v2/errordetails"
)

// JSON-RPC codes of the conversation rules that neither A2A v1.0 nor the MQTT
// profile define. They sit in JSON-RPC's implementation-defined server-error
// range (-32000..-32099) well clear of A2A v1.0's -32001..-32009 (and the
// profile's -32003..-32005 binding codes, which reuse A2A's numbers), so a
// future A2A code in the -3201x range cannot collide. Like the profile's
// binding errors, they carry error.data as an object with a2a_error.
const (
	CodeContextExpired      = -32060
	CodeConcurrencyLimit    = -32061
	CodeActiveContextsLimit = -32062
)

// error.data.a2a_error values of the conversation codes.
const (
	A2AErrorContextExpired      = "context_expired"
	A2AErrorConcurrencyLimit    = "concurrency_limit"
	A2AErrorActiveContextsLimit = "active_contexts_limit"
)

// Sentinels for errors.Is on conversation rejections. Rejections with A2A
// v1.0 codes unwrap to a2a-go's sentinels (a2a.ErrInvalidParams,
// a2a.ErrUnsupportedOperation, a2a.ErrTaskNotCancelable) instead.
var (
	ErrContextExpired      = errors.New("conversation context expired")
	ErrConcurrencyLimit    = errors.New("concurrent task limit reached")
	ErrActiveContextsLimit = errors.New("active context limit of the agent reached")
)

// a2aCodes are the A2A v1.0 JSON-RPC codes of the a2a-go sentinels the
// engine uses (A2A v1.0 specification §9, the table a2a-go and pkg/a2amqtt
// encode with).
var a2aCodes = []struct {
	code int
	err  error
}{
	{-32602, a2a.ErrInvalidParams},
	{-32002, a2a.ErrTaskNotCancelable},
	{-32004, a2a.ErrUnsupportedOperation},
}

// Error is a rejection: a JSON-RPC error the service sends back on the
// requester's reply path instead of forwarding the request.
type Error struct {
	// Code is the JSON-RPC error code.
	Code int
	// Message is the human-readable error.message.
	Message string
	// Err is the sentinel (errors.Is target).
	Err error
	// A2AError is error.data.a2a_error for the conversation codes; empty
	// for A2A v1.0 errors, whose data is a2a-go's typed-details array.
	A2AError string
	// Details are the structured fields of error.data (conversation codes)
	// or of the google.protobuf.Struct detail (A2A v1.0 codes).
	Details map[string]any
}

// Error implements error.
func (e *Error) Error() string {
	if e.A2AError != "" {
		return fmt.Sprintf("jsonrpc error %d (%s): %s", e.Code, e.A2AError, e.Message)
	}
	return fmt.Sprintf("jsonrpc error %d: %s", e.Code, e.Message)
}

// Unwrap returns the sentinel.
func (e *Error) Unwrap() error { return e.Err }

// Data encodes error.data as it goes on the wire. Conversation codes:
// {"a2a_error": ..., <details>}, the profile's shape for codes it binds.
// A2A v1.0 codes: the array a2a-go and pkg/a2amqtt produce (a
// google.protobuf.Struct with the details, then a google.rpc.ErrorInfo whose
// metadata.timestamp is now), so a rejection from the conversation service
// is indistinguishable from the same rejection by an SDK responder.
func (e *Error) Data(now time.Time) (json.RawMessage, error) {
	if e.A2AError != "" {
		obj := make(map[string]any, len(e.Details)+1)
		maps.Copy(obj, e.Details)
		obj["a2a_error"] = e.A2AError
		b, err := json.Marshal(obj)
		if err != nil {
			return nil, fmt.Errorf("encode error.data of %s: %w", e.A2AError, err)
		}
		return b, nil
	}
	var details []*errordetails.Typed
	if len(e.Details) > 0 {
		details = append(details, errordetails.NewFromStruct(e.Details))
	}
	details = append(details, errordetails.NewErrorInfo(a2a.ErrorReason(e.Err), a2a.ProtocolDomain,
		map[string]string{"timestamp": now.UTC().Format(time.RFC3339)}))
	b, err := json.Marshal(details)
	if err != nil {
		return nil, fmt.Errorf("encode error.data of code %d: %w", e.Code, err)
	}
	return b, nil
}

// A2A returns the rejection as an a2a-go error, for handlers built on a2a-go
// that encode errors themselves. Conversation codes have no a2a-go sentinel;
// they map to a2a.ErrServerError, so prefer Code/Data on the wire.
func (e *Error) A2A() *a2a.Error {
	sentinel := e.Err
	if e.A2AError != "" {
		sentinel = a2a.ErrServerError
	}
	details := maps.Clone(e.Details)
	if e.A2AError != "" {
		if details == nil {
			details = map[string]any{}
		}
		details["a2a_error"] = e.A2AError
	}
	return a2a.NewError(sentinel, e.Message).WithDetails(details)
}

func a2aError(sentinel error, msg string, details map[string]any) *Error {
	code := -32603
	for _, c := range a2aCodes {
		if c.err == sentinel {
			code = c.code
		}
	}
	return &Error{Code: code, Message: msg, Err: sentinel, Details: details}
}

func errInvalidParams(msg string, details map[string]any) *Error {
	return a2aError(a2a.ErrInvalidParams, msg, details)
}

// errContextMismatch is the profile's -32602 for a task id sent with another
// context id than its own; message and details match pkg/a2amqtt's bridge.
func errContextMismatch(taskID, taskContextID, contextID string) *Error {
	return errInvalidParams(
		fmt.Sprintf("contextId %q conflicts with task %s, which belongs to context %q", contextID, taskID, taskContextID),
		map[string]any{"taskId": taskID, "taskContextId": taskContextID, "contextId": contextID})
}

// errTerminalTask is A2A v1.0's UnsupportedOperation for a message to a
// finished task, in pkg/a2amqtt's wording plus the engine's reason when the
// engine itself failed the task.
func errTerminalTask(t *Task, contextID string) *Error {
	msg := fmt.Sprintf("task %s is in terminal state %s and accepts no further messages; start a new task in context %s", t.ID, t.State, contextID)
	details := map[string]any{"taskId": t.ID, "state": string(t.State)}
	if t.StatusMessage != "" {
		msg = fmt.Sprintf("task %s is in terminal state %s (%s) and accepts no further messages; start a new task in context %s", t.ID, t.State, t.StatusMessage, contextID)
		details["statusMessage"] = t.StatusMessage
	}
	return a2aError(a2a.ErrUnsupportedOperation, msg, details)
}

func errContextExpired(contextID string, e Expiry, p Policy) *Error {
	details := map[string]any{
		"contextId": contextID,
		"reason":    string(e.Reason),
		"expiredAt": e.At.UTC().Format(time.RFC3339),
	}
	var why string
	switch e.Reason {
	case ExpiredIdleTTL:
		why = "idle for longer than its idle TTL"
		if p.IdleTTL > 0 {
			details["idleTTL"] = p.IdleTTL.String()
			why = fmt.Sprintf("idle for longer than its idle TTL of %s", p.IdleTTL)
		}
	case ExpiredMaxAge:
		why = "older than its maximum age"
		if p.MaxAge > 0 {
			details["maxAge"] = p.MaxAge.String()
			why = fmt.Sprintf("older than its maximum age of %s", p.MaxAge)
		}
	}
	return &Error{
		Code: CodeContextExpired,
		Message: fmt.Sprintf("context %s expired at %s (%s); start a new conversation with a new contextId",
			contextID, e.At.UTC().Format(time.RFC3339), why),
		Err:      ErrContextExpired,
		A2AError: A2AErrorContextExpired,
		Details:  details,
	}
}

// errContextBusy is the per-context concurrency limit (seed 004's
// concurrent-call guard when the limit is 1).
func errContextBusy(c *Context, limit int) *Error {
	working := make([]string, 0, c.Working)
	for i := range c.Tasks {
		if active(c.Tasks[i].State) {
			working = append(working, c.Tasks[i].ID)
		}
	}
	return &Error{
		Code: CodeConcurrencyLimit,
		Message: fmt.Sprintf("context %s already has %d working task(s), the limit is %d; retry when a task finishes or needs input",
			c.ID, c.Working, limit),
		Err:      ErrConcurrencyLimit,
		A2AError: A2AErrorConcurrencyLimit,
		Details: map[string]any{
			"scope": "context", "contextId": c.ID, "limit": limit,
			"working": c.Working, "workingTaskIds": working,
		},
	}
}

// errTaskBusy refuses a new message for a task that is still working on a
// previous one: a task runs one message at a time, whatever the policy.
func errTaskBusy(c *Context, t *Task) *Error {
	return &Error{
		Code: CodeConcurrencyLimit,
		Message: fmt.Sprintf("task %s is still working on message %s; send the next message when it finishes or needs input",
			t.ID, t.MessageID),
		Err:      ErrConcurrencyLimit,
		A2AError: A2AErrorConcurrencyLimit,
		Details: map[string]any{
			"scope": "task", "contextId": c.ID, "taskId": t.ID, "limit": 1,
			"working": 1, "workingMessageId": t.MessageID,
		},
	}
}

func errActiveContexts(contextID string, live, limit int) *Error {
	return &Error{
		Code: CodeActiveContextsLimit,
		Message: fmt.Sprintf("the agent already holds %d active context(s), the limit is %d; continue an existing context or retry when one expires",
			live, limit),
		Err:      ErrActiveContextsLimit,
		A2AError: A2AErrorActiveContextsLimit,
		Details:  map[string]any{"scope": "agent", "contextId": contextID, "limit": limit, "active": live},
	}
}

// errCallerContexts: the caller holds its share of the agent's contexts. The same code and
// a2a_error as the agent-wide limit (what the caller can do is the same), scope "caller".
func errCallerContexts(contextID, caller string, live, limit int) *Error {
	return &Error{
		Code: CodeActiveContextsLimit,
		Message: fmt.Sprintf("you already hold %d active context(s) with this agent, your share is %d; continue an existing context or retry when one expires",
			live, limit),
		Err:      ErrActiveContextsLimit,
		A2AError: A2AErrorActiveContextsLimit,
		Details:  map[string]any{"scope": "caller", "caller": caller, "contextId": contextID, "limit": limit, "active": live},
	}
}
