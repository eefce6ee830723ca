package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AgentGrantKind is what an AgentGrant consents to.
// +kubebuilder:validation:Enum=Callers;Pools
type AgentGrantKind string

const (
	// AgentGrantCallers: Agents of the granting namespace may be selected as callers by the
	// callers.from rules of Agents in the from namespaces (which then may publish replies to them).
	AgentGrantCallers AgentGrantKind = "Callers"
	// AgentGrantPools: Agents of the from namespaces may join the pools this namespace owns (a pool
	// belongs to the namespace of its oldest member).
	AgentGrantPools AgentGrantKind = "Pools"
)

// AgentGrantSpec says which other namespaces may do what with this namespace's Agents. It follows
// Gateway API's ReferenceGrant: the grant lives in the namespace that consents.
type AgentGrantSpec struct {
	// From lists the namespaces the grant is given to.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	From []AgentGrantFrom `json:"from"`

	// To lists what is granted.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=16
	To []AgentGrantTo `json:"to"`
}

// AgentGrantFrom names a namespace that receives the grant.
type AgentGrantFrom struct {
	// Namespace is the name of the namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`
}

// AgentGrantTo is one thing granted.
// +kubebuilder:validation:XValidation:rule="self.kind == 'Callers' || !has(self.agentSelector)",message="agentSelector applies to kind Callers only"
// +kubebuilder:validation:XValidation:rule="self.kind == 'Pools' || !has(self.poolID)",message="poolID applies to kind Pools only"
type AgentGrantTo struct {
	// Kind is Callers (this namespace's Agents may be selected as callers from the from
	// namespaces) or Pools (Agents of the from namespaces may join this namespace's pools).
	Kind AgentGrantKind `json:"kind"`

	// AgentSelector narrows Callers to the Agents of this namespace whose labels match. Absent:
	// every Agent of this namespace.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || (size(self.matchExpressions) <= 16 && [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15].all(i, i >= size(self.matchExpressions) || (self.matchExpressions[i].operator in ['In', 'NotIn'] ? has(self.matchExpressions[i].values) && size(self.matchExpressions[i].values) > 0 : self.matchExpressions[i].operator in ['Exists', 'DoesNotExist'] && (!has(self.matchExpressions[i].values) || size(self.matchExpressions[i].values) == 0))))",message="matchExpressions: at most 16, each with operator In or NotIn and values, or Exists or DoesNotExist without values"
	AgentSelector *metav1.LabelSelector `json:"agentSelector,omitempty"`

	// PoolID narrows Pools to one pool. Absent: every pool this namespace owns.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_.-]+$`
	PoolID string `json:"poolID,omitempty"`
}

// AgentGrant is a namespace's consent that Agents of other namespaces select its Agents as callers
// or join its pools (docs/security.md). It has no status: the Agents it affects report it.
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=agrant,categories={a2a}
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type AgentGrant struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec is the consent.
	Spec AgentGrantSpec `json:"spec"`
}

// AgentGrantList is a list of AgentGrants.
// +kubebuilder:object:root=true
type AgentGrantList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	// Items are the AgentGrants.
	Items []AgentGrant `json:"items"`
}

func init() {
	objects = append(objects, &AgentGrant{}, &AgentGrantList{})
}
