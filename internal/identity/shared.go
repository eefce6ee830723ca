package identity

// Names of the shared broker objects of the no-collateral-kick ACL model (docs/registration.md)
// and the cache indexes that find the Agents each one lists. The unit and org groups keep the
// names they always had (UnitGroupName, OrgGroupName).

// UnitRoleName is the one role of the unit group: its ACLs admit the unit's members to the agents
// of the unit that take callers by scope SameUnit.
func UnitRoleName(org, unit string) string { return BrokerPrefix + "unit:" + org + "/" + unit }

// GatesRoleName is the role, in the conversation service's group, whose ACLs let the service
// stand in front of every gated agent (read its public request topic, write its delivery topic).
const GatesRoleName = BrokerPrefix + "conversation-service:gates"

// Field indexes on the operator's cache for the shared objects and pools.
const (
	// IndexAgentUnit indexes Agents by "{org}/{unit}".
	IndexAgentUnit = "a2a.fleet.dev/unit"
	// IndexAgentOrg indexes Agents by org.
	IndexAgentOrg = "a2a.fleet.dev/org"
	// IndexAgentPool indexes pool members by "{org}/{unit}/{pool}".
	IndexAgentPool = "a2a.fleet.dev/pool"
)
