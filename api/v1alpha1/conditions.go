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
	// ConditionConflicted is true when a ConversationPolicy shares Agents with other policies.
	ConditionConflicted = "Conflicted"
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
	// ReasonInvalidCallers: a caller selector could not be evaluated.
	ReasonInvalidCallers = "InvalidCallers"
	// ReasonInvalidSelector: a policy's agentSelector could not be evaluated.
	ReasonInvalidSelector = "InvalidSelector"
	// ReasonSelectorResolved: a policy's selector was evaluated.
	ReasonSelectorResolved = "SelectorResolved"
	// ReasonOverlappingPolicies: another policy selects some of the same Agents.
	ReasonOverlappingPolicies = "OverlappingPolicies"
	// ReasonNoOverlap: no other policy selects this policy's Agents.
	ReasonNoOverlap = "NoOverlap"
)
