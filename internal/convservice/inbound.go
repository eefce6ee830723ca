package convservice

// What a handler takes of a received message, and the constants the paths share.

import (
	"time"

	"github.com/a2aproject/a2a-go/v2/a2a"
	"github.com/eclipse/paho.golang/paho"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// reasonNoMatchingSubscribers is PUBACK reason 0x10: nobody reads the topic
// (the agent is not connected to its delivery topic).
const reasonNoMatchingSubscribers = 0x10

// handleTimeout bounds the store and broker work of one message.
const handleTimeout = 30 * time.Second

// inbound is a copy of what a handler needs of a received publish (paho
// reuses nothing, but the copy keeps handlers independent of it).
type inbound struct {
	topic       string
	payload     []byte
	respTo      string
	corr        []byte
	user        paho.UserProperties
	contentType string
	expiry      *uint32
	received    time.Time
	// parked: the message already waited for its agent to be taken over
	// (parkUntilHeld); it is not held back twice.
	parked bool
	// verified: the publisher is caller (verifySender), and respTo is one of
	// its reply topics; only then is it answered.
	verified bool
	caller   a2amqtt.AgentRef
	// rateChecked: the caller's rate was checked (withinRate), once.
	rateChecked bool
}

func newInbound(p *paho.Publish) *inbound {
	in := &inbound{topic: p.Topic, payload: p.Payload, received: time.Now()}
	if pp := p.Properties; pp != nil {
		in.respTo, in.corr, in.user, in.contentType, in.expiry = pp.ResponseTopic, pp.CorrelationData, pp.User, pp.ContentType, pp.MessageExpiry
	}
	return in
}

// onQueued routes a message that arrived before its handler was registered
// (a persistent session's backlog at reconnect); workers run it once the
// replica is started.
func (s *Service) onQueued(p *paho.Publish) {
	in := newInbound(p)
	s.workers.dispatch(in.corr, func() {
		switch {
		case in.topic == s.replyTopic:
			s.replies.handleReply(in)
		case in.topic == identity.Service.RequestTopic():
			s.history.handleHistory(in)
		default:
			s.requests.handleRequest(in)
		}
	})
}

// streaming reports whether replies to m form a stream (several replies,
// the last one marked by its state) rather than one unary result.
func streaming(m conversation.Method) bool {
	return m == conversation.MethodSendStreamingMessage || m == conversation.MethodSubscribeToTask
}

// runningState reports whether a task in state st is in a run (forwarded,
// not yet paused or finished).
func runningState(st a2a.TaskState) bool {
	return st == a2a.TaskStateSubmitted || st == a2a.TaskStateWorking
}
