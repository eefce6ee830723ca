// Package tenancy decides which identities a namespace may claim on the bus and which cross-
// namespace relations its Agents may enter: the admin-owned Tenant bindings (namespace → org,
// units, pools), the zero-config default for namespaces no Tenant binds, the reserved org, and
// the AgentGrant consent of the namespaces that are selected as callers or whose pools are joined.
//
// The rules are pure functions over the objects (Bindings, Authorize, Grants); Authorizer reads
// those objects from the manager's cache for the controllers and the registrar.
package tenancy

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
	"github.com/a2a-fleet/a2a-fleet/internal/identity"
)

// Claim is what an Agent asserts about itself: its org, unit and (optional) pool.
type Claim struct {
	Org, Unit, Pool string
}

// ClaimOf is the claim an Agent's spec makes.
func ClaimOf(agent *a2av1.Agent) Claim {
	return Claim{Org: agent.Spec.OrgID, Unit: agent.Spec.UnitID, Pool: agent.Spec.PoolID}
}

// Decision is the outcome of Authorize.
type Decision struct {
	Permitted bool
	// Tenant is the Tenant whose binding decided ("" for the namespace default or the reserved org).
	Tenant string
	// Message explains the decision, naming the Tenant or rule.
	Message string
	// LimitExceeded: the claim is permitted, but the Agent is beyond its Tenant's (or
	// namespace's) limits.maxAgents (View.Permit).
	LimitExceeded bool
}

// Bindings is the effect of every Tenant at once: which Tenant binds which namespace and owns
// which org. Precedence between Tenants is the oldest first (creationTimestamp), then the name,
// as for ConversationPolicies: a new Tenant never takes an org or a namespace away from an
// established one.
type Bindings struct {
	// ordered are the Tenants in precedence order.
	ordered []*a2av1.Tenant
	// orgOwner maps an org to the Tenant that owns it (the first in precedence order).
	orgOwner map[string]*a2av1.Tenant
	// selectors are the parsed namespace selectors (nil: none or invalid).
	selectors map[string]labels.Selector
	// invalid holds the error of each Tenant whose namespaceSelector cannot be evaluated.
	invalid map[string]error
}

// NewBindings evaluates tenants (deleted ones included until they are gone: their finalizer-free
// deletion is immediate, so a Tenant being deleted still counts).
func NewBindings(tenants []a2av1.Tenant) *Bindings {
	b := &Bindings{orgOwner: map[string]*a2av1.Tenant{}, selectors: map[string]labels.Selector{}, invalid: map[string]error{}}
	for i := range tenants {
		b.ordered = append(b.ordered, &tenants[i])
	}
	sort.SliceStable(b.ordered, func(i, j int) bool { return precedes(b.ordered[i], b.ordered[j]) })
	for _, t := range b.ordered {
		if _, taken := b.orgOwner[t.Spec.OrgID]; !taken {
			b.orgOwner[t.Spec.OrgID] = t
		}
		if t.Spec.NamespaceSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(t.Spec.NamespaceSelector)
			if err != nil {
				b.invalid[t.Name] = err
				continue
			}
			b.selectors[t.Name] = sel
		}
	}
	return b
}

func precedes(a, b *a2av1.Tenant) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// Effective reports whether t is in effect: no older Tenant claims its org.
func (b *Bindings) Effective(t *a2av1.Tenant) bool {
	owner := b.orgOwner[t.Spec.OrgID]
	return owner != nil && owner.Name == t.Name
}

// OrgOwner is the Tenant that owns org, or nil.
func (b *Bindings) OrgOwner(org string) *a2av1.Tenant { return b.orgOwner[org] }

// SelectorError is the error of t's namespaceSelector, if it cannot be evaluated.
func (b *Bindings) SelectorError(t *a2av1.Tenant) error { return b.invalid[t.Name] }

// Selects reports whether t's spec names or selects ns (whether or not t is in effect).
func (b *Bindings) Selects(t *a2av1.Tenant, ns *corev1.Namespace) bool {
	if slices.Contains(t.Spec.Namespaces, ns.Name) {
		return true
	}
	sel := b.selectors[t.Name]
	return sel != nil && sel.Matches(labels.Set(ns.Labels))
}

// TenantFor is the Tenant that binds ns: the first Tenant in effect, in precedence order, that
// names or selects it. Later Tenants that also select ns are in conflict over it.
func (b *Bindings) TenantFor(ns *corev1.Namespace) *a2av1.Tenant {
	for _, t := range b.ordered {
		if b.Effective(t) && b.Selects(t, ns) {
			return t
		}
	}
	return nil
}

// Authorize decides whether an Agent in namespace ns may make claim.
//
//  1. The reserved org (identity.ReservedOrg) is never permitted.
//  2. A namespace bound by a Tenant may claim exactly the Tenant's org, a unit of its units and a
//     pool of its pools (empty lists allow any).
//  3. A namespace bound by no Tenant may claim exactly the org named like the namespace (the
//     zero-config rule), unless a Tenant owns that org.
func (b *Bindings) Authorize(ns *corev1.Namespace, claim Claim) Decision {
	if strings.EqualFold(claim.Org, identity.ReservedOrg) {
		return Decision{Message: fmt.Sprintf("org %s is reserved for the operator and the conversation service", identity.ReservedOrg)}
	}
	if t := b.TenantFor(ns); t != nil {
		switch {
		case claim.Org != t.Spec.OrgID:
			return Decision{Tenant: t.Name, Message: fmt.Sprintf("Tenant %s binds namespace %s to org %s, not %s", t.Name, ns.Name, t.Spec.OrgID, claim.Org)}
		case len(t.Spec.Units) > 0 && !slices.Contains(t.Spec.Units, claim.Unit):
			return Decision{Tenant: t.Name, Message: fmt.Sprintf("Tenant %s allows units %s, not %s", t.Name, strings.Join(t.Spec.Units, ", "), claim.Unit)}
		case claim.Pool != "" && len(t.Spec.Pools) > 0 && !slices.Contains(t.Spec.Pools, claim.Pool):
			return Decision{Tenant: t.Name, Message: fmt.Sprintf("Tenant %s allows pools %s, not %s", t.Name, strings.Join(t.Spec.Pools, ", "), claim.Pool)}
		}
		return Decision{Permitted: true, Tenant: t.Name, Message: fmt.Sprintf("Tenant %s binds namespace %s to org %s", t.Name, ns.Name, t.Spec.OrgID)}
	}
	if owner := b.orgOwner[claim.Org]; owner != nil {
		return Decision{Message: fmt.Sprintf("org %s belongs to Tenant %s, which does not bind namespace %s", claim.Org, owner.Name, ns.Name)}
	}
	if claim.Org != ns.Name {
		return Decision{Message: fmt.Sprintf("no Tenant binds namespace %s, so it may only claim orgID %s (ask a cluster administrator for a Tenant binding it to org %s)", ns.Name, ns.Name, claim.Org)}
	}
	return Decision{Permitted: true, Message: fmt.Sprintf("no Tenant binds namespace %s or owns org %s: a namespace may claim the org named like itself", ns.Name, claim.Org)}
}

// Report is what a Tenant's status shows.
type Report struct {
	Effective bool
	// OrgHolder is the older Tenant that owns the org when this one is not in effect.
	OrgHolder string
	// Bound are the namespaces the Tenant binds, sorted.
	Bound []string
	// Conflicting are namespaces it selects that an older Tenant binds, sorted.
	Conflicting []string
	// ConflictsWith are those older Tenants, sorted.
	ConflictsWith []string
}

// ReportFor evaluates t against every namespace.
func (b *Bindings) ReportFor(t *a2av1.Tenant, namespaces []corev1.Namespace) Report {
	r := Report{Effective: b.Effective(t)}
	if !r.Effective {
		if owner := b.orgOwner[t.Spec.OrgID]; owner != nil {
			r.OrgHolder = owner.Name
		}
		return r
	}
	others := map[string]bool{}
	for i := range namespaces {
		ns := &namespaces[i]
		if !b.Selects(t, ns) {
			continue
		}
		switch holder := b.TenantFor(ns); {
		case holder == nil:
		case holder.Name == t.Name:
			r.Bound = append(r.Bound, ns.Name)
		default:
			r.Conflicting = append(r.Conflicting, ns.Name)
			others[holder.Name] = true
		}
	}
	sort.Strings(r.Bound)
	sort.Strings(r.Conflicting)
	for n := range others {
		r.ConflictsWith = append(r.ConflictsWith, n)
	}
	sort.Strings(r.ConflictsWith)
	return r
}
