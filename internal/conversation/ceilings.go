package conversation

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/a2a-fleet/a2a-fleet/api/v1alpha1"
)

// Within returns p bounded by a Tenant's ceilings (nil fields bound nothing), and what it
// asked for beyond them. A limit p leaves unlimited (0) takes the ceiling without counting as
// asking for more: the ceiling is the Tenant's default for it. The operator reports the excess
// in the policy's WithinLimits condition; the conversation service enforces the result, so a
// namespace owner cannot exceed the Tenant's ceilings with its own policy.
//
// A new ceiling is one field of v1alpha1.PolicyCeilings (with its default in tenancy's
// ResolveLimits) and one line here.
func (p Policy) Within(c *v1alpha1.PolicyCeilings) (Policy, []string) {
	if c == nil {
		return p, nil
	}
	var over []string
	capDuration := func(name string, v *time.Duration, ceiling *metav1.Duration) {
		if ceiling == nil {
			return
		}
		switch {
		case *v == 0:
			*v = ceiling.Duration
		case *v > ceiling.Duration:
			over = append(over, fmt.Sprintf("%s %s exceeds the ceiling %s", name, *v, ceiling.Duration))
			*v = ceiling.Duration
		}
	}
	capInt := func(name string, v *int, ceiling *int32) {
		if ceiling == nil {
			return
		}
		switch {
		case *v == 0:
			*v = int(*ceiling)
		case *v > int(*ceiling):
			over = append(over, fmt.Sprintf("%s %d exceeds the ceiling %d", name, *v, *ceiling))
			*v = int(*ceiling)
		}
	}
	capDuration("contextIdleTTL", &p.IdleTTL, c.MaxContextIdleTTL)
	capDuration("contextMaxAge", &p.MaxAge, c.MaxContextMaxAge)
	capDuration("inputRequiredTimeout", &p.InputRequiredTimeout, c.MaxInputRequiredTimeout)
	capInt("maxActiveContextsPerAgent", &p.MaxActiveContextsPerAgent, c.MaxActiveContextsPerAgent)
	capInt("maxConcurrentTasksPerContext", &p.MaxConcurrentTasksPerContext, c.MaxConcurrentTasksPerContext)
	capInt("history.maxBytesPerContext", &p.MaxHistoryBytes, c.MaxHistoryBytesPerContext)
	return p, over
}
