package ownership

import (
	"context"
	"time"

	"github.com/a2a-fleet/a2a-fleet/internal/conversation"
	"github.com/a2a-fleet/a2a-fleet/internal/convstore"
)

// Leases is the store the replicas share: *convstore.RedisJournal, or MemoryLeases in tests.
type Leases interface {
	Roster
	AgentLeases
	Inbox
}

// Roster is the set of live replicas.
type Roster interface {
	// Heartbeat records replica as live until now+ttl and returns the live replicas (sorted).
	Heartbeat(ctx context.Context, replica string, ttl time.Duration) ([]string, error)
	// Leave removes replica from the live set and tells the others (AnnounceChange).
	Leave(ctx context.Context, replica string) error
	// AnnounceChange tells every replica to rebalance now (WatchChanges).
	AnnounceChange(ctx context.Context) error
	// WatchChanges calls fn whenever a replica announces a change, until ctx ends.
	WatchChanges(ctx context.Context, fn func())
}

// AgentLeases are the agents with stored state and who holds each one's lease.
type AgentLeases interface {
	// Agents lists the agents with stored state.
	Agents(ctx context.Context) ([]string, error)
	// ForgetAgent removes an agent without contexts from Agents.
	ForgetAgent(ctx context.Context, agent string) error
	// TakeOver takes agent's lease for token if it is free, already token's, or held by a
	// token starting with incarnation (this replica's previous run).
	TakeOver(ctx context.Context, agent, token, incarnation string, ttl time.Duration) (bool, error)
	// RenewLeases renews token's leases on agents; held[i]: token still holds agents[i]'s.
	RenewLeases(ctx context.Context, agents []string, token string, ttl time.Duration) (held []bool, err error)
	// Release gives agent's lease up if token holds it; ReleaseLeases does it for agents.
	Release(ctx context.Context, agent, token string) error
	ReleaseLeases(ctx context.Context, agents []string, token string) error
	// RecordHandled keeps, for ttl, the correlation data of the requests handled last for
	// agent by the replica handing it over; Handled returns them to the next owner.
	RecordHandled(ctx context.Context, agent string, corrs [][]byte, ttl time.Duration) error
	Handled(ctx context.Context, agent string) ([][]byte, error)
}

// Inbox holds the events of an agent's tasks that a replica not owning the agent relayed,
// for the agent's owner.
type Inbox interface {
	PushEvent(ctx context.Context, agent string, ev conversation.Event) error
	// PopEvents takes up to n events from agent's inbox; PopInboxes from each of agents
	// (agents with an empty inbox are left out).
	PopEvents(ctx context.Context, agent string, n int) ([]conversation.Event, error)
	PopInboxes(ctx context.Context, agents []string, n int) (map[string][]conversation.Event, error)
}

// State is the replica's conversation state of the agents it holds (*convstore.Memory).
type State interface {
	// Recover rebuilds agent from the journal and holds it, its commits fenced by fence.
	Recover(ctx context.Context, agent string, fence *convstore.Fence) error
	// Drop forgets agent; durable reports when what was appended for it is durable, handled
	// are the requests handled last.
	Drop(agent string) (durable *convstore.Ticket, handled [][]byte)
	// Handed records the requests the previous owner handled last (dropped as duplicates).
	Handed(agent string, handled [][]byte, keep time.Duration)
	// Empty reports whether agent is held and has no context.
	Empty(agent string) bool
	// Observe applies an event of agent's task.
	Observe(agent string, p conversation.Policy, now time.Time, ev conversation.Event, items ...convstore.Item) (conversation.Outcome, *convstore.Ticket, error)
}

// Agents is the directory of the gated agents (the service's registry).
type Agents interface {
	// Keys are the gated agents ("org/unit/agent").
	Keys() []string
	// Gated reports whether agent is gated.
	Gated(agent string) bool
	// PolicyOf is the policy governing agent (the default one when none does).
	PolicyOf(agent string) conversation.Policy
	// Resubscribe asks for the request topics to be subscribed or unsubscribed to match
	// what this replica consumes (Replica.Consumes).
	Resubscribe()
}

var _ Leases = (*convstore.RedisJournal)(nil)
var _ State = (*convstore.Memory)(nil)
