package convservice

// Publishing to agents' delivery topics (forwarder).

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
)

// errNoSubscribers: the broker said nobody reads the delivery topic.
var errNoSubscribers = errors.New("no subscriber on the delivery topic")

// forwardTo publishes a request to the agent's delivery topic, with the
// route sealed into its correlation data and the service's reply topic as
// Response Topic. It returns an error when the request was not sent; when
// the broker's PUBACK says nobody reads the delivery topic (or the broker
// refused it, or the session dropped it), failed runs on a goroutine of its
// own: the worker does not wait for the PUBACK (the agent receives the
// request while it travels), so it is free for the next message. With a nil
// failed, forwardTo waits for the PUBACK and returns what it says.
func (s *forwarder) forwardTo(ctx context.Context, g *gatedAgent, in *inbound, payload []byte, user paho.UserProperties, rt route, failed func(error)) error {
	out := &paho.Publish{
		Topic: g.delivery, QoS: 1, Payload: payload,
		Properties: &paho.PublishProperties{
			ResponseTopic:   s.replyTopic,
			CorrelationData: s.seal.seal(rt),
			ContentType:     in.contentType,
			User:            withTrace(ctx, user),
		},
	}
	if in.expiry != nil {
		left := int64(*in.expiry) - int64(time.Since(in.received)/time.Second)
		left = max(left, 1)
		v := uint32(left)
		out.Properties.MessageExpiry = &v
	}
	outcome := func(resp *paho.PublishResponse, err error) error {
		if err == nil && resp != nil && resp.ReasonCode == reasonNoMatchingSubscribers {
			err = errNoSubscribers
		}
		return err
	}
	if failed == nil {
		return outcome(s.out.publish(ctx, out))
	}
	return s.conn.PublishNotify(ctx, out, func(resp *paho.PublishResponse, err error) {
		if err = outcome(resp, err); err != nil {
			// Off the connection's read goroutine: answering publishes.
			go failed(err)
		}
	})
}

// cancelAtAgent sends CancelTask for a task the engine gave up on, so the
// agent frees what it holds; the reply is observed, not relayed.
func (s *forwarder) cancelAtAgent(ctx context.Context, agent, contextID, taskID string) {
	g := s.agents.agent(agent)
	if g == nil {
		return
	}
	corr := make([]byte, 16)
	_, _ = rand.Read(corr)
	agentTaskID := taskID
	if _, t := s.mem.Task(agent, taskID); t != nil && t.AgentTaskID != "" {
		agentTaskID = t.AgentTaskID
	}
	payload, err := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "id": "conversation-service-cancel-" + taskID, "method": "CancelTask",
		"params": map[string]string{"id": agentTaskID},
	})
	if err != nil {
		s.log.Error(err, "encode CancelTask")
		return
	}
	rt := route{Agent: agent, TaskID: taskID, ContextID: contextID, Method: conversation.MethodCancelTask, Correlation: corr, Internal: true}
	_, err = s.out.publish(ctx, &paho.Publish{
		Topic: g.delivery, QoS: 1, Payload: payload,
		Properties: &paho.PublishProperties{ResponseTopic: s.replyTopic, CorrelationData: s.seal.seal(rt), ContentType: "application/json"},
	})
	if err != nil {
		s.log.Info("cannot cancel expired task at the agent", "agent", agent, "task", taskID, "err", err.Error())
	}
}
