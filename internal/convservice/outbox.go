package convservice

// Answers and errors to requesters (outbox).

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// replyError answers the requester itself, echoing its correlation data;
// only a requester verifySender has verified, on its own reply topic.
func (s *outbox) replyError(ctx context.Context, in *inbound, id any, e *a2amqtt.RPCError) {
	if !in.verified {
		s.unverified(in)
		return
	}
	s.answer(ctx, in.respTo, in.corr, id, e)
}

// unverified drops an answer to a requester that was not verified.
func (s *outbox) unverified(in *inbound) {
	s.log.Error(errors.New("answer to an unverified requester"), "not answering", "topic", in.topic, "response_topic", in.respTo)
	s.m.rejections.WithLabelValues(reasonUnverifiedAnswer).Inc()
}

// answer publishes a JSON-RPC error to a requester's reply path.
func (s *outbox) answer(ctx context.Context, respTo string, corr []byte, id any, e *a2amqtt.RPCError) {
	if respTo == "" {
		return
	}
	b, err := encodeResponse(id, nil, e)
	if err != nil {
		s.log.Error(err, "encode error reply")
		return
	}
	s.sendTo(ctx, respTo, corr, b)
}

func (s *outbox) send(ctx context.Context, in *inbound, payload []byte) {
	if !in.verified {
		s.unverified(in)
		return
	}
	s.sendTo(ctx, in.respTo, in.corr, payload)
}

func (s *outbox) sendTo(ctx context.Context, respTo string, corr, payload []byte) {
	_, err := s.publish(ctx, &paho.Publish{
		Topic: respTo, QoS: 1, Payload: payload,
		Properties: &paho.PublishProperties{CorrelationData: corr, ContentType: "application/json"},
	})
	if err != nil {
		s.log.Error(err, "answer requester", "response_topic", respTo)
	}
}

// notifyFailed tells a requester on a stream that already ended that the
// engine failed its task: a final A2A v1.0 statusUpdate (TASK_STATE_FAILED
// with the engine's status message).
func (s *outbox) notifyFailed(ctx context.Context, st conversation.Stream, contextID, taskID, why string) {
	ev := a2a.NewStatusUpdateEvent(a2a.TaskInfo{TaskID: a2a.TaskID(taskID), ContextID: contextID}, a2a.TaskStateFailed,
		a2a.NewMessage(a2a.MessageRoleAgent, a2a.NewTextPart(why)))
	result, err := json.Marshal(map[string]any{"statusUpdate": ev})
	if err != nil {
		s.log.Error(err, "encode failure notice")
		return
	}
	b, err := encodeResponse(nil, json.RawMessage(result), nil)
	if err != nil {
		s.log.Error(err, "encode failure notice")
		return
	}
	s.sendTo(ctx, st.ResponseTopic, st.Correlation, b)
}

// publishTimeout bounds how long publish waits for a PUBACK.
const publishTimeout = 30 * time.Second

// publish sends p, waiting for the PUBACK at most publishTimeout. A handler's
// context already ends sooner (handleTimeout): no second timer per message.
func (s *outbox) publish(ctx context.Context, p *paho.Publish) (*paho.PublishResponse, error) {
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= publishTimeout {
		return s.conn.Publish(ctx, p)
	}
	pctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	return s.conn.Publish(pctx, p)
}
