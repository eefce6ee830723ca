package convservice

import (
	"bytes"
	"context"
	"encoding/json"
	"sync"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
	"github.com/a2a-fleet/a2a-fleet/pkg/rpcerr"
)

// Task ids between requesters and agents (issue 12.5). The profile has the
// requester create Task.id; a core A2A server (the A2A JS SDK's, a2a-go's
// default handler) creates task ids itself and answers a message naming an
// id it does not know with -32001 TaskNotFound. The service bridges the two
// for governed agents, so neither side needs a shim:
//
//   - it forwards a new task as the profile says (the requester's taskId);
//   - when the agent answers that first message with -32001, the service
//     learns that the agent creates task ids, presents the same request
//     again without params.message.taskId (core A2A: "a new task"), and from
//     then on presents every new task to that agent that way;
//   - the agent's first event names its task id: the service records it with
//     the task (agent ids are durable with the task) and translates every
//     relayed event back to the requester's ids; resumes, GetTask,
//     CancelTask and SubscribeToTask are translated to the agent's id;
//   - symmetrically, an agent in that mode that refuses a message without
//     taskId with the profile's -32005 transport_protocol_error (a profile
//     responder redeployed in its place) is switched back.
//
// The mode is per agent and in memory; a restarted replica learns it again
// from the recovered tasks that carry agent ids, or from the next first
// answer. Context ids are passed as they are (core servers keep the
// message's contextId); an agent that answers with another context id gets
// it translated like the task id.
type idModes struct {
	mu sync.Mutex
	m  map[string]bool // agent → creates its own task ids
}

func newIDModes() *idModes { return &idModes{m: map[string]bool{}} }

// agentCreatesIDs reports whether agent creates its own task ids.
func (s *taskIDs) agentCreatesIDs(agent string) bool {
	s.ids.mu.Lock()
	v, known := s.ids.m[agent]
	s.ids.mu.Unlock()
	if known {
		return v
	}
	v = s.mem.MapsTaskIDs(agent)
	s.ids.mu.Lock()
	if _, raced := s.ids.m[agent]; !raced {
		s.ids.m[agent] = v
	}
	s.ids.mu.Unlock()
	return v
}

func (s *taskIDs) setAgentCreatesIDs(agent string, v bool) {
	s.ids.mu.Lock()
	s.ids.m[agent] = v
	s.ids.mu.Unlock()
}

// withoutTaskID removes params.message.taskId from a send request: a new
// task as core A2A presents it.
func withoutTaskID(payload []byte) ([]byte, error) {
	return editJSON(payload, func(env map[string]json.RawMessage) error {
		return editObject(env, "params", func(params map[string]json.RawMessage) error {
			return editObject(params, "message", func(msg map[string]json.RawMessage) error {
				delete(msg, "taskId")
				return nil
			})
		})
	})
}

// toAgentIDs rewrites a request naming the requester's task (and context)
// to the agent's ids: params.message.taskId/contextId of a send,
// params.id of GetTask/CancelTask/SubscribeToTask.
func toAgentIDs(payload []byte, m conversation.Method, t *conversation.Task) ([]byte, error) {
	set := func(obj map[string]json.RawMessage, key, v string) error {
		if v == "" {
			return nil
		}
		b, err := json.Marshal(v)
		obj[key] = b
		return err
	}
	return editJSON(payload, func(env map[string]json.RawMessage) error {
		return editObject(env, "params", func(params map[string]json.RawMessage) error {
			switch m {
			case conversation.MethodSendMessage, conversation.MethodSendStreamingMessage:
				return editObject(params, "message", func(msg map[string]json.RawMessage) error {
					if err := set(msg, "taskId", t.AgentTaskID); err != nil {
						return err
					}
					return set(msg, "contextId", t.AgentContextID)
				})
			default:
				return set(params, "id", t.AgentTaskID)
			}
		})
	})
}

// withContextProperty replaces the a2a-context-id user property (a request
// translated to the agent's context id must not contradict itself).
func withContextProperty(user paho.UserProperties, contextID string) paho.UserProperties {
	if contextID == "" || user.Get(a2amqtt.PropContextID) == "" {
		return user
	}
	out := make(paho.UserProperties, 0, len(user))
	for _, p := range user {
		if p.Key == a2amqtt.PropContextID {
			p.Value = contextID
		}
		out = append(out, p)
	}
	return out
}

// idPair translates one id of the agent's to the requester's.
type idPair struct{ agent, requester string }

// toRequesterIDs rewrites every JSON string in a reply that equals an
// agent-side id to the requester's id (a task's id, its events' taskId, the
// taskId of its status and history messages). Only whole JSON string
// values match, and ids are opaque, server-generated strings, so text that
// merely mentions an id is left alone; the rest of the payload is kept byte
// for byte.
func toRequesterIDs(payload []byte, pairs []idPair) []byte {
	for _, p := range pairs {
		if p.agent == "" || p.agent == p.requester {
			continue
		}
		from, err1 := json.Marshal(p.agent)
		to, err2 := json.Marshal(p.requester)
		if err1 != nil || err2 != nil {
			continue
		}
		payload = bytes.ReplaceAll(payload, from, to)
	}
	return payload
}

// reshape handles the first answer of an agent to a new task that shows the
// agent takes task ids the other way round (-32001 to the requester's id;
// -32005 to a request without one): the service learns the agent's mode
// and presents the same request again in the other shape. It reports
// whether it did (the error is then not relayed).
func (s *replies) reshape(ctx context.Context, rt route, pr parsedReply) bool {
	ru := s.runs.get(rt.Agent, rt.TaskID)
	if ru == nil || ru.reshaped || ru.in == nil {
		return false
	}
	createsIDs := false
	switch {
	case !ru.agentIDs && pr.errCode == rpcerr.CodeTaskNotFound:
		createsIDs = true // core A2A: TaskNotFound for an id it did not create
	case ru.agentIDs && pr.errCode == a2amqtt.CodeTransportProtocolError && pr.errKind == a2amqtt.A2AErrorTransportProtocolError:
		createsIDs = false // profile responder: taskId is required
	default:
		return false
	}
	c, t := s.mem.Task(rt.Agent, rt.TaskID)
	if c == nil || t == nil || t.State != a2a.TaskStateSubmitted || t.PrevState != a2a.TaskStateUnspecified || t.AgentTaskID != "" {
		return false // not the first answer to a new task
	}
	g := s.agents.agent(rt.Agent)
	if g == nil {
		return false
	}
	s.ids.setAgentCreatesIDs(rt.Agent, createsIDs)
	payload := ru.in.payload
	if createsIDs {
		var err error
		if payload, err = withoutTaskID(payload); err != nil {
			s.log.Info("cannot present the task without its id", "agent", rt.Agent, "task", rt.TaskID, "err", err.Error())
			return false
		}
	}
	ru.reshaped, ru.agentIDs = true, createsIDs
	s.log.Info("agent takes task ids the other way; presenting the task again", "agent", rt.Agent, "task", rt.TaskID,
		"agent_creates_task_ids", createsIDs, "first_answer_code", pr.errCode)
	if err := s.fwd.forwardTo(ctx, g, ru.in, payload, ru.in.user, rt, nil); err != nil {
		s.log.Info("cannot present the task again", "agent", rt.Agent, "task", rt.TaskID, "err", err.Error())
		return false
	}
	return true
}

// replyPairs are the translations a reply of an agent that creates its own
// ids needs: the ids it named, back to the route's (the requester's).
func replyPairs(rt route, pr parsedReply) []idPair {
	var pairs []idPair
	if pr.ev.TaskID != "" && pr.ev.TaskID != rt.TaskID {
		pairs = append(pairs, idPair{pr.ev.TaskID, rt.TaskID})
	}
	if pr.ev.ContextID != "" && rt.ContextID != "" && pr.ev.ContextID != rt.ContextID {
		pairs = append(pairs, idPair{pr.ev.ContextID, rt.ContextID})
	}
	return pairs
}
