package identity

import "github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"

// The conversation service stands in front of the agents a ConversationPolicy governs ("gated"
// agents):
//
//   - requesters keep publishing to the agent's public request topic, which only the service
//     reads (a shared subscription where the broker delivers $-topics to them);
//   - the service forwards valid requests to the agent's delivery topic, which only the service
//     may publish to and only the agent may read;
//   - the agent replies to the service's reply topics; the service relays every event to the
//     original Response Topic with the original Correlation Data.
//
// The operator (ACLs, status, workload env) and the service both use these names.

// ShareGroup is the shared-subscription group of the conversation service replicas.
const ShareGroup = "a2a-conversation"

// Service is the conversation service's own place in the topic namespace: it receives history
// queries on Service.RequestTopic() and replies on its reply topics.
var Service = a2amqtt.AgentRef{Org: ReservedOrg, Unit: "system", Agent: "conversation-service"}

// ReservedOrg is the organization of the operator's and the service's own identities.
const ReservedOrg = "a2a-fleet"

// ServiceUsername is the broker username of every service replica (each connects with its own
// client ID).
const ServiceUsername = BrokerPrefix + "conversation-service"

// ServiceGroupName is the group of the conversation service's clients.
const ServiceGroupName = BrokerPrefix + "conversation-service"

// DeliveryTopic is where the service forwards requests for a gated agent.
func DeliveryTopic(id a2amqtt.AgentRef) string { return id.Topic(a2amqtt.MethodDelivery) }

// RequestSubscription is the service's shared subscription to a gated agent's public request topic.
func RequestSubscription(id a2amqtt.AgentRef) string {
	return a2amqtt.SharedSubscription(ShareGroup, id.RequestTopic())
}

// ServiceReplyFilter covers every reply topic of the service replicas.
func ServiceReplyFilter() string { return Service.Topic(a2amqtt.MethodReply) + "/#" }
