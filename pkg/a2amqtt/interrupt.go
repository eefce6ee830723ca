package a2amqtt

import (
	"encoding/json"
	"errors"
	"maps"
	"slices"

	"github.com/a2aproject/a2a-go/v2/a2a"
)

// ContinuationExtension is the agent card entry that declares the continuation hint extension
// (capabilities.extensions); optional for clients, so a client that ignores it loses nothing
// but precision.
func ContinuationExtension() a2a.AgentExtension {
	return a2a.AgentExtension{
		URI: ContinuationExtensionURI,
		Description: "input-required/auth-required status messages carry a continuation hint " +
			"(expected_input, resume_scope, history_policy, accepted_history_digest) in metadata under this URI",
	}
}

// DeclareContinuation adds ContinuationExtension to card's capabilities (once) and returns card.
func DeclareContinuation(card *a2a.AgentCard) *a2a.AgentCard {
	if card != nil && !DeclaresExtension(card, ContinuationExtensionURI) {
		card.Capabilities.Extensions = append(card.Capabilities.Extensions, ContinuationExtension())
	}
	return card
}

// DeclaresExtension reports whether card lists the extension uri in its capabilities.
func DeclaresExtension(card *a2a.AgentCard, uri string) bool {
	if card == nil {
		return false
	}
	return slices.ContainsFunc(card.Capabilities.Extensions, func(e a2a.AgentExtension) bool { return e.URI == uri })
}

// InputRequired is the status update that pauses task at input-required with the continuation
// hint c on its status message: the one call an executor makes,
//
//	yield(a2amqtt.InputRequired(ec, question, a2amqtt.Continuation{ExpectedInput: a2amqtt.ExpectApproval}), nil)
//
// msg is not modified (a copy carries the hint); its task and context ids default to task's and
// its role to agent. A nil msg becomes an agent message naming what is expected.
func InputRequired(task a2a.TaskInfoProvider, msg *a2a.Message, c Continuation) *a2a.TaskStatusUpdateEvent {
	return interrupt(task, a2a.TaskStateInputRequired, msg, c)
}

// AuthRequired is InputRequired for auth-required (typically ExpectedInput: ExpectCredential).
func AuthRequired(task a2a.TaskInfoProvider, msg *a2a.Message, c Continuation) *a2a.TaskStatusUpdateEvent {
	return interrupt(task, a2a.TaskStateAuthRequired, msg, c)
}

func interrupt(task a2a.TaskInfoProvider, state a2a.TaskState, msg *a2a.Message, c Continuation) *a2a.TaskStatusUpdateEvent {
	var m a2a.Message
	if msg != nil {
		m = *msg
		m.Metadata = maps.Clone(msg.Metadata)
		m.Extensions = slices.Clone(msg.Extensions)
	} else {
		m = *a2a.NewMessage(a2a.MessageRoleAgent, a2a.NewTextPart(expectationText(state, c)))
	}
	info := task.TaskInfo()
	if m.TaskID == "" {
		m.TaskID = info.TaskID
	}
	if m.ContextID == "" {
		m.ContextID = info.ContextID
	}
	if m.Role == "" {
		m.Role = a2a.MessageRoleAgent
	}
	if m.ID == "" {
		m.ID = a2a.NewMessageID()
	}
	SetContinuation(&m, c)
	return a2a.NewStatusUpdateEvent(task, state, &m)
}

// expectationText is the question of an interruption without a message of its own.
func expectationText(state a2a.TaskState, c Continuation) string {
	switch c.ExpectedInput {
	case ExpectApproval:
		return "Approval expected: answer approve or deny."
	case ExpectCredential:
		return "Credentials expected."
	case ExpectStructuredArtifact:
		return "Structured input expected."
	}
	if state == a2a.TaskStateAuthRequired {
		return "Authentication required."
	}
	return "Input required."
}

// Interruption is what a requester learns when a task pauses: the state (input-required or
// auth-required), the agent's question and, when the responder declared one, its continuation
// hint.
type Interruption struct {
	TaskID    a2a.TaskID
	ContextID string
	State     a2a.TaskState
	Message   *a2a.Message
	// Continuation is the hint (nil when the responder declared none or it is malformed).
	Continuation *Continuation
	// HintError reports a hint that is present but malformed.
	HintError error
}

// Question is the text of the agent's status message.
func (i Interruption) Question() string { return TextOf(i.Message) }

// ExpectsApproval reports whether the hint asks for an approve/deny answer.
func (i Interruption) ExpectsApproval() bool {
	return i.Continuation != nil && i.Continuation.ExpectedInput == ExpectApproval
}

// InterruptionOf reads an interruption from a stream event or a SendMessage result (a Task or a
// status update in input-required/auth-required); ok is false for anything else.
func InterruptionOf(ev a2a.Event) (Interruption, bool) {
	var i Interruption
	switch v := ev.(type) {
	case *a2a.Task:
		i = Interruption{TaskID: v.ID, ContextID: v.ContextID, State: v.Status.State, Message: v.Status.Message}
	case *a2a.TaskStatusUpdateEvent:
		i = Interruption{TaskID: v.TaskID, ContextID: v.ContextID, State: v.Status.State, Message: v.Status.Message}
	default:
		return Interruption{}, false
	}
	if i.State != a2a.TaskStateInputRequired && i.State != a2a.TaskStateAuthRequired {
		return Interruption{}, false
	}
	c, ok, err := ContinuationOf(i.Message)
	switch {
	case err != nil:
		i.HintError = err
	case ok:
		i.Continuation = &c
	}
	return i, true
}

// continuationMismatchData is error.data of a -32063 refusal.
type continuationMismatchData struct {
	A2AError  string       `json:"a2a_error"`
	Expected  Continuation `json:"expected"`
	Reason    string       `json:"reason"`
	TaskID    string       `json:"taskId,omitempty"`
	ContextID string       `json:"contextId,omitempty"`
}

// NewContinuationMismatch builds the -32063 continuation_mismatch error: error.data carries the
// hint the answer violated (expected), the reason, and the waiting task and context.
func NewContinuationMismatch(expected Continuation, taskID a2a.TaskID, contextID, reason string) *RPCError {
	data, _ := json.Marshal(continuationMismatchData{
		A2AError: A2AErrorContinuationMismatch, Expected: expected, Reason: reason, TaskID: string(taskID), ContextID: contextID,
	})
	return &RPCError{Code: CodeContinuationMismatch, Message: reason, Data: data}
}

// ContinuationMismatchOf reports whether err is a -32063 continuation_mismatch refusal and
// returns the hint it names and the reason.
func ContinuationMismatchOf(err error) (expected Continuation, reason string, ok bool) {
	var rpcErr *RPCError
	if !errors.As(err, &rpcErr) || rpcErr.Code != CodeContinuationMismatch || rpcErr.A2AError() != A2AErrorContinuationMismatch {
		return Continuation{}, "", false
	}
	var d continuationMismatchData
	if json.Unmarshal(rpcErr.Data, &d) != nil {
		return Continuation{}, rpcErr.Message, true
	}
	if d.Reason == "" {
		d.Reason = rpcErr.Message
	}
	return d.Expected, d.Reason, true
}
