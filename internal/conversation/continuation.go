package conversation

import (
	"fmt"

	"github.com/a2aproject/a2a-go/v2/a2a"

	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

// Continuation is the continuation hint a responder declared on the status
// message of an input-required or auth-required task (seed 004 §3, the
// extension https://a2a-fleet.dev/extensions/continuation/v1; the service
// parses it with pkg/a2amqtt and hands it over in this form, so the engine
// stays free of transport code). Every field is optional; the wire values
// are the extension's.
type Continuation struct {
	ExpectedInput         string `json:"expected_input,omitempty"`
	ResumeScope           string `json:"resume_scope,omitempty"`
	HistoryPolicy         string `json:"history_policy,omitempty"`
	AcceptedHistoryDigest string `json:"accepted_history_digest,omitempty"`
}

// The hint values the rules act on (the extension's wire values).
const (
	ExpectApproval         = "approval"
	ExpectCredential       = "credential"
	ResumeSameTask         = "same_task"
	ResumeNewTaskInContext = "new_task_in_context"
)

// CodeContinuationMismatch is the JSON-RPC code of a message that does not
// answer a paused task the way its responder declared (pkg/rpcerr).
const CodeContinuationMismatch = rpcerr.CodeContinuationMismatch

// A2AErrorContinuationMismatch is error.data.a2a_error of
// CodeContinuationMismatch.
const A2AErrorContinuationMismatch = rpcerr.NameContinuationMismatch

// ErrContinuationMismatch is the errors.Is target of a continuation refusal.
var ErrContinuationMismatch = rpcerr.ErrContinuationMismatch

// hintOf returns the hint a waiting task declared (nil: none, or the task is
// not waiting: a hint only binds the answer to the pause that declared it).
func hintOf(t *Task) *Continuation {
	if t == nil || !interrupted(t.State) {
		return nil
	}
	return t.Continuation
}

// resumeMismatch checks a new message for the waiting task t against t's
// hint: the answer must go to this task (resume_scope) and be of the declared
// kind (expected_input). It returns nil when the message fits.
func resumeMismatch(c *Context, t *Task, req Request) *Error {
	h := hintOf(t)
	if h == nil {
		return nil
	}
	switch {
	case h.ResumeScope == ResumeNewTaskInContext:
		return errContinuationMismatch(c.ID, t, fmt.Sprintf(
			"task %s asked for its answer in a new task of context %s (resume_scope %s); send the answer with a new taskId in that context",
			t.ID, c.ID, ResumeNewTaskInContext))
	case h.ExpectedInput == ExpectApproval && !req.Approval:
		return errContinuationMismatch(c.ID, t, fmt.Sprintf(
			"task %s waits for an approval (expected_input %s); answer with a data part {\"decision\": \"approve\"|\"deny\"}",
			t.ID, ExpectApproval))
	case h.ExpectedInput == ExpectCredential && t.State != a2a.TaskStateAuthRequired:
		return errContinuationMismatch(c.ID, t, fmt.Sprintf(
			"task %s declared expected_input %s but is in %s, not %s: credentials are only sent to a task that asks for authentication",
			t.ID, ExpectCredential, t.State, a2a.TaskStateAuthRequired))
	}
	return nil
}

// newTaskMismatch checks a new task in context c: a task of c that waits
// with resume_scope same_task must be answered first, with its own task id.
func newTaskMismatch(c *Context) *Error {
	for _, t := range c.Tasks {
		if h := hintOf(t); h != nil && h.ResumeScope == ResumeSameTask {
			return errContinuationMismatch(c.ID, t, fmt.Sprintf(
				"task %s of context %s waits for input and asked to be resumed itself (resume_scope %s); send the answer with taskId %s",
				t.ID, c.ID, ResumeSameTask, t.ID))
		}
	}
	return nil
}

// errContinuationMismatch is -32063 with error.data
// {"a2a_error": "continuation_mismatch", "expected": <the hint>, "reason": ...,
// "taskId": <the waiting task>, "contextId": ...}.
func errContinuationMismatch(contextID string, t *Task, reason string) *Error {
	return rpcerr.New(A2AErrorContinuationMismatch, reason, map[string]any{
		"expected":  *t.Continuation,
		"reason":    reason,
		"taskId":    t.ID,
		"contextId": contextID,
	})
}
