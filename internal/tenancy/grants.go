package tenancy

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	a2av1 "github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// CallerGranted reports whether grants (the AgentGrants of the caller's namespace) let Agents of
// namespace selectorNS select caller as a caller through callers.from. An Agent's own namespace
// needs no grant.
func CallerGranted(grants []a2av1.AgentGrant, selectorNS string, caller *a2av1.Agent) bool {
	if selectorNS == caller.Namespace {
		return true
	}
	for i := range grants {
		g := &grants[i]
		if g.Namespace != caller.Namespace || !grantsFrom(g, selectorNS) {
			continue
		}
		for _, to := range g.Spec.To {
			if to.Kind != a2av1.AgentGrantCallers {
				continue
			}
			if to.AgentSelector == nil {
				return true
			}
			sel, err := metav1.LabelSelectorAsSelector(to.AgentSelector)
			if err == nil && sel.Matches(labels.Set(caller.Labels)) {
				return true
			}
		}
	}
	return false
}

// PoolGranted reports whether grants (the AgentGrants of the pool owner's namespace ownerNS) let
// an Agent of memberNS join pool. The owner namespace's own Agents need no grant.
func PoolGranted(grants []a2av1.AgentGrant, ownerNS, memberNS, pool string) bool {
	if ownerNS == memberNS {
		return true
	}
	for i := range grants {
		g := &grants[i]
		if g.Namespace != ownerNS || !grantsFrom(g, memberNS) {
			continue
		}
		for _, to := range g.Spec.To {
			if to.Kind == a2av1.AgentGrantPools && (to.PoolID == "" || to.PoolID == pool) {
				return true
			}
		}
	}
	return false
}

func grantsFrom(g *a2av1.AgentGrant, ns string) bool {
	return slices.ContainsFunc(g.Spec.From, func(f a2av1.AgentGrantFrom) bool { return f.Namespace == ns })
}
