// Package gate names the topics and broker identity through which the conversation service
// stands in front of the agents a ConversationPolicy governs ("gated" agents):
//
//   - requesters keep publishing to the agent's public request topic, which only the service
//     reads (a shared subscription, so replicas split the load);
//   - the service forwards valid requests to the agent's delivery topic, which only the service
//     may publish to and only the agent may read;
//   - the agent replies to the service's reply topics; the service relays every event to the
//     original Response Topic with the original Correlation Data.
//
// The operator (ACLs, status, workload env) and the service both use these names.
package gate

import "github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"

// ShareGroup is the shared-subscription group of the conversation service replicas.
const ShareGroup = "a2a-conversation"

// Service is the conversation service's own place in the topic namespace: it receives history
// queries on Service.RequestTopic() and replies on its reply topics.
var Service = a2amqtt.AgentRef{Org: "a2a-fleet", Unit: "system", Agent: "conversation-service"}

// ServiceUsername is the broker username of every service replica (each connects with its own
// client ID).
const ServiceUsername = "a2a:conversation-service"

// DeliveryTopic is where the service forwards requests for a gated agent.
func DeliveryTopic(id a2amqtt.AgentRef) string {
	return a2amqtt.TopicPrefix + "/delivery/" + id.Org + "/" + id.Unit + "/" + id.Agent
}

// RequestSubscription is the service's shared subscription to a gated agent's public request topic.
func RequestSubscription(id a2amqtt.AgentRef) string {
	return "$share/" + ShareGroup + "/" + id.RequestTopic()
}

// ServiceReplyFilter covers every reply topic of the service replicas.
func ServiceReplyFilter() string { return Service.Topic(a2amqtt.MethodReply) + "/#" }
