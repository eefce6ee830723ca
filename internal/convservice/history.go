package convservice

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// maxListPageSize caps ListTasks pages (the history per context is bounded
// by the policy anyway).
const maxListPageSize = 100

func (s *Service) onHistoryRequest(p *paho.Publish) {
	in := newInbound(p)
	s.dispatch(in.corr, func() { s.handleHistory(in) })
}

// handleHistory serves GetTask and ListTasks (by contextId) from the store
// on the service's own request topic. The caller is the agent whose reply
// topic the request names (only that agent may subscribe to it, by ACL).
// The agent whose history is read is params.tenant ("org/unit/agent"),
// defaulting to the caller: a responder reads its own conversations, and a
// requester may read the contexts it opened with a gated agent, nobody
// else's.
func (s *Service) handleHistory(in *inbound) {
	ctx, cancel := context.WithTimeout(context.Background(), handleTimeout)
	defer cancel()
	if !s.admit(ctx, in) {
		return
	}
	req := s.decode(ctx, in, false)
	if req == nil {
		return
	}
	caller := requesterOf(in.respTo)
	if caller == "" {
		s.replyError(ctx, in, req.ID, a2amqtt.NewBindingError(a2amqtt.A2AErrorTransportProtocolError,
			"history queries must name the querying agent's reply topic ($a2a/v1/reply/{org}/{unit}/{agent}/...) as Response Topic"))
		return
	}
	var scope struct {
		Tenant string `json:"tenant"`
	}
	_ = json.Unmarshal(req.Params, &scope)
	agent := caller
	if scope.Tenant != "" {
		agent = scope.Tenant
	}
	if !s.answersHistoryOf(agent) {
		// Every replica receives history queries; the one that owns the
		// agent answers from memory.
		return
	}
	now := s.cfg.Now()
	p := s.gated.policyOf(agent)
	allowed := func(c *conversation.Context) bool { return caller == agent || (c != nil && c.Requester == caller) }
	var result any
	var rerr *rpcError
	method, _ := conversation.ParseMethod(req.Method)
	switch method {
	case conversation.MethodGetTask:
		result, rerr = s.getTask(ctx, agent, p, now, req, allowed)
	case conversation.MethodListTasks:
		result, rerr = s.listTasks(ctx, agent, p, now, req, allowed)
	default:
		rerr = &rpcError{Code: -32601, Message: fmt.Sprintf("method %q is not served by the conversation service: it answers GetTask and ListTasks", req.Method)}
	}
	b, err := encodeResponse(req.ID, result, rerr)
	if err != nil {
		s.log.Error(err, "encode history reply")
		return
	}
	s.send(ctx, in, b)
}

func (s *Service) getTask(ctx context.Context, agent string, p conversation.Policy, now time.Time, req *a2amqtt.InboundRequest, allowed func(*conversation.Context) bool) (any, *rpcError) {
	if req.TaskID == "" {
		return nil, &rpcError{Code: -32602, Message: "params.id (the task id) is required"}
	}
	ctxID, _ := s.mem.TaskContext(agent, req.TaskID)
	c := s.mem.Context(agent, ctxID)
	t := c.Task(req.TaskID)
	if t == nil || !c.Live(p, now) || !allowed(c) {
		return nil, &rpcError{Code: -32001, Message: fmt.Sprintf("task %s not found in the conversation history of %s", req.TaskID, agent)}
	}
	return taskOf(c.ID, t), nil
}

func (s *Service) listTasks(ctx context.Context, agent string, p conversation.Policy, now time.Time, req *a2amqtt.InboundRequest, allowed func(*conversation.Context) bool) (any, *rpcError) {
	var params a2a.ListTasksRequest
	if len(req.Params) > 0 {
		if err := json.Unmarshal(req.Params, &params); err != nil {
			return nil, &rpcError{Code: -32602, Message: "params: " + err.Error()}
		}
	}
	if params.ContextID == "" {
		return nil, &rpcError{Code: -32602, Message: "params.contextId is required: the conversation service lists the tasks of one context"}
	}
	c := s.mem.Context(agent, params.ContextID)
	resp := &a2a.ListTasksResponse{Tasks: []*a2a.Task{}}
	if c != nil && !allowed(c) {
		// Indistinguishable from an unknown context: no probing of others' ids.
		c = nil
	}
	if c != nil && c.Expired != nil {
		data, _ := json.Marshal(map[string]any{"a2a_error": conversation.A2AErrorContextExpired, "contextId": c.ID,
			"reason": string(c.Expired.Reason), "expiredAt": c.Expired.At.UTC().Format(time.RFC3339)})
		return nil, &rpcError{Code: conversation.CodeContextExpired,
			Message: fmt.Sprintf("context %s expired at %s; its history is gone", c.ID, c.Expired.At.UTC().Format(time.RFC3339)), Data: data}
	}
	if c == nil || !c.Live(p, now) {
		return resp, nil
	}
	// Newest first, as A2A's ListTasks orders by last update.
	tasks := slices.Clone(c.Tasks)
	slices.Reverse(tasks)
	for _, t := range tasks {
		if params.Status != "" && conversation.ParseState(string(params.Status)) != t.State {
			continue
		}
		resp.Tasks = append(resp.Tasks, taskOf(c.ID, t))
	}
	resp.TotalSize = len(resp.Tasks)
	size := params.PageSize
	if size <= 0 || size > maxListPageSize {
		size = maxListPageSize
	}
	if len(resp.Tasks) > size {
		resp.Tasks = resp.Tasks[:size]
	}
	resp.PageSize = size
	return resp, nil
}

// taskOf renders the engine's task summary as an A2A Task. The service
// keeps the rules' view of a task (state, times, the engine's own status
// message), not its content: artifacts and messages stay with the agent.
func taskOf(contextID string, t *conversation.Task) *a2a.Task {
	ts := t.UpdatedAt
	out := &a2a.Task{
		ID: a2a.TaskID(t.ID), ContextID: contextID,
		Status: a2a.TaskStatus{State: t.State, Timestamp: &ts},
		Metadata: map[string]any{
			"createdAt": t.CreatedAt.UTC().Format(time.RFC3339Nano),
			"messageId": t.MessageID,
		},
	}
	if t.StatusMessage != "" {
		out.Status.Message = a2a.NewMessage(a2a.MessageRoleAgent, a2a.NewTextPart(t.StatusMessage))
	}
	return out
}
