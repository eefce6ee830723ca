package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ConversationPolicySpec is the set of multi-turn conversation rules for the Agents it selects.
// +kubebuilder:validation:XValidation:rule="!has(self.contextMaxAge) || !has(self.contextIdleTTL) || !self.contextMaxAge.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') || !self.contextIdleTTL.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') || duration(self.contextMaxAge) >= duration(self.contextIdleTTL)",message="contextMaxAge must be at least contextIdleTTL"
type ConversationPolicySpec struct {
	// AgentSelector selects the Agents in this namespace that the policy governs. An empty selector
	// selects every Agent in the namespace.
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || (size(self.matchExpressions) <= 16 && [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15].all(i, i >= size(self.matchExpressions) || (self.matchExpressions[i].operator in ['In', 'NotIn'] ? has(self.matchExpressions[i].values) && size(self.matchExpressions[i].values) > 0 : self.matchExpressions[i].operator in ['Exists', 'DoesNotExist'] && (!has(self.matchExpressions[i].values) || size(self.matchExpressions[i].values) == 0))))",message="matchExpressions: at most 16, each with operator In or NotIn and values, or Exists or DoesNotExist without values"
	AgentSelector metav1.LabelSelector `json:"agentSelector"`

	// Priority decides which policy applies when several select one Agent: the highest priority wins,
	// then the oldest policy, then the alphabetically first name. Every policy involved reports the
	// conflict in status.conflicts.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=-1000
	// +kubebuilder:validation:Maximum=1000
	Priority int32 `json:"priority,omitempty"`

	// ContextIdleTTL is how long a conversation context lives without activity. A request for a
	// context idle longer than this is refused with a "context expired" error. Between 1s and 720h.
	// +optional
	// +kubebuilder:default="30m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('720h')",messageExpression="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') ? 'contextIdleTTL must be between 1s and 720h' : 'contextIdleTTL must be a duration such as 90s, 30m or 1h30m (units h, m, s, ms)'"
	ContextIdleTTL *metav1.Duration `json:"contextIdleTTL,omitempty"`

	// ContextMaxAge, when set, bounds a context's total lifetime from its first task, however active.
	// Between 1s and 8760h, and at least contextIdleTTL.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('8760h')",messageExpression="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') ? 'contextMaxAge must be between 1s and 8760h' : 'contextMaxAge must be a duration such as 90s, 30m or 1h30m (units h, m, s, ms)'"
	ContextMaxAge *metav1.Duration `json:"contextMaxAge,omitempty"`

	// InputRequiredTimeout, when set, fails a task that waits in input-required or auth-required
	// longer than this. Between 1s and 720h.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('720h')",messageExpression="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') ? 'inputRequiredTimeout must be between 1s and 720h' : 'inputRequiredTimeout must be a duration such as 90s, 30m or 1h30m (units h, m, s, ms)'"
	InputRequiredTimeout *metav1.Duration `json:"inputRequiredTimeout,omitempty"`

	// MaxConcurrentTasksPerContext limits the tasks of one context that may be working at once.
	// 0 means unlimited; 1 means one task at a time (the concurrent-call guard).
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	MaxConcurrentTasksPerContext int32 `json:"maxConcurrentTasksPerContext,omitempty"`

	// MaxActiveContextsPerAgent limits the unexpired contexts an agent holds at once. 0 means
	// unlimited.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	MaxActiveContextsPerAgent int32 `json:"maxActiveContextsPerAgent,omitempty"`

	// MaxActiveContextsPerCaller limits the unexpired contexts one caller (the identity whose reply
	// topic a request names) may hold at one agent. 0, the default, is the fair share of
	// maxActiveContextsPerAgent: a caller may open a new context while it holds fewer than
	// maxActiveContextsPerAgent / (callers + 1), rounded up, where callers counts the callers
	// holding contexts at the agent, itself included; so one share always stays free for a caller
	// that holds none yet and no caller alone can lock the others out (a caller alone gets half).
	// Set it to maxActiveContextsPerAgent to let one caller use the whole agent. Without
	// maxActiveContextsPerAgent, 0 means unlimited.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	MaxActiveContextsPerCaller int32 `json:"maxActiveContextsPerCaller,omitempty"`

	// HistoryTasksPerContext is how many of a context's most recent tasks are kept for history
	// (ListTasks/GetTask by context).
	// +optional
	// +kubebuilder:default=20
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	HistoryTasksPerContext int32 `json:"historyTasksPerContext,omitempty"`

	// History chooses what the conversation service keeps of each context for GetTask/ListTasks
	// (historyLength) and for agents that fetch prior turns: nothing, task summaries (states and
	// timestamps, the default) or the messages and artifacts themselves, bounded per context.
	// +optional
	History *HistorySpec `json:"history,omitempty"`

	// FirstEventTimeout bounds how long a forwarded request may wait for the agent's first event
	// (an acknowledgement that some agent took it). When it passes, the task fails with a
	// responder-unavailable error to the requester and its context slot is released, so an
	// agent that is offline cannot hold a context's only working slot until the idle TTL.
	// Between 1s and 1h; default 30s.
	// +optional
	// +kubebuilder:default="30s"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:XValidation:rule="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') && duration(self) >= duration('1s') && duration(self) <= duration('1h')",messageExpression="self.matches('^([0-9]+([.][0-9]+)?(ns|us|µs|ms|s|m|h))+$') ? 'firstEventTimeout must be between 1s and 1h' : 'firstEventTimeout must be a duration such as 90s, 30m or 1h30m (units h, m, s, ms)'"
	FirstEventTimeout *metav1.Duration `json:"firstEventTimeout,omitempty"`
}

// HistoryMode is what the conversation service keeps of a context.
// +kubebuilder:validation:Enum=None;Summaries;Messages
type HistoryMode string

const (
	// HistoryNone keeps no history: GetTask/ListTasks by context answer only the live tasks.
	HistoryNone HistoryMode = "None"
	// HistorySummaries keeps each task's state and timestamps (no content).
	HistorySummaries HistoryMode = "Summaries"
	// HistoryMessages keeps each task's messages and artifacts too, up to MaxBytesPerContext.
	HistoryMessages HistoryMode = "Messages"
)

// HistorySpec configures the history the conversation service keeps per context.
type HistorySpec struct {
	// Mode is None, Summaries (default) or Messages.
	// +optional
	// +kubebuilder:default=Summaries
	Mode HistoryMode `json:"mode,omitempty"`

	// MaxBytesPerContext bounds the message and artifact content kept per context in Messages
	// mode (the oldest turns are dropped first). Between 1 KiB and 4 MiB; default 64 KiB.
	// +optional
	// +kubebuilder:default=65536
	// +kubebuilder:validation:Minimum=1024
	// +kubebuilder:validation:Maximum=4194304
	MaxBytesPerContext int32 `json:"maxBytesPerContext,omitempty"`
}

// PolicyConflict records an Agent that several ConversationPolicies select.
type PolicyConflict struct {
	// Agent is the name of the Agent.
	Agent string `json:"agent"`
	// Policies are the names of all the policies that select the Agent, the applied one first.
	Policies []string `json:"policies"`
	// AppliedPolicy is the policy that applies to the Agent under the precedence rule.
	AppliedPolicy string `json:"appliedPolicy"`
}

// ConversationPolicyStatus is the observed state of a ConversationPolicy.
type ConversationPolicyStatus struct {
	// ObservedGeneration is the metadata.generation that the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready and Conflicted.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// MatchedAgents is the number of Agents the selector matches.
	// +optional
	// +kubebuilder:default=0
	MatchedAgents int32 `json:"matchedAgents"`

	// AppliedAgents is the number of matched Agents to which this policy applies (the rest are
	// governed by a policy of higher precedence).
	// +optional
	// +kubebuilder:default=0
	AppliedAgents int32 `json:"appliedAgents"`

	// MatchedAgentNames are the names of matched Agents, sorted, at most 50.
	// +optional
	// +listType=atomic
	MatchedAgentNames []string `json:"matchedAgentNames,omitempty"`

	// Conflicts lists matched Agents that other policies select too, at most 50.
	// +optional
	// +listType=atomic
	Conflicts []PolicyConflict `json:"conflicts,omitempty"`
}

// ConversationPolicy sets the multi-turn conversation rules (context expiry, concurrency limits,
// history) that the conversation service enforces for the Agents it selects.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=cpol,categories={a2a,all}
// +kubebuilder:printcolumn:name="Priority",type=integer,JSONPath=`.spec.priority`
// +kubebuilder:printcolumn:name="Idle TTL",type=string,JSONPath=`.spec.contextIdleTTL`
// +kubebuilder:printcolumn:name="Max Tasks",type=integer,JSONPath=`.spec.maxConcurrentTasksPerContext`
// +kubebuilder:printcolumn:name="Matched",type=integer,JSONPath=`.status.matchedAgents`
// +kubebuilder:printcolumn:name="Applied",type=integer,JSONPath=`.status.appliedAgents`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Conflicted",type=string,JSONPath=`.status.conditions[?(@.type=="Conflicted")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ConversationPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the desired state of the ConversationPolicy.
	Spec ConversationPolicySpec `json:"spec"`

	// Status is the observed state of the ConversationPolicy.
	// +optional
	Status ConversationPolicyStatus `json:"status,omitempty"`
}

// ConversationPolicyList is a list of ConversationPolicies.
// +kubebuilder:object:root=true
type ConversationPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the ConversationPolicies.
	Items []ConversationPolicy `json:"items"`
}

func init() {
	objects = append(objects, &ConversationPolicy{}, &ConversationPolicyList{})
}
