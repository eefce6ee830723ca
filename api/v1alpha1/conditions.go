package v1alpha1

// Condition types. Every condition carries the metadata.generation it was computed for.
const (
	// ConditionReady summarises whether the object is fully working.
	ConditionReady = "Ready"
	// ConditionRegistered is true once the agent's identity and agent card exist on the broker.
	ConditionRegistered = "Registered"
	// ConditionACLsSynced is true once the broker's topic ACLs match what the agent may do.
	ConditionACLsSynced = "ACLsSynced"
	// ConditionWorkloadAvailable reflects the agent workload's Deployment availability.
	ConditionWorkloadAvailable = "WorkloadAvailable"
	// ConditionConflicted is true when a ConversationPolicy shares Agents with other policies, or a
	// Tenant claims an org or namespaces that an older Tenant holds.
	ConditionConflicted = "Conflicted"
	// ConditionIdentityPermitted is true when the Agent's namespace may claim its org, unit and pool
	// (a Tenant, or the namespace default) and the org is not reserved.
	ConditionIdentityPermitted = "IdentityPermitted"
	// ConditionWithinLimits is true when a ConversationPolicy asks for no more than its Tenant's
	// ceilings (limits.conversationPolicy); false when a ceiling applies instead of its value.
	ConditionWithinLimits = "WithinLimits"
	// ConditionConnected says whether the agent's process is connected to the broker now, as the
	// broker reports it (or, where the broker does not, the agent's retained card: its online card
	// or its LWT). It is not part of Ready: Ready is about what the operator manages.
	ConditionConnected = "Connected"
	// ConditionCardMatches, on an Agent whose workload is an HTTP A2A server (spec.http.url), says
	// whether the card that server serves matches spec.card (which the bus shows); the HTTP
	// gateway that holds the agent sets it. It is not part of Ready.
	ConditionCardMatches = "CardMatches"
)

// Reasons of ConditionCardMatches.
const (
	// ReasonServedCardMatches: every member spec.card states is the same on the served card.
	ReasonServedCardMatches = "ServedCardMatches"
	// ReasonServedCardDiffers: the message names the members that differ.
	ReasonServedCardDiffers = "ServedCardDiffers"
	// ReasonServedCardUnavailable: the HTTP agent serves no readable card at the well-known path.
	ReasonServedCardUnavailable = "ServedCardUnavailable"
)

// Condition reasons, CamelCase as metav1.Condition requires.
const (
	// ReasonReconciled: everything the operator manages for the object is in place.
	ReasonReconciled = "Reconciled"
	// ReasonBrokerNotConfigured: the operator runs without a broker, so it cannot register agents.
	ReasonBrokerNotConfigured = "BrokerNotConfigured"
	// ReasonBrokerUnavailable: the broker could not be reached; the operator retries with backoff.
	ReasonBrokerUnavailable = "BrokerUnavailable"
	// ReasonACLsApplied: the broker's ACLs for the agent match its spec and its callers.
	ReasonACLsApplied = "ACLsApplied"
	// ReasonRegistered: the agent's identity exists on the broker.
	ReasonRegistered = "Registered"
	// ReasonIdentityConflict: another Agent already holds the same orgID/unitID/agentID.
	ReasonIdentityConflict = "IdentityConflict"
	// ReasonInvalidCallers: a caller selector could not be evaluated (terminal until the spec changes).
	ReasonInvalidCallers = "InvalidCallers"
	// ReasonIdentityPermitted: the namespace may claim the Agent's identity.
	ReasonIdentityPermitted = "IdentityPermitted"
	// ReasonIdentityNotPermitted: the namespace may not claim the Agent's org, unit or pool, or the
	// org is reserved; nothing is registered on the broker and no credentials are issued.
	ReasonIdentityNotPermitted = "IdentityNotPermitted"
	// ReasonSharedACLsPending: the Agent's own broker objects are in place, but the shared unit, org
	// or conversation-service roles do not include its entries yet.
	ReasonSharedACLsPending = "SharedACLsPending"
	// ReasonPoolNotGranted: the Agent's pool belongs to another namespace that grants this one no
	// AgentGrant of kind Pools; the Agent is registered but not a pool member.
	ReasonPoolNotGranted = "PoolNotGranted"
	// ReasonPoolUnsupportedByBroker: the Agent has a poolID and the operator's broker cannot
	// deliver a pool's requests (Mosquitto 2.0 never delivers $-topics to shared subscriptions);
	// the Agent is registered and may connect, but is not Ready.
	ReasonPoolUnsupportedByBroker = "PoolUnsupportedByBroker"
	// ReasonAgentLimitExceeded: the Tenant's (or namespace's) limits.maxAgents is reached; the
	// newest Agents beyond it are refused like an identity that is not permitted.
	ReasonAgentLimitExceeded = "AgentLimitExceeded"
	// ReasonCardTooLarge: the agent card is larger than the Tenant's limits.maxCardBytes; it is not
	// published (the broker would disconnect the operator's shared connection for an oversized
	// packet).
	ReasonCardTooLarge = "CardTooLarge"
	// ReasonWithinLimits: a ConversationPolicy asks for no more than its Tenant's ceilings.
	ReasonWithinLimits = "WithinLimits"
	// ReasonTenantLimitExceeded: a ConversationPolicy asks for more than its Tenant's ceilings (or
	// for unlimited); the ceilings apply instead.
	ReasonTenantLimitExceeded = "TenantLimitExceeded"
	// ReasonCredentialsConflict: a Secret with the credentials' name exists and is not the Agent's.
	ReasonCredentialsConflict = "CredentialsConflict"
	// ReasonWorkloadNotPermitted: spec.workload asks for more than the Agent may have (Pod Security
	// level, ServiceAccount, other Secrets); no Deployment is run until the spec changes.
	ReasonWorkloadNotPermitted = "WorkloadNotPermitted"
	// ReasonTenantBound: a Tenant is in effect.
	ReasonTenantBound = "Bound"
	// ReasonOrgConflict: an older Tenant claims the same org; this one binds nothing.
	ReasonOrgConflict = "OrgConflict"
	// ReasonNamespaceConflict: an older Tenant binds some of the namespaces this one selects.
	ReasonNamespaceConflict = "NamespaceConflict"
	// ReasonInvalidNamespaceSelector: a Tenant's namespaceSelector cannot be evaluated; it selects
	// nothing (listed namespaces stay bound).
	ReasonInvalidNamespaceSelector = "InvalidNamespaceSelector"
	// ReasonInvalidSelector: a policy's agentSelector could not be evaluated.
	ReasonInvalidSelector = "InvalidSelector"
	// ReasonSelectorResolved: a policy's selector was evaluated and selects at least one Agent.
	ReasonSelectorResolved = "SelectorResolved"
	// ReasonNoAgentsSelected: a policy's selector matches no Agent of its namespace, so the policy
	// governs nothing (Ready=False, with a Warning event): usually a typo in a label.
	ReasonNoAgentsSelected = "NoAgentsSelected"
	// ReasonOverlappingPolicies: another policy selects some of the same Agents.
	ReasonOverlappingPolicies = "OverlappingPolicies"
	// ReasonNoOverlap: no other policy selects this policy's Agents.
	ReasonNoOverlap = "NoOverlap"
	// ReasonConnected: a process is connected with the agent's client ID.
	ReasonConnected = "Connected"
	// ReasonDisconnected: the agent's process went (the message says when and why, and whether
	// its CONNECTs are refused since).
	ReasonDisconnected = "Disconnected"
	// ReasonNotConnected: the broker has seen no connection with the agent's client ID since it
	// (or the operator) started.
	ReasonNotConnected = "NotConnected"
	// ReasonPresenceUnknown: neither the broker nor the agent has said whether it is connected (a
	// broker that does not report connections, and an agent that publishes no card of its own).
	ReasonPresenceUnknown = "PresenceUnknown"
)
