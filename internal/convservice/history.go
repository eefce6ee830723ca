package convservice

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
	"github.com/a2a-fleet/a2a-fleet/internal/ownership"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

// maxListPageSize caps ListTasks pages (the history per context is bounded
// by the policy anyway).
const maxListPageSize = 100

func (s *history) onHistoryRequest(p *paho.Publish) {
	in := newInbound(p)
	s.work.dispatch(in.corr, func() { s.handleHistory(in) })
}

// handleHistory serves GetTask and ListTasks (by contextId) from the store
// on the service's own request topic. The caller is the publisher the broker
// stamped, and the request must name one of its reply topics.
// The agent whose history is read is params.tenant ("org/unit/agent"),
// defaulting to the caller: a responder reads its own conversations, and a
// requester may read the contexts it opened with a gated agent, nobody
// else's.
func (s *history) handleHistory(in *inbound) {
	ctx, cancel := context.WithTimeout(context.Background(), handleTimeout)
	defer cancel()
	// The caller is the publisher the broker stamped, asking on its own
	// reply topic (verifySender): nobody else is ever answered.
	if !s.adm.verifySender(in) || !s.adm.checkRequest(ctx, in) {
		return
	}
	req := s.adm.decode(ctx, in, false)
	if req == nil {
		return
	}
	caller := in.caller.String()
	var scope struct {
		Tenant string `json:"tenant"`
	}
	_ = json.Unmarshal(req.Params, &scope)
	agent := caller
	if scope.Tenant != "" {
		agent = scope.Tenant
	}
	now := s.cfg.Now()
	p := s.agents.policyOf(agent)
	var result any
	var rerr *rpcerr.Error
	var sv served
	method, _ := conversation.ParseMethod(req.Method)
	role := s.place.historyRole(agent)
	if role != historyIgnore && !s.withinHistoryRate(in, agent) {
		// Only the replica that answers counts the caller's rate.
		return
	}
	switch role {
	case historyIgnore:
		// Every replica receives history queries; the one that owns the
		// agent answers from memory.
		return
	case historyUnavailable:
		if s.owners != nil && s.owners.Place(agent) == ownership.PlaceSoon && s.place.parkUntilHeld(in, agent, func() { s.handleHistory(in) }) {
			// This replica is taking the agent over: answer once it has.
			return
		}
		rerr = rpcerr.New(rpcerr.NameResponderUnavailable,
			fmt.Sprintf("the history of %s is being taken over by another conversation service replica; retry", agent), nil)
	default:
		if s.owners != nil {
			// An event another replica relayed after the agent moved here
			// is in the inbox before its requester saw it: answer with it.
			s.owners.ApplyPending(ctx, agent)
		}
		allowed := func(c *conversation.Context) bool { return caller == agent || (c != nil && c.Requester == caller) }
		switch method {
		case conversation.MethodGetTask:
			result, rerr = s.getTask(agent, p, now, req, allowed, &sv)
		case conversation.MethodListTasks:
			result, rerr = s.listTasks(agent, p, now, req, allowed, &sv)
		default:
			rerr = rpcerr.NewA2A(a2a.ErrMethodNotFound, fmt.Sprintf("method %q is not served by the conversation service: it answers GetTask and ListTasks", req.Method), nil, now)
		}
	}
	if caller == agent && sv.contextID != "" {
		// What the agent was shown about a context is part of the
		// accepted_history_digest of the runs going on in it.
		s.runs.servedHistory(agent, s.runningTasks(agent, sv.contextID), sv.messages, sv.artifacts)
	}
	b, err := encodeResponse(req.ID, result, rerr)
	if err != nil {
		s.log.Error(err, "encode history reply")
		return
	}
	s.out.send(ctx, in, b)
}

// withinHistoryRate charges a history query: a governed agent reading its own conversations to
// its own-history budget, anyone else to its caller's rate (ratelimit.go).
func (s *history) withinHistoryRate(in *inbound, agent string) bool {
	if agent == in.caller.String() && s.agents.agent(agent) != nil {
		return s.adm.withinOwnHistoryRate(in)
	}
	return s.adm.withinRate(in)
}

// served collects what a history answer showed (the digest's inputs).
type served struct {
	contextID string
	messages  map[uint64]*a2a.Message
	artifacts []string
}

func (s *history) getTask(agent string, p conversation.Policy, now time.Time, req *a2amqtt.InboundRequest, allowed func(*conversation.Context) bool, sv *served) (any, *rpcerr.Error) {
	var params a2a.GetTaskRequest
	if len(req.Params) > 0 {
		if err := json.Unmarshal(req.Params, &params); err != nil {
			return nil, rpcerr.NewA2A(a2a.ErrInvalidParams, "params: "+err.Error(), nil, now)
		}
	}
	if req.TaskID == "" {
		return nil, rpcerr.NewA2A(a2a.ErrInvalidParams, "params.id (the task id) is required", nil, now)
	}
	c, t := s.mem.Task(agent, req.TaskID)
	if t == nil || !c.Live(p, now) || !allowed(c) || (p.History == a2av1.HistoryNone && t.Terminal()) {
		return nil, rpcerr.NewA2A(a2a.ErrTaskNotFound, fmt.Sprintf("task %s not found in the conversation history of %s", req.TaskID, agent), nil, now)
	}
	_, items := s.mem.History(agent, c.ID)
	sv.contextID = c.ID
	// A2A v1.0 GetTask: historyLength unset = the whole history, 0 = none.
	return s.renderTask(c.ID, t, items, params.HistoryLength, true, sv), nil
}

// listHistoryDefault is how many messages per task ListTasks returns when
// historyLength is unset (a2a-go's task store default).
const listHistoryDefault = 100

func (s *history) listTasks(agent string, p conversation.Policy, now time.Time, req *a2amqtt.InboundRequest, allowed func(*conversation.Context) bool, sv *served) (any, *rpcerr.Error) {
	var params a2a.ListTasksRequest
	if len(req.Params) > 0 {
		if err := json.Unmarshal(req.Params, &params); err != nil {
			return nil, rpcerr.NewA2A(a2a.ErrInvalidParams, "params: "+err.Error(), nil, now)
		}
	}
	if params.ContextID == "" {
		return nil, rpcerr.NewA2A(a2a.ErrInvalidParams, "params.contextId is required: the conversation service lists the tasks of one context", nil, now)
	}
	c, items := s.mem.History(agent, params.ContextID)
	resp := &a2a.ListTasksResponse{Tasks: []*a2a.Task{}}
	if c != nil && !allowed(c) {
		// Indistinguishable from an unknown context: no probing of others' ids.
		c = nil
	}
	if c != nil && c.Expired != nil {
		return nil, rpcerr.New(rpcerr.NameContextExpired,
			fmt.Sprintf("context %s expired at %s; its history is gone", c.ID, c.Expired.At.UTC().Format(time.RFC3339)),
			map[string]any{"contextId": c.ID, "reason": string(c.Expired.Reason), "expiredAt": c.Expired.At.UTC().Format(time.RFC3339)})
	}
	if c == nil || !c.Live(p, now) {
		return resp, nil
	}
	sv.contextID = c.ID
	historyLength := params.HistoryLength
	if historyLength == nil {
		n := listHistoryDefault
		historyLength = &n
	}
	// Newest first, as A2A's ListTasks orders by last update.
	tasks := slices.Clone(c.Tasks)
	slices.Reverse(tasks)
	size := params.PageSize
	if size <= 0 || size > maxListPageSize {
		size = maxListPageSize
	}
	for _, t := range tasks {
		if params.Status != "" && conversation.ParseState(string(params.Status)) != t.State {
			continue
		}
		if p.History == a2av1.HistoryNone && t.Terminal() {
			continue
		}
		resp.TotalSize++
		if len(resp.Tasks) < size {
			resp.Tasks = append(resp.Tasks, s.renderTask(c.ID, t, items, historyLength, params.IncludeArtifacts, sv))
		}
	}
	resp.PageSize = size
	return resp, nil
}

// renderTask renders a task as an A2A v1.0 Task: the engine's summary
// (state, times, the engine's own status message, the continuation hint
// with its digest under the extension URI in metadata) and, in history mode
// Messages, its messages (the last historyLength; nil = all) and artifacts.
func (s *history) renderTask(contextID string, t *conversation.Task, items []*convstore.Item, historyLength *int, withArtifacts bool, sv *served) *a2a.Task {
	out := taskOf(contextID, t)
	var msgs []*a2a.Message
	var seqs []uint64
	for _, it := range items {
		if it.TaskID != t.ID {
			continue
		}
		switch it.Kind {
		case convstore.ItemMessage:
			var m a2a.Message
			if err := json.Unmarshal(it.Data, &m); err != nil {
				s.log.Info("skipping a history message that does not decode", "task", t.ID, "message", it.Key, "err", err.Error())
				continue
			}
			msgs, seqs = append(msgs, &m), append(seqs, it.Seq)
		case convstore.ItemArtifact:
			if !withArtifacts {
				continue
			}
			var a a2a.Artifact
			if err := json.Unmarshal(it.Data, &a); err != nil {
				s.log.Info("skipping a history artifact that does not decode", "task", t.ID, "artifact", it.Key, "err", err.Error())
				continue
			}
			out.Artifacts = append(out.Artifacts, &a)
			sv.artifacts = append(sv.artifacts, string(a.ID))
		}
	}
	if historyLength != nil && *historyLength >= 0 && *historyLength < len(msgs) {
		cut := len(msgs) - *historyLength
		msgs, seqs = msgs[cut:], seqs[cut:]
	}
	if len(msgs) > 0 {
		out.History = msgs
		if sv.messages == nil {
			sv.messages = map[uint64]*a2a.Message{}
		}
		for i, m := range msgs {
			sv.messages[seqs[i]] = m
		}
	}
	return out
}

// runningTasks lists the tasks of a context that are in a run.
func (s *history) runningTasks(agent, contextID string) []string {
	c := s.mem.Context(agent, contextID)
	if c == nil {
		return nil
	}
	var out []string
	for _, t := range c.Tasks {
		if runningState(t.State) {
			out = append(out, t.ID)
		}
	}
	return out
}

// taskOf renders the engine's task summary as an A2A Task: state, times,
// the engine's own status message (an input-required timeout) and the
// continuation hint of a paused task.
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
	if t.Continuation != nil {
		out.Metadata[a2amqtt.ContinuationExtensionURI] = wireHint(*t.Continuation)
	}
	return out
}
