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
	// +kubebuilder:validation:XValidation:rule="self != 'a2a-fleet'",message="orgID a2a-fleet is reserved for the operator and the conversation service"
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
