package conversation

import (
	"fmt"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

// The conversation rules' JSON-RPC codes, a2a_error names and sentinels are pkg/rpcerr's
// (-32060..-32063; docs/conversation.md); the names below are that package's, kept here so that
// the engine's callers read in the engine's terms.
const (
	CodeContextExpired      = rpcerr.CodeContextExpired
	CodeConcurrencyLimit    = rpcerr.CodeConcurrencyLimit
	CodeActiveContextsLimit = rpcerr.CodeActiveContextsLimit
)

// error.data.a2a_error values of the conversation codes.
const (
	A2AErrorContextExpired      = rpcerr.NameContextExpired
	A2AErrorConcurrencyLimit    = rpcerr.NameConcurrencyLimit
	A2AErrorActiveContextsLimit = rpcerr.NameActiveContextsLimit
)

// Sentinels for errors.Is on conversation rejections. Rejections with A2A
// v1.0 codes unwrap to a2a-go's sentinels (a2a.ErrInvalidParams,
// a2a.ErrUnsupportedOperation, a2a.ErrTaskNotCancelable) instead.
var (
	ErrContextExpired      = rpcerr.ErrContextExpired
	ErrConcurrencyLimit    = rpcerr.ErrConcurrencyLimit
	ErrActiveContextsLimit = rpcerr.ErrActiveContextsLimit
)

// Error is a rejection: the JSON-RPC error the service sends back on the
// requester's reply path instead of forwarding the request, as it goes on the
// wire (error.data encoded: named codes {"a2a_error": ..., <details>}, A2A
// v1.0 codes a2a-go's typed-details array, so a rejection from the
// conversation service is indistinguishable from the same rejection by an SDK
// responder).
type Error = rpcerr.Error

func a2aError(now time.Time, sentinel error, msg string, details map[string]any) *Error {
	return rpcerr.NewA2A(sentinel, msg, details, now)
}

func errInvalidParams(now time.Time, msg string, details map[string]any) *Error {
	return a2aError(now, a2a.ErrInvalidParams, msg, details)
}

// errContextMismatch is the profile's -32602 for a task id sent with another
// context id than its own; message and details match pkg/a2amqtt's bridge.
func errContextMismatch(now time.Time, taskID, taskContextID, contextID string) *Error {
	return errInvalidParams(now,
		fmt.Sprintf("contextId %q conflicts with task %s, which belongs to context %q", contextID, taskID, taskContextID),
		map[string]any{"taskId": taskID, "taskContextId": taskContextID, "contextId": contextID}).WithReason("context_mismatch")
}

// errTerminalTask is A2A v1.0's UnsupportedOperation for a message to a
// finished task, in pkg/a2amqtt's wording plus the engine's reason when the
// engine itself failed the task.
func errTerminalTask(now time.Time, t *Task, contextID string) *Error {
	msg := fmt.Sprintf("task %s is in terminal state %s and accepts no further messages; start a new task in context %s", t.ID, t.State, contextID)
	details := map[string]any{"taskId": t.ID, "state": string(t.State)}
	if t.StatusMessage != "" {
		msg = fmt.Sprintf("task %s is in terminal state %s (%s) and accepts no further messages; start a new task in context %s", t.ID, t.State, t.StatusMessage, contextID)
		details["statusMessage"] = t.StatusMessage
	}
	return a2aError(now, a2a.ErrUnsupportedOperation, msg, details).WithReason("terminal_task")
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
	return rpcerr.New(A2AErrorContextExpired, fmt.Sprintf("context %s expired at %s (%s); start a new conversation with a new contextId",
		contextID, e.At.UTC().Format(time.RFC3339), why), details)
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
	return rpcerr.New(A2AErrorConcurrencyLimit, fmt.Sprintf("context %s already has %d working task(s), the limit is %d; retry when a task finishes or needs input",
		c.ID, c.Working, limit), map[string]any{
		"scope": "context", "contextId": c.ID, "limit": limit,
		"working": c.Working, "workingTaskIds": working,
	})
}

// errTaskBusy refuses a new message for a task that is still working on a
// previous one: a task runs one message at a time, whatever the policy.
func errTaskBusy(c *Context, t *Task) *Error {
	return rpcerr.New(A2AErrorConcurrencyLimit, fmt.Sprintf("task %s is still working on message %s; send the next message when it finishes or needs input",
		t.ID, t.MessageID), map[string]any{
		"scope": "task", "contextId": c.ID, "taskId": t.ID, "limit": 1,
		"working": 1, "workingMessageId": t.MessageID,
	})
}

func errActiveContexts(contextID string, live, limit int) *Error {
	return rpcerr.New(A2AErrorActiveContextsLimit, fmt.Sprintf("the agent already holds %d active context(s), the limit is %d; continue an existing context or retry when one expires",
		live, limit), map[string]any{"scope": "agent", "contextId": contextID, "limit": limit, "active": live})
}

// errCallerContexts: the caller holds its share of the agent's contexts. The same code and
// a2a_error as the agent-wide limit (what the caller can do is the same), scope "caller".
func errCallerContexts(contextID, caller string, live, limit int) *Error {
	return rpcerr.New(A2AErrorActiveContextsLimit, fmt.Sprintf("you already hold %d active context(s) with this agent, your share is %d; continue an existing context or retry when one expires",
		live, limit), map[string]any{"scope": "caller", "caller": caller, "contextId": contextID, "limit": limit, "active": live})
}
