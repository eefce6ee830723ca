// Package identity is the one home of every name the operator, the conversation service and the
// tests derive from an Agent: its A2A identity (org/unit/agent), its broker username, the broker
// objects (roles, groups) that carry its ACLs, the Kubernetes names and keys of its credentials,
// the labels and indexes the controllers use, and the conversation service's own identity.
//
// Topic literals ($a2a/v1/...) belong to pkg/a2amqtt; this package only composes them.
package identity

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/mqtt/acl"
	"github.com/a2a-fleet/a2a-fleet/pkg/a2amqtt"
)

// BrokerPrefix marks every broker object (client, role, group) the operator owns: the broker
// model's acl.DefaultPrefix.
const BrokerPrefix = acl.DefaultPrefix

// Of is the Agent's resolved identity: spec.agentID defaults to metadata.name.
func Of(agent *a2av1.Agent) a2amqtt.AgentRef {
	agentID := agent.Spec.AgentID
	if agentID == "" {
		agentID = agent.Name
	}
	return a2amqtt.AgentRef{Org: agent.Spec.OrgID, Unit: agent.Spec.UnitID, Agent: agentID}
}

// Username is the broker username of an agent identity: its Client ID under BrokerPrefix.
func Username(id a2amqtt.AgentRef) string { return BrokerPrefix + id.ClientID() }

// BrokerUsername is the broker username of an Agent.
func BrokerUsername(agent *a2av1.Agent) string { return Username(Of(agent)) }

// Broker object names of one agent.
func AgentRoleName(id a2amqtt.AgentRef) string   { return BrokerPrefix + "agent:" + id.ClientID() }
func CallersRoleName(id a2amqtt.AgentRef) string { return BrokerPrefix + "callers:" + id.ClientID() }

// CallersGroupName is the group whose members may call the agent (selector-admitted callers).
func CallersGroupName(id a2amqtt.AgentRef) string { return BrokerPrefix + "callers:" + id.ClientID() }

// GateRoleName is the role that lets the conversation service stand in front of a gated agent.
func GateRoleName(id a2amqtt.AgentRef) string { return BrokerPrefix + "gate:" + id.ClientID() }

// UnitGroupName is the group every agent of a unit belongs to.
func UnitGroupName(org, unit string) string { return BrokerPrefix + "unit:" + org + "/" + unit }

// OrgGroupName is the group every agent of an organization belongs to.
func OrgGroupName(org string) string { return BrokerPrefix + "org:" + org }

// OrgRoleName is the role of OrgGroupName.
func OrgRoleName(org string) string { return BrokerPrefix + "org:" + org }

// The operator's own broker identity, which publishes the retained registration cards and
// watches which cards the broker holds.
const (
	OperatorUsername = BrokerPrefix + "operator"
	OperatorRoleName = BrokerPrefix + "operator"
	// OperatorSyncTopic is where the operator's card connection sends itself a marker: when it
	// comes back, every retained card the broker delivered for a subscription made before it has
	// arrived. Only the operator may use it.
	OperatorSyncTopic = "$a2a-fleet/operator/sync"
	// SentinelRoleName is an empty role the operator keeps on the broker: when it is missing,
	// the broker has lost its identities (a restart without persistence, a restore of an old
	// backup) and the operator resyncs every Agent at once instead of waiting for the resync
	// period.
	SentinelRoleName = BrokerPrefix + "sentinel"
)

// Kubernetes names, keys and labels of what the operator creates for an Agent.
const (
	// Keys of the credentials Secret: the SDK's credentials folder files, so the Secret mounted as a
	// volume is one (a2amqtt.CredentialsDir); workloads also get them as env vars.
	SecretKeyUsername = a2amqtt.CredentialsFileUsername
	SecretKeyPassword = a2amqtt.CredentialsFilePassword
	SecretKeyClientID = a2amqtt.CredentialsFileClientID
	// SecretKeyCA holds the PEM CA bundle that verifies the workloads' broker, when the operator is
	// given one (--workload-broker-ca-file). The SDK's credentials folder has no CA file of its own:
	// the workload's A2A_TLS_CA (a2amqtt.EnvTLSCA) names this key's file in the mounted Secret, and
	// the SDK re-reads it at every TLS handshake. ca.crt is the key cert-manager and
	// kubernetes.io/tls Secrets use for the same bundle.
	SecretKeyCA = "ca.crt"

	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByValue = "a2a-fleet"
	LabelAgent     = "a2a.fleet.dev/agent"
)

// CredentialsSecretName is the name of the Secret holding an Agent's broker credentials.
func CredentialsSecretName(agent *a2av1.Agent) string { return agent.Name + "-mqtt-credentials" }

// Field indexes on the operator's cache.
const (
	// IndexAgentClientID indexes Agents by their resolved MQTT Client ID {org}/{unit}/{agent}.
	IndexAgentClientID = "a2a.fleet.dev/client-id"
	// IndexAgentPolicy indexes Agents by status.conversationPolicy.
	IndexAgentPolicy = "a2a.fleet.dev/conversation-policy"
	// IndexAgentCallerRule indexes Agents with callers.from selectors by one label pair each
	// selector requires ("{namespace}|{key}={value}", or "*|..." for a rule with a namespace
	// selector, "...|*" for a selector without matchLabels), so that the rules that may admit an
	// Agent are found from its labels instead of by scanning every rule (registration.RuleIndex).
	IndexAgentCallerRule = "a2a.fleet.dev/caller-rule"
)

// NewPassword returns a broker password: 32 random bytes, URL-safe base64 encoded (256 bits of
// entropy). Every credential the operator issues comes from here.
func NewPassword() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate password: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// SenderProperty is the MQTT user property in which the broker tells subscribers who published a
// message: the publisher's broker username. The broker sets it and drops any copy the publisher
// sent: the embedded broker's hook, and on Mosquitto 2.0 the sender-stamp plugin
// (hack/mosquitto-plugin), which also keeps Wills (that it cannot stamp) off request topics. A
// message without it comes from a broker that cannot say who published.
const SenderProperty = "a2a-fleet-sender"
