package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TenantSpec binds namespaces to one organization: the Agents of those namespaces may claim that
// orgID (and only it), with the units and pools the Tenant allows. Tenants are cluster-scoped, so
// only cluster administrators create them; they are the admin-owned authority over who may be
// which org on the bus.
// +kubebuilder:validation:XValidation:rule="(has(self.namespaces) && size(self.namespaces) > 0) || has(self.namespaceSelector)",message="a Tenant binds namespaces: set namespaces, namespaceSelector or both"
type TenantSpec struct {
	// OrgID is the organization the bound namespaces' Agents claim. It cannot be the reserved org
	// a2a-fleet (the operator's and the conversation service's own identities) and cannot change:
	// every topic and credential of the tenant's Agents derives from it.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+$`
	// +kubebuilder:validation:XValidation:rule="self.lowerAscii() != 'a2a-fleet'",message="orgID a2a-fleet is reserved for the operator and the conversation service (in any case)"
	// +kubebuilder:validation:XValidation:rule="!self.matches('^[.]+$')",message="an identifier of dots only (. or ..) is a path step, not a name: it cannot name a topic level"
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="orgID is immutable: create a new Tenant instead"
	OrgID string `json:"orgID"`

	// Namespaces lists bound namespaces by name.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=63
	Namespaces []string `json:"namespaces,omitempty"`

	// NamespaceSelector binds every namespace whose labels match. Whoever may label namespaces then
	// decides tenancy, so select only on labels that cluster administrators control.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || (size(self.matchExpressions) <= 16 && [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15].all(i, i >= size(self.matchExpressions) || (self.matchExpressions[i].operator in ['In', 'NotIn'] ? has(self.matchExpressions[i].values) && size(self.matchExpressions[i].values) > 0 : self.matchExpressions[i].operator in ['Exists', 'DoesNotExist'] && (!has(self.matchExpressions[i].values) || size(self.matchExpressions[i].values) == 0))))",message="matchExpressions: at most 16, each with operator In or NotIn and values, or Exists or DoesNotExist without values"
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`

	// Units, when not empty, are the only unitIDs the tenant's Agents may claim.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9_.-]+$`
	Units []string `json:"units,omitempty"`

	// Pools, when not empty, are the only poolIDs the tenant's Agents may join.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=256
	// +kubebuilder:validation:items:MaxLength=64
	// +kubebuilder:validation:items:Pattern=`^[A-Za-z0-9_.-]+$`
	Pools []string `json:"pools,omitempty"`

	// WorkloadServiceAccounts are the ServiceAccounts (besides "default") that Agent workloads in
	// the bound namespaces may run as. Empty: only the namespace's default ServiceAccount.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	WorkloadServiceAccounts []string `json:"workloadServiceAccounts,omitempty"`

	// Limits bound what the bound namespaces may use together. Unset fields take the defaults
	// (docs/api.md), which also apply to a namespace no Tenant binds.
	// +optional
	Limits *TenantLimits `json:"limits,omitempty"`
}

// Defaults of TenantLimits: what a Tenant that sets no limits, and a namespace no Tenant binds, get.
const (
	DefaultMaxAgents                    = 1000
	DefaultMaxCardBytes                 = 64 << 10
	DefaultMaxContextIdleTTL            = "168h"
	DefaultMaxContextMaxAge             = "2160h"
	DefaultMaxInputRequiredTimeout      = "168h"
	DefaultMaxActiveContextsPerAgent    = 10000
	DefaultMaxConcurrentTasksPerContext = 100
	DefaultMaxHistoryBytesPerContext    = 1 << 20
	MaxCardBytesCeiling                 = 256 << 10
)

// TenantLimits are the limits a cluster administrator sets for a Tenant's namespaces.
type TenantLimits struct {
	// MaxAgents is how many Agents the bound namespaces may hold together. Agents beyond it (the
	// newest first) are refused: IdentityPermitted=False, reason AgentLimitExceeded, nothing on
	// the broker. Default 1000.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000000
	MaxAgents *int32 `json:"maxAgents,omitempty"`

	// MaxCardBytes bounds an Agent's published agent card (its JSON). A larger card is not
	// published: Registered=False, reason CardTooLarge. Between 1 KiB and 256 KiB; default 64 KiB.
	// +optional
	// +kubebuilder:validation:Minimum=1024
	// +kubebuilder:validation:Maximum=262144
	MaxCardBytes *int32 `json:"maxCardBytes,omitempty"`

	// ConversationPolicy are the ceilings of the bound namespaces' ConversationPolicies: a policy
	// asking for more (or for unlimited) gets the ceiling, and says so in its WithinLimits
	// condition.
	// +optional
	ConversationPolicy *PolicyCeilings `json:"conversationPolicy,omitempty"`
}

// PolicyCeilings are the most a ConversationPolicy of a Tenant's namespaces may set. Unset fields
// take the defaults.
type PolicyCeilings struct {
	// MaxContextIdleTTL caps contextIdleTTL. Default 168h.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('720h')",message="maxContextIdleTTL must be between 1s and 720h"
	MaxContextIdleTTL *metav1.Duration `json:"maxContextIdleTTL,omitempty"`

	// MaxContextMaxAge caps contextMaxAge, and is the lifetime of a context whose policy sets none.
	// Default 2160h (90 days).
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('8760h')",message="maxContextMaxAge must be between 1s and 8760h"
	MaxContextMaxAge *metav1.Duration `json:"maxContextMaxAge,omitempty"`

	// MaxInputRequiredTimeout caps inputRequiredTimeout, and is the timeout of a policy that sets
	// none. Default 168h.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('720h')",message="maxInputRequiredTimeout must be between 1s and 720h"
	MaxInputRequiredTimeout *metav1.Duration `json:"maxInputRequiredTimeout,omitempty"`

	// MaxActiveContextsPerAgent caps maxActiveContextsPerAgent (0, unlimited, gets the ceiling).
	// Default 10000.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000000
	MaxActiveContextsPerAgent *int32 `json:"maxActiveContextsPerAgent,omitempty"`

	// MaxConcurrentTasksPerContext caps maxConcurrentTasksPerContext (0, unlimited, gets the
	// ceiling). Default 100.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	MaxConcurrentTasksPerContext *int32 `json:"maxConcurrentTasksPerContext,omitempty"`

	// MaxHistoryBytesPerContext caps history.maxBytesPerContext. Default 1 MiB.
	// +optional
	// +kubebuilder:validation:Minimum=1024
	// +kubebuilder:validation:Maximum=4194304
	MaxHistoryBytesPerContext *int32 `json:"maxHistoryBytesPerContext,omitempty"`
}

// TenantStatus is what the operator made of a Tenant.
type TenantStatus struct {
	// ObservedGeneration is the metadata.generation that the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready (the Tenant is in effect) and Conflicted (another Tenant claims the same org
	// or some of the same namespaces).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// BoundNamespaces is the number of namespaces this Tenant binds now.
	// +optional
	BoundNamespaces int32 `json:"boundNamespaces,omitempty"`

	// Namespaces are the namespaces this Tenant binds now (sorted, at most 50; boundNamespaces
	// is exact).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=50
	Namespaces []string `json:"namespaces,omitempty"`

	// ConflictingNamespaces are namespaces this Tenant selects but an older Tenant binds (sorted,
	// at most 50).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=50
	ConflictingNamespaces []string `json:"conflictingNamespaces,omitempty"`
}

// Tenant binds namespaces to an organization on the bus: it is the cluster administrator's answer
// to "which namespace may be which org" (docs/security.md).
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=tn,categories={a2a}
// +kubebuilder:printcolumn:name="Org",type=string,JSONPath=`.spec.orgID`
// +kubebuilder:printcolumn:name="Namespaces",type=integer,JSONPath=`.status.boundNamespaces`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Tenant struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the binding.
	Spec TenantSpec `json:"spec"`

	// Status is what the operator made of it.
	// +optional
	Status TenantStatus `json:"status,omitempty"`
}

// TenantList is a list of Tenants.
// +kubebuilder:object:root=true
type TenantList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the Tenants.
	Items []Tenant `json:"items"`
}

func init() {
	objects = append(objects, &Tenant{}, &TenantList{})
}
