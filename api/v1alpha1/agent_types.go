package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AgentSpec is the desired state of an Agent: who it is on the bus, what it tells others about
// itself, who may call it and, optionally, the workload that runs it.
// +kubebuilder:validation:XValidation:rule="has(self.agentID) == has(oldSelf.agentID) && (!has(self.agentID) || self.agentID == oldSelf.agentID)",message="agentID is immutable: delete and recreate the Agent to change its identity"
// orgID and unitID are required by these rules rather than by the schema: a missing required
// field makes the API server skip every CEL rule and add a second, confusing error line
// ("some validation rules were not checked").
// +kubebuilder:validation:XValidation:rule="has(self.orgID)",fieldPath=".orgID",reason=FieldValueRequired,message="orgID is required: the organization segment of the agent's identity ($a2a/v1/request/{orgID}/{unitID}/{agentID})"
// +kubebuilder:validation:XValidation:rule="has(self.unitID)",fieldPath=".unitID",reason=FieldValueRequired,message="unitID is required: the organizational-unit segment of the agent's identity ($a2a/v1/request/{orgID}/{unitID}/{agentID})"
type AgentSpec struct {
	// OrgID is the organization segment of the agent's identity and topics
	// ($a2a/v1/request/{orgID}/{unitID}/{agentID}). It must match ^[A-Za-z0-9_.-]+$ (the A2A over MQTT
	// profile's identifier rule) and not be dots only (. or ..), be at most 64 characters long, and
	// cannot change after creation.
	// The namespace must be allowed to claim it: a Tenant binding the namespace to this org, or,
	// for a namespace no Tenant binds, the org named like the namespace (docs/security.md). The
	// org a2a-fleet is reserved for the operator and the conversation service, in any letter case.
	// Required.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+$`
	// +kubebuilder:validation:XValidation:rule="self.lowerAscii() != 'a2a-fleet'",message="orgID a2a-fleet is reserved for the operator and the conversation service (in any case)"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[.]+$')",message="an identifier of dots only (. or ..) is a path step, not a name: it cannot name a topic level"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="orgID is immutable: delete and recreate the Agent to change its identity"
	OrgID string `json:"orgID"`

	// UnitID is the organizational-unit segment of the agent's identity and topics. Same rules as
	// orgID. Required.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+$`
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[.]+$')",message="an identifier of dots only (. or ..) is a path step, not a name: it cannot name a topic level"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="unitID is immutable: delete and recreate the Agent to change its identity"
	UnitID string `json:"unitID"`

	// AgentID is the agent segment of the identity and topics. It defaults to metadata.name. Same rules
	// as orgID; the resolved value is shown in status.agentID.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+$`
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[.]+$')",message="an identifier of dots only (. or ..) is a path step, not a name: it cannot name a topic level"
	AgentID string `json:"agentID,omitempty"`

	// Card is the content of the A2A agent card that the operator publishes, retained, on the agent's
	// discovery topic.
	Card AgentCardSpec `json:"card"`

	// Callers says which other agents may send requests to this agent. The default admits no one
	// but explicitly selected agents (least privilege).
	// +optional
	// +kubebuilder:default={}
	Callers CallersSpec `json:"callers,omitempty"`

	// PoolID makes the agent a member of the shared pool $a2a/v1/request/{orgID}/{unitID}/pool/{poolID};
	// requests to the pool are load-balanced over its members through an MQTT shared subscription.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+$`
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[.]+$')",message="an identifier of dots only (. or ..) is a path step, not a name: it cannot name a topic level"
	PoolID string `json:"poolID,omitempty"`

	// Workload, when set, is run by the operator as a Deployment with the agent's broker URL,
	// identity, topics and credentials injected as environment variables.
	// +optional
	Workload *AgentWorkload `json:"workload,omitempty"`

	// HTTP connects the agent with A2A over HTTP through a2a-fleet's gateway (docs/gateway.md):
	// the gateway serves it as an A2A v1.0 HTTP endpoint (expose), accepts ServiceAccount tokens as
	// its identity (serviceAccounts), or stands in for an agent that is an HTTP A2A server (url).
	// +optional
	HTTP *AgentHTTP `json:"http,omitempty"`
}

// AgentHTTP connects an agent with A2A over HTTP through the gateway. Who may call the agent is
// still decided by callers (and AgentGrants, ConversationPolicies): an HTTP caller is on the bus
// the Agent whose serviceAccounts lists its ServiceAccount.
type AgentHTTP struct {
	// Expose has the gateway serve this agent as an A2A v1.0 HTTP endpoint
	// ({gateway}/agents/{orgID}/{unitID}/{agentID}/, its card at
	// .well-known/agent-card.json under that path) to authenticated HTTP callers.
	// +optional
	Expose bool `json:"expose,omitempty"`

	// ServiceAccounts are ServiceAccounts of the Agent's namespace whose tokens the gateway
	// accepts as this agent's identity: an HTTP client presenting one calls on the bus as this
	// agent, under its callers rules, grants, policies and limits.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	ServiceAccounts []string `json:"serviceAccounts,omitempty"`

	// URL is the A2A JSON-RPC endpoint of an agent that is an HTTP A2A server (an in-cluster
	// Service or an external URL): the gateway holds this agent's identity on the bus, serves its
	// request topic and forwards each request there.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && (self.startsWith('http://') || self.startsWith('https://'))",message="http.url must be an absolute http:// or https:// URL"
	URL string `json:"url,omitempty"`
}

// AgentCardSpec is the part of an A2A v1.0 AgentCard that the agent's owner declares. The operator
// adds the MQTT interface (topics, transport) itself. Its text may total at most 256 KiB (the most
// a Tenant's limits.maxCardBytes may allow); the published card must also fit the Tenant's
// limits.maxCardBytes (default 64 KiB), which the operator checks before it publishes.
// +kubebuilder:validation:XValidation:rule="size(self.name) + (has(self.description) ? size(self.description) : 0) + (has(self.version) ? size(self.version) : 0) + (has(self.documentationURL) ? size(self.documentationURL) : 0) + (has(self.provider) ? size(self.provider.organization) + (has(self.provider.url) ? size(self.provider.url) : 0) : 0) + (has(self.defaultInputModes) ? self.defaultInputModes.map(m, size(m)).sum() : 0) + (has(self.defaultOutputModes) ? self.defaultOutputModes.map(m, size(m)).sum() : 0) + (has(self.capabilities) && has(self.capabilities.extensions) ? self.capabilities.extensions.map(x, size(x.uri) + (has(x.description) ? size(x.description) : 0)).sum() : 0) + (has(self.skills) ? self.skills.map(k, size(k.id) + size(k.name) + size(k.description) + (has(k.tags) ? k.tags.map(g, size(g)).sum() : 0) + (has(k.examples) ? k.examples.map(e, size(e)).sum() : 0)).sum() : 0) <= 262144",message="the card's text totals more than 256 KiB, more than any Tenant may allow (limits.maxCardBytes; default 64 KiB)"
type AgentCardSpec struct {
	// Name is the human-readable name of the agent.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Name string `json:"name"`

	// Description says what the agent does, for humans and for other agents choosing whom to call.
	// Optional: an A2A agent card must have a description, so when this is empty the published
	// card's description is the name.
	// +optional
	// +kubebuilder:validation:MaxLength=4096
	Description string `json:"description,omitempty"`

	// Version is the version of the agent (not of the protocol).
	// +optional
	// +kubebuilder:default="1.0.0"
	// +kubebuilder:validation:MaxLength=64
	Version string `json:"version,omitempty"`

	// Provider names the organization that runs the agent.
	// +optional
	Provider *AgentProvider `json:"provider,omitempty"`

	// DocumentationURL links to the agent's documentation.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self)",message="documentationURL must be an absolute URL"
	DocumentationURL string `json:"documentationURL,omitempty"`

	// Capabilities are the optional A2A features the agent supports.
	// +optional
	Capabilities AgentCapabilities `json:"capabilities,omitempty"`

	// DefaultInputModes are the media types the agent accepts when a skill does not say otherwise.
	// +optional
	// +kubebuilder:default={"text/plain"}
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=128
	DefaultInputModes []string `json:"defaultInputModes,omitempty"`

	// DefaultOutputModes are the media types the agent produces when a skill does not say otherwise.
	// +optional
	// +kubebuilder:default={"text/plain"}
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=128
	DefaultOutputModes []string `json:"defaultOutputModes,omitempty"`

	// Skills are the things the agent can do.
	// +optional
	// +listType=map
	// +listMapKey=id
	// +kubebuilder:validation:MaxItems=64
	Skills []AgentSkill `json:"skills,omitempty"`
}

// AgentProvider names the organization that runs an agent.
type AgentProvider struct {
	// Organization is the provider's name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Organization string `json:"organization"`

	// URL is the provider's website.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self)",message="provider.url must be an absolute URL"
	URL string `json:"url,omitempty"`
}

// AgentCapabilities are the optional A2A features an agent supports.
type AgentCapabilities struct {
	// Streaming is true when the agent answers SendStreamingMessage with a stream of task updates.
	// +optional
	Streaming bool `json:"streaming,omitempty"`

	// PushNotifications is true when the agent can push task updates to a client-supplied webhook.
	// +optional
	PushNotifications bool `json:"pushNotifications,omitempty"`

	// Extensions are the A2A protocol extensions the agent supports (the card's
	// capabilities.extensions), e.g. https://a2a-fleet.dev/extensions/continuation/v1 for agents
	// whose input-required/auth-required pauses carry a continuation hint.
	// +optional
	// +listType=map
	// +listMapKey=uri
	// +kubebuilder:validation:MaxItems=16
	Extensions []AgentExtension `json:"extensions,omitempty"`
}

// AgentExtension declares one A2A protocol extension in the agent card.
type AgentExtension struct {
	// URI identifies the extension.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self)",message="extension uri must be an absolute URL"
	URI string `json:"uri"`

	// Description says how the agent uses the extension.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Description string `json:"description,omitempty"`

	// Required is true when clients must understand the extension to talk to the agent.
	// +optional
	Required bool `json:"required,omitempty"`
}

// AgentSkill is one thing an agent can do.
type AgentSkill struct {
	// ID identifies the skill within the agent.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+$`
	ID string `json:"id"`

	// Name is the skill's human-readable name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Name string `json:"name"`

	// Description says what the skill does.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=4096
	Description string `json:"description"`

	// Tags are keywords for discovery.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=64
	Tags []string `json:"tags,omitempty"`

	// Examples are sample prompts the skill handles well.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MaxLength=1024
	Examples []string `json:"examples,omitempty"`
}

// CallerScope admits whole groups of agents as callers.
// +kubebuilder:validation:Enum=None;SameUnit;SameOrg
type CallerScope string

const (
	// CallerScopeNone admits only the agents named by callers.from.
	CallerScopeNone CallerScope = "None"
	// CallerScopeSameUnit admits every agent with the same orgID and unitID.
	CallerScopeSameUnit CallerScope = "SameUnit"
	// CallerScopeSameOrg admits every agent with the same orgID.
	CallerScopeSameOrg CallerScope = "SameOrg"
)

// CallersSpec says which agents may send requests to an agent. An agent is admitted when the scope
// covers it or any entry of from selects it.
type CallersSpec struct {
	// Scope admits every agent of the same unit (SameUnit) or organization (SameOrg); None admits only
	// the agents that from selects.
	// +optional
	// +kubebuilder:default=None
	Scope CallerScope `json:"scope,omitempty"`

	// From selects further caller Agents by label, in this namespace or in the namespaces that
	// namespaceSelector picks.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	From []CallerSelector `json:"from,omitempty"`
}

// CallerSelector selects Agents that may call.
type CallerSelector struct {
	// AgentSelector selects caller Agents by their labels. An empty selector selects every Agent in
	// the chosen namespaces.
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || (size(self.matchExpressions) <= 16 && [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15].all(i, i >= size(self.matchExpressions) || (self.matchExpressions[i].operator in ['In', 'NotIn'] ? has(self.matchExpressions[i].values) && size(self.matchExpressions[i].values) > 0 : self.matchExpressions[i].operator in ['Exists', 'DoesNotExist'] && (!has(self.matchExpressions[i].values) || size(self.matchExpressions[i].values) == 0))))",message="matchExpressions: at most 16, each with operator In or NotIn and values, or Exists or DoesNotExist without values"
	AgentSelector metav1.LabelSelector `json:"agentSelector"`

	// NamespaceSelector picks the namespaces searched for callers. When absent only the Agent's own
	// namespace is searched; an empty selector searches every namespace.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || (size(self.matchExpressions) <= 16 && [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15].all(i, i >= size(self.matchExpressions) || (self.matchExpressions[i].operator in ['In', 'NotIn'] ? has(self.matchExpressions[i].values) && size(self.matchExpressions[i].values) > 0 : self.matchExpressions[i].operator in ['Exists', 'DoesNotExist'] && (!has(self.matchExpressions[i].values) || size(self.matchExpressions[i].values) == 0))))",message="matchExpressions: at most 16, each with operator In or NotIn and values, or Exists or DoesNotExist without values"
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
}

// AgentWorkload is the workload that runs an agent.
type AgentWorkload struct {
	// Replicas is the number of pods: 0 or 1. An Agent is one identity with one MQTT client ID, and
	// replicas sharing it would take over each other's session; to scale out, create several
	// Agents with the same poolID.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:XValidation:rule="self <= 1",message="replicas must be 0 or 1: replicas would share one MQTT client ID and take over each other's session; to scale out, create several Agents with the same poolID"
	Replicas *int32 `json:"replicas,omitempty"`

	// Template is the pod template. It must fit the namespace's Pod Security level (never below the
	// operator's floor, baseline by default), run as the default ServiceAccount or one its Tenant
	// allows, and reference no Secret but the Agent's own credentials (docs/security.md); the
	// service account token is not mounted unless automountServiceAccountToken is true. The
	// operator adds environment variables with the broker URL,
	// identity, topics and credentials to every container: A2A_BROKER, A2A_ORG, A2A_UNIT,
	// A2A_AGENT, A2A_CLIENT_ID, A2A_REQUEST_TOPIC, A2A_POOLS, and A2A_USERNAME and A2A_PASSWORD
	// from the credentials Secret.
	Template corev1.PodTemplateSpec `json:"template"`
}

// AgentTopics are the MQTT topics of an agent, resolved from its identity.
type AgentTopics struct {
	// Request is the topic the agent receives requests on.
	Request string `json:"request"`
	// ReplyPrefix is the prefix of the agent's reply topics ({replyPrefix}/{suffix}).
	ReplyPrefix string `json:"replyPrefix"`
	// Discovery is the topic of the agent's retained agent card.
	Discovery string `json:"discovery"`
	// Event is the agent's event topic.
	Event string `json:"event"`
	// Pool is the shared pool request topic when the agent is a pool member.
	// +optional
	Pool string `json:"pool,omitempty"`
	// Delivery is set when a ConversationPolicy governs the agent and the conversation service
	// stands in front of it: the agent must read its requests here (the service alone reads the
	// public request topic) and send its replies to the service.
	// +optional
	Delivery string `json:"delivery,omitempty"`
}

// AgentStatus is the observed state of an Agent.
type AgentStatus struct {
	// ObservedGeneration is the metadata.generation that the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready, IdentityPermitted, Registered, ACLsSynced, WorkloadAvailable (what the
	// operator manages) and Connected (whether the agent's process is connected to the broker).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// AgentID is the resolved agent identifier (spec.agentID or metadata.name).
	// +optional
	AgentID string `json:"agentID,omitempty"`

	// ClientID is the MQTT Client ID the agent must connect with: {orgID}/{unitID}/{agentID}.
	// +optional
	ClientID string `json:"clientID,omitempty"`

	// Topics are the agent's MQTT topics.
	// +optional
	Topics *AgentTopics `json:"topics,omitempty"`

	// ConversationPolicy is the name of the ConversationPolicy that applies to the agent, if any.
	// +optional
	ConversationPolicy string `json:"conversationPolicy,omitempty"`

	// OverlappingPolicies are the other ConversationPolicies that also select the agent but lose to
	// conversationPolicy under the precedence rule (highest priority, then oldest, then name).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=10
	OverlappingPolicies []string `json:"overlappingPolicies,omitempty"`

	// PublishedCardDigest is the SHA-256 of the agent card the operator last published. The card is
	// republished only when it changes, so the operator never overwrites the "online" card a
	// connected agent publishes for itself.
	// +optional
	PublishedCardDigest string `json:"publishedCardDigest,omitempty"`

	// Tenant is the Tenant whose binding permits the agent's identity; empty when no Tenant binds
	// the namespace (then only the org named like the namespace is permitted).
	// +optional
	Tenant string `json:"tenant,omitempty"`

	// CredentialsSecret is the name of the Secret with the agent's broker credentials.
	// +optional
	CredentialsSecret string `json:"credentialsSecret,omitempty"`

	// Presence is what is known of the agent's process on the broker, behind the Connected
	// condition.
	// +optional
	Presence *AgentPresence `json:"presence,omitempty"`
}

// AgentPresence is what the broker (or the agent's retained card) said last about the agent's
// process.
type AgentPresence struct {
	// Source is where it comes from: Broker (the broker's own view of its connections) or Card
	// (the agent's retained card: online when it connected, offline from its LWT or at a graceful
	// stop; used only where the broker does not report connections).
	// +optional
	// +kubebuilder:validation:Enum=Broker;Card
	Source string `json:"source,omitempty"`
	// LastConnectTime is when the process last connected.
	// +optional
	LastConnectTime *metav1.Time `json:"lastConnectTime,omitempty"`
	// LastDisconnectTime is when it last went, and LastDisconnectReason why (a clean DISCONNECT, a
	// keep-alive timeout, disconnected by the broker after a credentials or rights change, ...).
	// +optional
	LastDisconnectTime *metav1.Time `json:"lastDisconnectTime,omitempty"`
	// LastDisconnectReason says why the process last went.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	LastDisconnectReason string `json:"lastDisconnectReason,omitempty"`
	// RefusedSince is when the broker began to refuse CONNECTs with the agent's client ID (bad or
	// rotated credentials), while it is not connected; reported by brokers that name the client of
	// a refused CONNECT (the embedded broker; Mosquitto does not).
	// +optional
	RefusedSince *metav1.Time `json:"refusedSince,omitempty"`
	// RefusedReason says why its CONNECTs are refused.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	RefusedReason string `json:"refusedReason,omitempty"`
}

// Agent is an A2A agent on the MQTT bus: its identity, agent card, who may call it and optionally the
// workload that runs it.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ag,categories={a2a,all}
// +kubebuilder:printcolumn:name="Org",type=string,JSONPath=`.spec.orgID`
// +kubebuilder:printcolumn:name="Unit",type=string,JSONPath=`.spec.unitID`
// +kubebuilder:printcolumn:name="Agent",type=string,JSONPath=`.status.agentID`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Connected",type=string,JSONPath=`.status.conditions[?(@.type=="Connected")].status`
// +kubebuilder:printcolumn:name="Policy",type=string,JSONPath=`.status.conversationPolicy`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="has(self.spec.agentID) || size(self.metadata.name) <= 64",message="metadata.name is longer than 64 characters: set spec.agentID (agentID defaults to the name and is limited to 64 characters)"
type Agent struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state of the Agent.
	Spec AgentSpec `json:"spec"`

	// Status is the observed state of the Agent.
	// +optional
	Status AgentStatus `json:"status,omitempty"`
}

// AgentList is a list of Agents.
// +kubebuilder:object:root=true
type AgentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the Agents.
	Items []Agent `json:"items"`
}

func init() {
	objects = append(objects, &Agent{}, &AgentList{})
}
